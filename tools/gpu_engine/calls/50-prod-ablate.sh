#!/usr/bin/env bash
# 50-prod-ablate.sh [DESIGN]: `qgate ablate` at the production shapes, fp16 (default design
# one-at-a-time: control, candidate and each of the four routes alone: 6 engine starts).
source tools/gpu_engine/calls/lib.sh
use_engine
step "qgate ablate --design ${1:-one-at-a-time} (prod shapes, fp16)"
t0=$(date +%s)
q ablate -c contracts/qwen38-prodshape-fp16-h200.yaml -o "$RUNS/ablate-fp16" --design "${1:-one-at-a-time}" \
  >"$RUNS/ablate-fp16.txt" 2>&1
echo "ablate rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 40 "$RUNS/ablate-fp16.txt" | tee -a "$LOG"
cat "$RUNS/ablate-fp16/ablation.md" 2>/dev/null | head -n 80 | tee -a "$LOG"
python3 tools/gpu_engine/summarize.py "$RUNS/ablate-fp16" 2>&1 | tee -a "$LOG"
pack_runs ablate-fp16 ablate-fp16.txt
