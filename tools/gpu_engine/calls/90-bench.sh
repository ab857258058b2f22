#!/usr/bin/env bash
# 90-bench.sh [TP] [ROUTES]: the op bench (kernels_ext/tools/prod_bench.py: the routes beside their
# baselines and what vLLM runs, in the decode-step condition) at the production shapes of tensor
# parallel size TP (1 default: the shapes the H200 engine runs), with the payload's vLLM as the
# competitors' source. BENCH_S (default 300) bounds it.
source tools/gpu_engine/calls/lib.sh
use_engine
TP=${1:-1}
step "prod_bench --tp $TP ${2:-}, at most ${BENCH_S:-300} s"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout "${BENCH_S:-300}" python3 kernels_ext/tools/prod_bench.py "$RUNS/bench-tp$TP" ${2:-} --tp "$TP" \
  >"$RUNS/bench-tp$TP.txt" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 60 "$RUNS/bench-tp$TP.txt" | tee -a "$LOG"
pack_runs "bench-tp$TP" "bench-tp$TP.txt"
