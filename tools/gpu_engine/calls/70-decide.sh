#!/usr/bin/env bash
# 70-decide.sh [DTYPE] [MAX_LAUNCHES]: the speed verdict at the production shapes: `qgate run speed
# --until-decided` (one launch of each arm at a time, interleaved, looked at after each pair, until PASS
# or FAIL is shown or MAX_LAUNCHES per arm; default 6) on contracts/qwen38-prodshape-DTYPE.yaml
# (bf16 default), then `qgate compare`. DECIDE_S (default 540, and never past the call's end: lib.sh
# call_limit) stops it in time to pack: the launches done by then are kept, and a second call on the
# same machine continues them (`--resume`; a later machine: carry the folder), unless the kept looks
# show it cannot decide within MAX_LAUNCHES: undecided with an arm's CV over FUTILE_CV (10 %: a PASS
# needs <= 5 %, and at a start-to-start sd of 10 % its odds within 6 launches are under 5 %,
# tools/verdict_odds.py) and the candidate not slower (no FAIL in sight). THEN_PROBE="NAME @FILE" runs
# 60-probe.sh with what is left of the call after the verdict (or in its place when it cannot decide).
# DERIVE (lib.sh prod_contract) runs a derived contract instead, into decide-DTYPE-TAG. TP=2|4 (lib.sh)
# runs the TP contract (contracts/qwen38-prodshape-DTYPE-tpN.yaml) into decide-DTYPE-tpN: the verdict's
# compare asks every rank for its routes' hits (routes.<route>.every_rank), the audit as at TP 1.
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
prod_contract "$DT"
C=$CONTRACT
D=decide-$DT$TPTAG$TAGGED
limit=$(call_limit "${DECIDE_S:-540}" 40)  # compare + pack after it
[ "$limit" -ge 60 ] || { echo "decide: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
# futile JSON CV: the kept looks' last one undecided, an arm's CV above CV and the ratio >= 1 (one line)
futile() {
  python3 - "$1" "$2" <<'PY'
import json, os, sys
limit = float(sys.argv[2])  # a FUTILE_CV that is no number stops here, loudly
if not os.path.exists(sys.argv[1]):  # the first call: nothing kept yet
    sys.exit(1)
seq = json.load(open(sys.argv[1])).get("sequential") or {}
last = (seq.get("looks") or [{}])[-1]
cv = max(last.get("cv_control_pct") or 0, last.get("cv_candidate_pct") or 0)
if seq.get("decision") is None and last.get("ratio") and last["ratio"] >= 1 and cv > limit:
    print(f"look {last['look']} at {last['launches']} launches: ratio {last['ratio']:.3f}, CV {cv:.1f} %")
    sys.exit(0)
sys.exit(1)
PY
}
then_probe() {  # THEN_PROBE="NAME @FILE": the decode probe with what is left of the call
  # shellcheck disable=SC2086
  [ -z "${THEN_PROBE:-}" ] || bash tools/gpu_engine/calls/60-probe.sh $THEN_PROBE
}
if why=$(futile "$RUNS/$D/speed/control.json" "${FUTILE_CV:-10}"); then
  echo "decide: not continued, it cannot decide within ${2:-6} launches ($why; FUTILE_CV ${FUTILE_CV:-10} %)" | tee -a "$LOG"
  then_probe
  exit $?
fi
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
then_probe
