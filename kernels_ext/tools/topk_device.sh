#!/usr/bin/env bash
# One device call for the top-k work: standalone harness (check, graph timing, phase clocks).
# Uses binaries carried in .topkbin/ when they run there and were built from the current sources
# (.topkbin/src.sha256), else builds them (nvcc, sm_90).
# Usage (repository root): bash kernels_ext/tools/topk_device.sh [harness args]; logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT" .topkbin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
src_hash() {
  cat kernels_ext/tools/topk_bench.cu kernels_ext/csrc/qsa_topk* kernels_ext/csrc/launchers.h | sha256sum | cut -d' ' -f1
}
build() {
  rm -f .topkbin/src.sha256
  nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I kernels_ext/csrc kernels_ext/tools/topk_bench.cu -o .topkbin/tb &
  local plain=$!
  nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -DQGATE_TOPK_PHASES -I kernels_ext/csrc kernels_ext/tools/topk_bench.cu \
    -o .topkbin/tbp &
  local phases=$!
  local ok=1
  wait "$plain" || ok=0
  wait "$phases" || ok=0
  [ "$ok" = 1 ] || { echo "build failed"; exit 1; }
  src_hash >.topkbin/src.sha256
}
if [ "$(cat .topkbin/src.sha256 2>/dev/null)" != "$(src_hash)" ]; then
  echo "no binaries of the current sources in .topkbin: building"
  build
elif ! .topkbin/tb --help-does-not-exist --reps 1 --phases >/dev/null 2>&1; then
  echo "carried binaries do not run here: building"
  build
fi
timeout 200 .topkbin/tb --check --time "$@" 2>&1 | tee "$OUT/bench.txt"
echo "tb rc=$?"
timeout 100 .topkbin/tbp --phases 2>&1 | tee "$OUT/phases.txt"
echo "tbp rc=$?"
# QGATE_TOPK_EXT=1: also build the extension, run the top-k CUDA tests, and time the op as
# `qgate bench ops` does, once per setting (default: push kernel with PDL; without PDL; cluster =
# the pull kernel; grid).
if [ "${QGATE_TOPK_EXT:-0}" = 1 ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$PWD/harness${PYTHONPATH:+:$PYTHONPATH}
  TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 python3 -m pip install --no-build-isolation --no-deps \
    --no-index -e kernels_ext >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
  timeout 300 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" 2>&1 | tail -n 8
  for spec in QGATE_TOPK_IMPL=default QGATE_TOPK_PDL=0 QGATE_TOPK_IMPL=cluster QGATE_TOPK_IMPL=grid; do
    env $spec timeout 120 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk \
      --tag "$spec" >>"$OUT/variants.jsonl" 2>>"$OUT/variants.txt"
  done
  grep -E "^QGATE_" "$OUT/variants.txt"
fi
