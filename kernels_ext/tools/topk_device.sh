#!/usr/bin/env bash
# One device call for the top-k work: standalone harness (check, graph timing, phase clocks).
# Uses binaries carried in .topkbin/ when they run there, else builds them (nvcc, sm_90).
# Usage (repository root): bash kernels_ext/tools/topk_device.sh [harness args]; logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT" .topkbin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
build() {
  nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I kernels_ext/csrc kernels_ext/tools/topk_bench.cu -o .topkbin/tb &
  nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -DQGATE_TOPK_PHASES -I kernels_ext/csrc kernels_ext/tools/topk_bench.cu \
    -o .topkbin/tbp &
  wait
}
if ! .topkbin/tb --help-does-not-exist --reps 1 --phases >/dev/null 2>&1; then
  echo "carried binaries do not run here: building"
  build
fi
timeout 200 .topkbin/tb --check --time "$@" 2>&1 | tee "$OUT/bench.txt"
echo "tb rc=$?"
timeout 100 .topkbin/tbp --phases 2>&1 | tee "$OUT/phases.txt"
echo "tbp rc=$?"
