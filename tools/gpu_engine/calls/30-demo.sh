#!/usr/bin/env bash
# 30-demo.sh: `qgate demo --contract contracts/demo-gpu.yaml --device cuda`: operator screen on the
# CUDA kernels, speed gate, frozen GSM8K quality gate, one summary.
source tools/gpu_engine/calls/lib.sh
use_engine
step "qgate demo --contract contracts/demo-gpu.yaml --device cuda"
t0=$(date +%s)
q demo --contract contracts/demo-gpu.yaml --out "$RUNS/demo" --device cuda >"$RUNS/demo.txt" 2>&1
echo "demo rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 40 "$RUNS/demo.txt" | tee -a "$LOG"
cat "$RUNS/demo/summary.md" 2>/dev/null | tee -a "$LOG"
python3 tools/gpu_engine/summarize.py "$RUNS/demo" 2>&1 | tee -a "$LOG"
pack_runs demo demo.txt
