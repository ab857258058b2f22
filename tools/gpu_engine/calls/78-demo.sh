#!/usr/bin/env bash
# 78-demo.sh [DTYPE] [MAX_LAUNCHES]: the production gate as one command (issue 59): `qgate demo` on the
# production-shape contract of DTYPE (bf16 default; TP=2|4: its TP contract, lib.sh), `--until-decided
# --max-launches MAX_LAUNCHES` (default 3: the fp16 PASS of session 6 was decided there), the screen on
# CUDA. The demo screens the candidate's own code on the checkpoint's weights as vLLM loads them (no ops
# section: qgate.ops.real), runs the speed gate with its audits, says that no quality gate ran (no quality
# section: random weights), and writes one summary. Into $RUNS/demo-DTYPE[-tpN]; 77-zoo.sh then runs
# against its control (ZOO_CONTROL=$RUNS/demo-DTYPE/speed/control.json). DEMO_S (default 550, never past
# the call's end) bounds it: the demo cannot resume, so a run cut short keeps only what it wrote.
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
N=${2:-3}
prod_contract "$DT"
D=demo-$DT$TPTAG$TAGGED
limit=$(call_limit "${DEMO_S:-550}" 30)  # the pack after it
[ "$limit" -ge 120 ] || { echo "demo: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
[ -d "$RUNS/$D" ] && { echo "demo: $RUNS/$D exists (a demo does not resume): not run again" | tee -a "$LOG"; exit 5; }
step "qgate demo -c $CONTRACT --until-decided --max-launches $N --device cuda, at most $limit s"
t0=$(date +%s)
timeout "$limit" python3 -m qgate demo -c "$CONTRACT" -o "$RUNS/$D" --until-decided --max-launches "$N" \
  --device cuda >"$RUNS/$D.txt" 2>&1
echo "demo rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 30 "$RUNS/$D.txt" | tee -a "$LOG"
[ -f "$RUNS/$D/speed/control.json" ] && python3 tools/gpu_engine/summarize.py "$RUNS/$D" 2>&1 | tee -a "$LOG"
pack_runs "$D" "$D.txt"
