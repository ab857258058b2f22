#!/usr/bin/env bash
# 60-probe.sh NAME VARIANT... (or @FILE): decode_probe.py (tools/gpu_engine) into $RUNS/probe-NAME:
# per variant one engine start, decode tok/s over fresh prompts, one instrumented generate (graph
# replays timed by CUDA events, host time per step, synchronising operations) and a torch.profiler
# timeline of PROFILE_TOKENS (64; 0: none) decode steps in the same engine, in
# probe-NAME/timeline/<variant>.json (what `qgate ablate --timeline` reads). PROBE_S (default 540, and
# never past the call's end: lib.sh call_limit) stops it in time to pack; the variants done by then are
# kept, and a second call on the same machine goes on from them (decode_probe skips a variant whose
# record is there). JIT_PACK=1 also brings back the JIT caches (Triton, vLLM, CuTe DSL) as
# jit-cache.tgz.NN parts of <= 15 MiB, for a later machine to skip the compile. PROBE_ARGS: more options of decode_probe.py.
source tools/gpu_engine/calls/lib.sh
use_engine
NAME=${1:?usage: 60-probe.sh NAME VARIANT...}
shift
limit=$(call_limit "${PROBE_S:-540}" 50)  # the JIT caches and the runs are packed after it
[ "$limit" -ge 30 ] || { echo "decode_probe $NAME: $limit s left of the call, not run" | tee -a "$LOG"; exit 5; }
step "decode_probe $NAME: $# variant arguments, at most $limit s"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout "$limit" python3 tools/gpu_engine/decode_probe.py "$RUNS/probe-$NAME" "$@" \
  --variant-timeout "${VARIANT_S:-300}" --profile-tokens "${PROFILE_TOKENS:-64}" ${PROBE_ARGS:-} 2>&1 | tee "$RUNS/probe-$NAME.txt" | grep -v "^$" | tail -n 40 >> "$LOG"
echo "probe $NAME: rc=${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
cat "$RUNS/probe-$NAME/summary.txt" 2>/dev/null
cat "$RUNS/probe-$NAME/reading.txt" 2>/dev/null | tee -a "$LOG"
if [ "${JIT_PACK:-0}" = 1 ]; then
  step "pack JIT caches"
  dirs=$(ls -d "$HOME/.triton/cache" "$HOME/.cache/vllm" "$HOME/.cache/cutlass"* /tmp/*cutlass* /tmp/*cute* 2>/dev/null | tr '\n' ' ')
  du -sh $dirs 2>/dev/null | tee -a "$LOG"
  # shellcheck disable=SC2086
  tar -czf /tmp/jit-cache.tgz $dirs 2>/dev/null
  n=$(stat -c %s /tmp/jit-cache.tgz)
  # the tool brings back 8 files, 64 MiB in all: what $OUT holds already and ~4 MiB for this call's
  # runs pack count too
  room=$(( 60 * 1024 * 1024 - $(du -sb "$OUT" | cut -f1) ))
  if [ "$n" -lt "$room" ]; then
    split -b 15m -d /tmp/jit-cache.tgz "$OUT/jit-cache.tgz."
    ls -l "$OUT"/jit-cache.tgz.* | tee -a "$LOG"
  else
    echo "JIT caches: $n bytes packed, more than the $room bytes left to bring back" | tee -a "$LOG"
  fi
fi
pack_runs "probe-$NAME" "probe-$NAME.txt"
