#!/usr/bin/env bash
# 10-install.sh LAST: the call after the other parts were staged, carrying .gpu-engine/call-LAST and
# .gpu-engine/extra: stage the last part and the models + GSM8K, unpack the payload, write the
# production-shape checkpoint (12 layers, bf16, on the GPU) while the payload's import / CuTe / sampler
# checks run, wait for the kernels_ext build (started by stage.sh 01), then the first gate: the tiny
# Qwen4Exp in fp16 (qgate run speed + compare). Its first engine start pays vLLM's Triton JIT (~95 s).
source tools/gpu_engine/calls/lib.sh
LAST=${1:?usage: 10-install.sh LAST}
LAYERS=${LAYERS:-12}
step "stage part $LAST + extra"
cp ".gpu-engine/call-$LAST"/* "$GE/" && rm -rf "$GE/extra" && cp -r .gpu-engine/extra "$GE/extra" || exit 3
step "unpack (device_install.sh, GE_CHECKS=0)"
GE_CHECKS=0 bash tools/gpu_engine/device_install.sh "$GE" 2>&1 | tail -n 4 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || exit 3
use_engine
step "production-shape checkpoint: $LAYERS layers -> /tmp/qgate-prodshape (background)"
( t0=$(date +%s); python3 -m qgate model prod-shape /tmp/qgate-prodshape --layers "$LAYERS" --device cuda \
    >"$GE/prodshape.log" 2>&1; echo "rc=$? seconds=$(( $(date +%s) - t0 ))" > "$GE/prodshape.rc" ) &
PS_PID=$!
step "checks (device_install.sh)"
GE_CHECK_S=90 bash tools/gpu_engine/device_install.sh "$GE" 2>&1 | tail -n 12 | tee -a "$LOG"
wait $PS_PID
echo "prod-shape checkpoint: $(cat "$GE/prodshape.rc") $(du -sh /tmp/qgate-prodshape 2>/dev/null | cut -f1)" | tee -a "$LOG"
tail -n 3 "$GE/prodshape.log" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee -a "$LOG"
gate tiny-fp16 contracts/qwen4exp-fp16-h200.yaml
pack_runs tiny-fp16 tiny-fp16.run.txt tiny-fp16.compare.txt
