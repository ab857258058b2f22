#!/usr/bin/env bash
# 50-prod-ablate.sh [DTYPE] [DESIGN]: `qgate ablate` at the production shapes (contracts/
# qwen38-prodshape-DTYPE-h200.yaml, bf16 default; design one-at-a-time default: control, each route
# alone, candidate). ABLATE_S (default 540) stops it in time for the pack to come back: the arms done
# by then are kept (`qgate ablate --resume` continues them on a later machine).
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
step "qgate ablate --design ${2:-one-at-a-time} (prod shapes, $DT), at most ${ABLATE_S:-540} s"
t0=$(date +%s)
timeout "${ABLATE_S:-540}" python3 -m qgate ablate -c "contracts/qwen38-prodshape-$DT-h200.yaml" \
  -o "$RUNS/ablate-$DT" --design "${2:-one-at-a-time}" >"$RUNS/ablate-$DT.txt" 2>&1
echo "ablate rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 40 "$RUNS/ablate-$DT.txt" | tee -a "$LOG"
cat "$RUNS/ablate-$DT/ablation.md" 2>/dev/null | head -n 80 | tee -a "$LOG"
python3 tools/gpu_engine/summarize.py "$RUNS/ablate-$DT" 2>&1 | tee -a "$LOG"
pack_runs "ablate-$DT" "ablate-$DT.txt"
