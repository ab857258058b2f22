#!/usr/bin/env bash
# 77-zoo.sh DTYPE KIND...: gamed candidates of the zoo (qgate.demo.FAULTY_KINDS: defeat-lm-head, top1,
# defeat, defeat-strided, ...) at the production shapes, each against the first engine start of the
# honest verdict's control (70-decide.sh's $RUNS/decide-DTYPE, or ZOO_CONTROL: run it first on this
# machine; a kind whose verdict is already there is not run again), one
# engine start of the candidate + the token audit's when its tokens differ (tools/gpu_engine/zoo.py),
# then `qgate compare`: which gate catches each, in its verdict. ZOO_S (default 540, never past the
# call's end) stops before a kind that could not finish; the kinds done are packed.
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:?usage: 77-zoo.sh DTYPE KIND...}
shift
prod_contract "$DT"
C=$CONTRACT
CONTROL=${ZOO_CONTROL:-$RUNS/decide-$DT/speed/control.json}
[ -f "$CONTROL" ] || { echo "zoo: $CONTROL missing: run 70-decide.sh $DT on this machine first" | tee -a "$LOG"; exit 5; }
done_runs=()
for kind in "$@"; do
  limit=$(call_limit "${ZOO_S:-540}" 40)
  [ "$limit" -ge 150 ] || { echo "zoo: $limit s left, $kind not run" | tee -a "$LOG"; break; }
  D=zoo-$DT-$kind
  [ -f "$RUNS/$D/compare/verdict.json" ] && { echo "zoo: $kind done already" | tee -a "$LOG"; continue; }
  step "zoo $kind: candidate + audit against decide-$DT's first control launch, at most $limit s"
  t0=$(date +%s)
  timeout "$limit" python3 tools/gpu_engine/zoo.py "$C" "$CONTROL" "$RUNS/$D" "$kind" >"$RUNS/$D.txt" 2>&1
  echo "zoo $kind rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
  tail -n 8 "$RUNS/$D.txt" | tee -a "$LOG"
  q compare "$RUNS/$D/speed/control.json" "$RUNS/$D/speed/candidate.json" -c "$C" \
    -o "$RUNS/$D/compare" >"$RUNS/$D.compare.txt" 2>&1
  echo "compare rc=$?" | tee -a "$LOG"
  grep -E "^(verdict|qgate verdict)|FAIL|ERROR|INCONCLUSIVE" "$RUNS/$D.compare.txt" | head -n 12 | tee -a "$LOG"
  python3 tools/gpu_engine/summarize.py "$RUNS/$D" 2>&1 | tee -a "$LOG"
  done_runs+=("$D" "$D.txt" "$D.compare.txt")
done
[ ${#done_runs[@]} -gt 0 ] && pack_runs "${done_runs[@]}"
exit 0
