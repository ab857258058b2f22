#!/usr/bin/env bash
# 80-gpu-tests.sh: the test modules that need a CUDA GPU (skipped on the CPU machine), with the payload's
# vLLM, in two pytest runs so that a cut second run keeps the first one's results: (1) the kernels against
# their oracles (tests/kernels/test_cuda.py) and the sites' outputs
# (tests/plugin/test_site_outputs.py), at most TESTS_S (default 150) s; (2) the routed GEMV in a real CUDA
# graph and the engine starts of tests/plugin/test_plugin_cuda.py (three engines, ~1-2.5 min each, the
# first with the tiny model's JIT), at most ENGINE_TESTS_S (default 420; 0 leaves it out). Each test's
# result is printed as it ends (-v: a run cut by its limit still names what passed).
source tools/gpu_engine/calls/lib.sh
use_engine
run_tests() {  # NAME LIMIT MODULES...
  local name=$1 limit=$2 t0
  shift 2
  step "pytest $name ($*), at most $limit s"
  t0=$(date +%s)
  timeout "$limit" python3 -m pytest -v -rA -p no:cacheprovider "$@" >"$RUNS/gpu-tests-$name.txt" 2>&1
  echo "pytest $name rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$RUNS/gpu-tests-$name.txt" | tail -n 40 | tee -a "$LOG"
}
run_tests kernels "${TESTS_S:-150}" tests/kernels/test_cuda.py tests/plugin/test_site_outputs.py
files=(gpu-tests-kernels.txt)
if [ "${ENGINE_TESTS_S:-420}" != 0 ]; then
  run_tests engine "${ENGINE_TESTS_S:-420}" tests/plugin/test_plugin_cuda.py
  files+=(gpu-tests-engine.txt)
fi
pack_runs "${files[@]}"
