#!/usr/bin/env bash
# 75-screen.sh [DTYPE]: the real-weight operator screen (`qgate run ops --real`, docs/ops.md) of the
# production-shape checkpoint its contract names (bf16 default; TP=2|4: the TP contract, lib.sh), every
# rank's slice of each routed tensor as vLLM shards it at the contract's tensor parallel size, fed the
# inputs that rank's worker recorded: first one engine start of the candidate alone, from the contract
# derived with `enforce_eager` (a CUDA graph's replays never reach Python, so nothing under graphs is
# recorded), 8 output tokens (the plugin keeps the first 4 decode calls of each site) and
# QGATE_RECORD_DIR, into screen-DTYPE[-tpN]/acts/rank<r>/; then the screen with `--activations` (a rank
# without a recording, or recorded at another TP size, is a FAIL line naming it). RECORD=0 screens on
# random inputs only (no engine start). SCREEN_S (default 420, never past the call's end: lib.sh
# call_limit) bounds the two steps together; the record, real.json / real.md and the recording's
# engine log come back in runs-75-screen.tgz.
source tools/gpu_engine/calls/lib.sh
use_engine
DT=${1:-bf16}
prod_contract "$DT"
S=screen-$DT$TPTAG$TAGGED
ACTS=$RUNS/$S/acts
end=$(( $(date +%s) + $(call_limit "${SCREEN_S:-420}" 30) ))  # the pack after it
mkdir -p "$RUNS/$S"
more=()
if [ "${RECORD:-1}" = 1 ]; then
  rec=$RUNS/$S/contract-record.yaml
  python3 tools/gpu_engine/derive_contract.py "$CONTRACT" "$rec" record --set engine.enforce_eager=true \
    --set speed.output_tokens=8 --set "arms.candidate.env.QGATE_RECORD_DIR=\"$ACTS\"" 2>&1 \
    | tee -a "$LOG" | grep -q "^ok: " || exit 2
  limit=$(( end - $(date +%s) ))
  [ "$limit" -ge 60 ] || { echo "screen: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
  step "record each rank's decode inputs: qgate run speed --arm candidate ($rec), at most $limit s"
  timeout "$limit" python3 -m qgate run speed -c "$rec" -o "$RUNS/$S/record" --arm candidate \
    >"$RUNS/$S/record.txt" 2>&1
  echo "record rc=$?; ranks recorded: $(cd "$ACTS" 2>/dev/null && echo rank* || echo none)" | tee -a "$LOG"
  more+=(--activations "$ACTS")
fi
limit=$(( end - $(date +%s) ))
[ "$limit" -ge 30 ] || { echo "screen: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
step "qgate run ops --real ($CONTRACT: TP $TP, every rank's slice), at most $limit s"
# a missing recording folder is one line of qgate's (exit 2), kept in the log
timeout "$limit" python3 -m qgate run ops -c "$CONTRACT" --real --device cuda -o "$RUNS/$S" --force \
  "${more[@]}" >"$RUNS/$S.txt" 2>&1
echo "screen rc=$?" | tee -a "$LOG"
head -n 40 "$RUNS/$S.txt" | tee -a "$LOG"
pack_runs "$S" "$S.txt"
