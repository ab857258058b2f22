#!/usr/bin/env bash
# 10-install.sh LAST [DTYPE]: the call after the other parts were staged, carrying .gpu-engine/call-LAST
# and .gpu-engine/extra: stage the last part and the models + GSM8K, unpack the payload, write the
# production-shape checkpoints (LAYERS, default all 48, stored bf16, on the GPU: PRODSHAPE="qsa"
# (default) -> /tmp/qgate-prodshape, "noqsa" -> /tmp/qgate-prodshape-noqsa for fp16) while the payload's
# import / CuTe / sampler checks run, wait for the kernels_ext build (started by stage.sh 01), then the
# first gate: the tiny Qwen4Exp in DTYPE (fp16 default; qgate run speed + compare), or with
# PROBE="NAME @FILE" the decode probe instead (60-probe.sh), with DECIDE=N the speed verdict
# (70-decide.sh DTYPE N), with DEMO=N the production gate in one command (78-demo.sh DTYPE N), with
# THEN=none nothing after the install (a gate that needs a whole call of its own follows), with ABLATE=DESIGN the ablation (50-prod-ablate.sh DTYPE DESIGN; DERIVE and
# MAX_LAUNCHES as there), with BENCH="TP [ROUTES]" the op bench (90-bench.sh TP ROUTES; PRODSHAPE=none
# then writes no checkpoint), with SCREEN=1 the operator screen per rank (75-screen.sh DTYPE). TP=2|4
# (lib.sh) makes DECIDE, ABLATE and SCREEN run the TP contract of DTYPE on a machine of that many GPUs
# (checked first: exit 3 on fewer). Its first engine start pays vLLM's Triton JIT (~95 s).
source tools/gpu_engine/calls/lib.sh
need_gpus
LAST=${1:?usage: 10-install.sh LAST}
DTYPE=${2:-fp16}
# 48 layers, the model's own: at 12 the H200's decode step waited on the host (host 2.9-3.6 ms a step,
# the GPU's work 1.8-2.0 ms; the probe of 2026-12-05, docs/gpu.md), so tok/s measured the host, not the
# kernels. 48 layers are about 17 GB (16 experts) and put the GPU's step (~7 ms) above the host's.
LAYERS=${LAYERS:-48}
step "stage part $LAST + extra"
cp ".gpu-engine/call-$LAST"/* "$GE/" && rm -rf "$GE/extra" && cp -r .gpu-engine/extra "$GE/extra" || exit 3
step "unpack (device_install.sh, GE_CHECKS=0)"
GE_CHECKS=0 bash tools/gpu_engine/device_install.sh "$GE" 2>&1 | tail -n 4 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || exit 3
use_engine
restore_jit
step "production-shape checkpoints: ${PRODSHAPE:-qsa}, $LAYERS layers (background)"
( for v in ${PRODSHAPE:-qsa}; do
    [ "$v" = none ] && continue  # the op bench needs no model
    t0=$(date +%s)
    if [ "$v" = noqsa ]; then dst=/tmp/qgate-prodshape-noqsa flag=--no-qsa; else dst=/tmp/qgate-prodshape flag=--qsa; fi
    python3 -m qgate model prod-shape "$dst" --layers "$LAYERS" --device cuda "$flag" >>"$GE/prodshape.log" 2>&1
    echo "$v rc=$? seconds=$(( $(date +%s) - t0 )) $(du -sh "$dst" 2>/dev/null | cut -f1)" >> "$GE/prodshape.rc"
  done ) &
PS_PID=$!
step "checks (device_install.sh)"
GE_CHECK_S=90 bash tools/gpu_engine/device_install.sh "$GE" 2>&1 | tail -n 12 | tee -a "$LOG"
wait $PS_PID
echo "prod-shape checkpoints: $(cat "$GE/prodshape.rc")" | tee -a "$LOG"
tail -n 3 "$GE/prodshape.log" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee -a "$LOG"
if [ -n "${DEMO:-}" ]; then  # DEMO=N: the production gate as one command (78-demo.sh DTYPE N)
  bash tools/gpu_engine/calls/78-demo.sh "$DTYPE" "$DEMO"
  exit $?
fi
if [ "${THEN:-}" = none ]; then  # THEN=none: install only; the next call (same warm machine) runs a gate
  exit 0
fi
if [ -n "${DECIDE:-}" ]; then  # DECIDE=N: the speed verdict (70-decide.sh DTYPE N) instead of the tiny gate
  bash tools/gpu_engine/calls/70-decide.sh "$DTYPE" "$DECIDE"
  exit $?
fi
if [ -n "${AUDIT:-}" ]; then  # AUDIT="KIND ...": the honest pair, one start an arm, then the zoo against it
  prod_contract "$DTYPE"
  D=prod-$DTYPE
  limit=$(call_limit "${AUDIT_S:-330}" 60)
  step "honest pair: qgate run speed -c $CONTRACT (one start an arm + the token audit's), at most $limit s"
  t0=$(date +%s)
  timeout "$limit" python3 -m qgate run speed -c "$CONTRACT" -o "$RUNS/$D" >"$RUNS/$D.run.txt" 2>&1
  echo "run speed rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
  tail -n 8 "$RUNS/$D.run.txt" | tee -a "$LOG"
  q compare "$RUNS/$D/speed/control.json" "$RUNS/$D/speed/candidate.json" -c "$CONTRACT" \
    -o "$RUNS/$D/compare" >"$RUNS/$D.compare.txt" 2>&1
  echo "compare rc=$?" | tee -a "$LOG"
  tail -n 25 "$RUNS/$D.compare.txt" | tee -a "$LOG"
  pack_runs "$D" "$D.run.txt" "$D.compare.txt"
  # shellcheck disable=SC2086
  ZOO_CONTROL=$RUNS/$D/speed/control.json bash tools/gpu_engine/calls/77-zoo.sh "$DTYPE" $AUDIT
  exit $?
fi
if [ -n "${BENCH:-}" ]; then  # BENCH="TP [ROUTES]": the op bench on this card instead of the tiny gate
  # shellcheck disable=SC2086
  bash tools/gpu_engine/calls/90-bench.sh $BENCH
  exit $?
fi
if [ -n "${ABLATE:-}" ]; then  # ABLATE=DESIGN: the ablation at the production shapes instead of the tiny gate
  bash tools/gpu_engine/calls/50-prod-ablate.sh "$DTYPE" "$ABLATE"
  exit $?
fi
if [ "${SCREEN:-0}" = 1 ]; then  # the operator screen per rank instead of the tiny gate
  bash tools/gpu_engine/calls/75-screen.sh "$DTYPE"
  exit $?
fi
if [ -n "${PROBE:-}" ]; then  # PROBE="NAME @FILE": the decode probe instead of the tiny gate
  # shellcheck disable=SC2086
  bash tools/gpu_engine/calls/60-probe.sh $PROBE
  exit $?
fi
gate "tiny-$DTYPE" "contracts/qwen4exp-$DTYPE-gpu.yaml"
pack_runs "tiny-$DTYPE" "tiny-$DTYPE.run.txt" "tiny-$DTYPE.compare.txt"
