#!/usr/bin/env bash
# 80-gpu-tests.sh: the test modules that need a CUDA GPU (skipped on the CPU machine), with the payload's
# vLLM: the kernels against their oracles (tests/kernels/test_cuda.py, PDL on and off included), the
# routed GEMV in a real CUDA graph and the fp16 control's engine start (tests/plugin/test_plugin_cuda.py),
# the sites' outputs (tests/plugin/test_site_outputs.py). TESTS_S (default 240) bounds it.
source tools/gpu_engine/calls/lib.sh
use_engine
step "pytest (CUDA modules), at most ${TESTS_S:-240} s"
t0=$(date +%s)
timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda.py \
  tests/plugin/test_plugin_cuda.py tests/plugin/test_site_outputs.py >"$RUNS/gpu-tests.txt" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
tail -n 25 "$RUNS/gpu-tests.txt" | tee -a "$LOG"
pack_runs gpu-tests.txt
