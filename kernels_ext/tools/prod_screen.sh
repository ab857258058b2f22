#!/usr/bin/env bash
# The real-weight screen at production size in one call (docs/ops.md, "At production size"): a
# production-shape checkpoint of all 48 layers (qgate.ops.synthetic: every routed tensor at its
# production shape, the full 248,320 vocabulary, 8 experts instead of 512: they are never read),
# stored in bf16 as NVFP4 exports keep the unquantized tensors, screened at TP 4 on every rank with the
# production contract: once as it stands (engine.dtype float16: every routed tensor cast BF16 -> F16,
# the HC parameters kept bf16 by vLLM's rule, so HC is listed as not screened), once with --dtype bf16
# (GEMV, GDN and HC in bf16). Assumes kernels_ext is built for the device (kernels_ext/tools/device_run.sh
# does it) and runs from the repository root. Writes $OUT/log.txt, $OUT/times.txt and the two records
# ($OUT/fp16/ops/real.{json,md}, $OUT/bf16/ops/real.{json,md}); the checkpoint (~8 GB) goes to $CK,
# outside $OUT. DTYPES ("fp16 bf16": the engine dtypes screened, in order), LAYERS, TRIALS (default:
# the contract's 20), DEVICE (cuda) for a smaller check; REUSE=1 keeps a checkpoint already at $CK. times.txt has each step's seconds and the
# record's own split (read_s: reading + casting the weights on the CPU; screen_s: routes + judging).
set -uo pipefail
OUT=${OUT:-/tmp/qgate-prod-screen}
CK=${CK:-/tmp/qgate-prod-checkpoint}
LAYERS=${LAYERS:-48}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
CONTRACT=contracts/qwen38-sm70-tp4-decode.yaml
source kernels_ext/tools/device_env.sh
TRIAL_ARGS=()
[ -n "${TRIALS:-}" ] && TRIAL_ARGS=(--trials "$TRIALS")

step "checkpoint: $LAYERS layers, bf16, vocabulary 248320 -> $CK"
t0=$(date +%s)
if [ "${REUSE:-0}" = 1 ] && [ -f "$CK/config.json" ]; then
  echo "reusing $CK (REUSE=1)" | tee -a "$LOG"
else
rm -rf "$CK"
$PY -c "
import sys, torch
from pathlib import Path
from qgate.ops.synthetic import write_synthetic_checkpoint
write_synthetic_checkpoint(Path(sys.argv[1]), layers=int(sys.argv[2]), vocab=248320, dtype=torch.bfloat16)
" "$CK" "$LAYERS" >>"$LOG" 2>&1 || { echo "CHECKPOINT FAILED" | tee -a "$LOG"; exit 1; }
fi
t1=$(date +%s)
echo "checkpoint_s=$((t1 - t0)) layers=$LAYERS bytes=$(du -sb "$CK" | cut -f1)" | tee -a "$OUT/times.txt"

rc=0
for dt in ${DTYPES:-fp16 bf16}; do
  step "run ops --real --tp 4 --device $DEVICE, engine dtype $dt"
  extra=()
  [ "$dt" = bf16 ] && extra=(--dtype bf16)
  t0=$(date +%s)
  $PY -m qgate.cli.ops run -c "$CONTRACT" -o "$OUT/$dt" --real --model "$CK" --tp 4 --device "$DEVICE" \
    "${extra[@]}" "${TRIAL_ARGS[@]}" --force >"$OUT/$dt.txt" 2>&1
  r=$?
  t1=$(date +%s)
  echo "screen_$dt rc=$r seconds=$((t1 - t0)) layers=$LAYERS trials=${TRIALS:-contract} device=$DEVICE" \
    | tee -a "$OUT/times.txt"
  $PY -c "import json, sys; r = json.load(open(sys.argv[1])); print('timing_$dt', r['timing'], 'passed', r['passed'])" \
    "$OUT/$dt/ops/real.json" 2>&1 | tee -a "$OUT/times.txt"
  head -n 40 "$OUT/$dt.txt" | tee -a "$LOG"
  [ "$r" -ne 0 ] && rc=$r
done
exit $rc
