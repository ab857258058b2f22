#!/usr/bin/env bash
# 70-decide.sh [DTYPE] [MAX_LAUNCHES]: the speed verdict at the production shapes: `qgate run speed
# --until-decided` (one launch of each arm at a time, interleaved, looked at after each pair, until PASS
# or FAIL is shown or MAX_LAUNCHES per arm; default 6) on contracts/qwen38-prodshape-DTYPE-h200.yaml
# (bf16 default), then `qgate compare`. DECIDE_S (default 540, and never past the call's end: lib.sh
# call_limit) stops it in time to pack: the launches done by then are kept, and a second call on the
# same machine continues them (`--resume`; a later machine: carry the folder). DERIVE (lib.sh
# prod_contract) runs a derived contract instead, into decide-DTYPE-TAG.
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
prod_contract "$DT"
C=$CONTRACT
D=decide-$DT$TAGGED
limit=$(call_limit "${DECIDE_S:-540}" 40)  # compare + pack after it
[ "$limit" -ge 60 ] || { echo "decide: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
more=()
# a second call on the same warm machine continues the launches kept in the folder
[ -d "$RUNS/$D/speed" ] && more+=(--resume) && cp "$RUNS/$D.txt" "$RUNS/$D.1.txt"
step "qgate run speed --until-decided --max-launches ${2:-6} ${more[*]} ($C), at most $limit s"
t0=$(date +%s)
timeout "$limit" python3 -m qgate run speed -c "$C" -o "$RUNS/$D" --until-decided \
  --max-launches "${2:-6}" "${more[@]}" >"$RUNS/$D.txt" 2>&1
echo "run speed rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 30 "$RUNS/$D.txt" | tee -a "$LOG"
# --force: a resumed call compares the launches again
q compare "$RUNS/$D/speed/control.json" "$RUNS/$D/speed/candidate.json" -c "$C" --force \
  -o "$RUNS/$D/compare" >"$RUNS/$D.compare.txt" 2>&1
echo "compare rc=$?" | tee -a "$LOG"
tail -n 30 "$RUNS/$D.compare.txt" | tee -a "$LOG"
python3 tools/gpu_engine/summarize.py "$RUNS/$D" 2>&1 | tee -a "$LOG"
extra=()
[ -n "$TAGGED" ] && extra+=("contract${TAGGED}.yaml")
[ -f "$RUNS/$D.1.txt" ] && extra+=("$D.1.txt")
pack_runs "$D" "$D.txt" "$D.compare.txt" "${extra[@]}"
