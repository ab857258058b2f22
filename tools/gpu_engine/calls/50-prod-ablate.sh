#!/usr/bin/env bash
# 50-prod-ablate.sh [DTYPE] [DESIGN]: `qgate ablate` at the production shapes (contracts/
# qwen38-prodshape-DTYPE.yaml, bf16 default; design one-at-a-time default: control, each route
# alone, candidate). MAX_LAUNCHES=N adds `--until-decided --max-launches N` (launches added to every arm
# until the candidate's verdict against the control is decided: the per-route effects then carry the
# variance between engine starts too). ABLATE_S (default 540, and never past the call's end: lib.sh
# call_limit) stops it in time for the report and the pack to come back: the arms done by then are
# kept, and a second call of this script on the same machine continues them (`--resume`, used when
# the output folder is there). TIMELINE=DIR adds `--timeline DIR`
# (profile_decode.py's or decode_probe.py --profile-tokens' <arm>.json profiles: a decode-step timeline
# section in the report, not a gate; a folder qgate.timeline refuses is left out with its one line in
# the log, and the ablation runs without it: `qgate ablate --resume --timeline DIR` on the packed
# folders adds it later).
# DERIVE (lib.sh prod_contract) ablates a derived contract instead, into ablate-DTYPE-TAG (without the
# TIMELINE: the probe profiled the contract's arms, not the derived ones). TP=2|4 (lib.sh) ablates the
# TP contract (contracts/qwen38-prodshape-DTYPE-tpN.yaml) into ablate-DTYPE-tpN (each rank's GEMVs a
# TP-th as long; every arm's routes asked of every rank), without a TIMELINE (profiled at TP 1).
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
prod_contract "$DT"
A=ablate-$DT$TPTAG$TAGGED
limit=$(call_limit "${ABLATE_S:-540}" 70)  # the report of a cut run (<= 60 s) + pack after it
[ "$limit" -ge 60 ] || { echo "ablate: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
step "qgate ablate --design ${2:-one-at-a-time} ($CONTRACT), at most $limit s"
t0=$(date +%s)
more=()
[ -n "${MAX_LAUNCHES:-}" ] && more+=(--until-decided --max-launches "$MAX_LAUNCHES")
[ -d "$RUNS/$A" ] && more+=(--resume)
if [ -n "${TIMELINE:-}" ] && [ -n "$TAGGED$TPTAG" ]; then
  # the probe profiled the contract's arms, not the derived ones (its variant's env, e.g. the lm_head
  # left out of the routes, is not in what the timeline compares): its candidate.json would stand for
  # another arm
  echo "timeline left out: the probe's profiles are of the TP 1 contract's arms, not of $CONTRACT" | tee -a "$LOG"
  TIMELINE=""
fi
if [ -n "${TIMELINE:-}" ]; then  # checked first: a bad folder would stop the ablation (exit 2) before it ran
  if why=$(python3 -c "import sys; from qgate.timeline import read_timeline; read_timeline(sys.argv[1])" \
      "$TIMELINE" 2>&1); then
    more+=(--timeline "$TIMELINE")
  else  # device time is the scarce part: run without it (`qgate ablate --resume --timeline` adds it later)
    echo "timeline left out: $(echo "$why" | tail -n 1)" | tee -a "$LOG"
    TIMELINE=""
  fi
fi
timeout "$limit" python3 -m qgate ablate -c "$CONTRACT" \
  -o "$RUNS/$A" --design "${2:-one-at-a-time}" "${more[@]}" >>"$RUNS/$A.txt" 2>&1
rc=$?
echo "ablate rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
if [ "$rc" = 124 ] && [ -d "$RUNS/$A/speed" ]; then  # cut by its limit: the report of what is on disk
  # (no engine, seconds; an arm not complete is an ERROR in it); the next call's --resume rewrites it
  timeout 60 python3 -m qgate ablate -c "$CONTRACT" -o "$RUNS/$A" --design "${2:-one-at-a-time}" \
    --report-only --force ${TIMELINE:+--timeline "$TIMELINE"} >>"$RUNS/$A.txt" 2>&1
  echo "report of the arms so far (--report-only): rc=$?" | tee -a "$LOG"
fi
tail -n 40 "$RUNS/$A.txt" | tee -a "$LOG"
cat "$RUNS/$A/ablation.md" 2>/dev/null | head -n 80 | tee -a "$LOG"
python3 tools/gpu_engine/summarize.py "$RUNS/$A" 2>&1 | tee -a "$LOG"
extra=()
[ -n "$TAGGED" ] && extra+=("contract${TAGGED}.yaml")
pack_runs "$A" "$A.txt" "${extra[@]}"
