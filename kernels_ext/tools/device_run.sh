#!/usr/bin/env bash
# One device call: build kernels_ext for the local GPU, run the kernel tests, vLLM's own kernels
# against the routes, the ops benchmark at the production shapes (decode step, back to back, layer
# chains) and Nsight Compute over the decode-step calls; everything lands under $OUT (log.txt,
# pytest.log, prod/bench.{json,md}, vllm_hc.json, vllm_topk.json, vllm_expand.json, ncu.txt). Run
# from the repository root. Expects wheels for missing Python packages in .whl/ (pydantic on the
# H200 image) and, for vLLM's own kernels, .vllm_src/hc.py (vLLM's models/qwen4_exp/nvidia/ops/hc.py)
# and vLLM 0.32's csrc top-k files in .vllm_src/csrc/ (tools/vllm_topk_build.py), all carried with
# the call; CUTE_SITE + VLLM_STUB as below for vLLM's CuTe kernels and its QSA expansion.
# QUICK=1 leaves out the PDL ordering check and the default-shape screen and bench; BENCH=0 leaves
# out the production-shape bench, NCU=0 the Nsight Compute step, TESTS=0 the compile check and the
# tests, HC_CHECK=0 vLLM's HC kernels against the route, EXPAND=0 the check of vLLM's expansion;
# vLLM's top-k is built once into $VLLM_STUB (skipped when its stand-in _C.py is there).
set -uo pipefail
QUICK=${QUICK:-0}
BENCH=${BENCH:-1}
NCU=${NCU:-1}
TESTS=${TESTS:-1}
HC_CHECK=${HC_CHECK:-1}
EXPAND=${EXPAND:-1}
OUT=${OUT:-/tmp/qgate-device-out}
source kernels_ext/tools/device_env.sh

step "device"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version | tail -n 2; } 2>&1 | tee -a "$LOG"

step "build (TORCH_CUDA_ARCH_LIST=9.0)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
if ! python3 -m pip install --no-build-isolation --no-deps --no-index -e kernels_ext >>"$LOG" 2>&1; then
  tail -n 40 "$LOG"; echo "BUILD FAILED" | tee -a "$LOG"; exit 1
fi
python3 -c "import qgate_kernels as q; print(q.build_info(), q.cuda_kernels_available())" 2>&1 | tee -a "$LOG"

if [ "$TESTS" = 1 ]; then
step "compile check sm_90 (-Xptxas -v)"
python3 kernels_ext/tools/compile_check.py --arch 90 2>&1 | tee -a "$LOG"

step "pytest tests/kernels"
# test_cpu_kernels.py (the C++ CPU kernels) runs on its own after the rest: a crash there (seen on
# this image) must not hide the other tests' results.
timeout 300 python3 -m pytest tests/kernels -q -ra -p no:cacheprovider -p timeout --timeout 150 --ignore=tests/kernels/test_cpu_kernels.py \
  >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$LOG"
tail -n 25 "$OUT/pytest.log"
timeout 120 python3 -X faulthandler -m pytest tests/kernels/test_cpu_kernels.py -q -p no:cacheprovider \
  >"$OUT/pytest_cpu_kernels.log" 2>&1
echo "pytest test_cpu_kernels.py rc=$?" | tee -a "$LOG"
grep -m3 -E "passed|failed|Fatal|line [0-9]+ in test_" "$OUT/pytest_cpu_kernels.log" | tee -a "$LOG"
fi

# vLLM's own CuTe kernels (the skinny GEMM in the bench, hc_down_silu in the HC comparison): CUTE_SITE
# names a folder where the CUTLASS DSL and quack-kernels wheels are installed (pip --target),
# VLLM_STUB the tree of tools/vllm_stub_tree.py. Without them the bench records why vLLM's GEMM
# cannot run and judges against cuBLAS, and the HC comparison runs cuBLAS for the down projection.
TOPK_TREE=${VLLM_STUB:-/tmp/vllm_topk}
BENCH_PATH=$TOPK_TREE:$PYTHONPATH
if [ -n "${CUTE_SITE:-}" ] && [ -n "${VLLM_STUB:-}" ]; then
  BENCH_PATH=$VLLM_STUB:$CUTE_SITE:$CUTE_SITE/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
fi

if [ -f .vllm_src/hc.py ] && [ "$HC_CHECK" = 1 ]; then
  step "vLLM's own HC kernels (Triton, CuTe hc_down_silu) against the route (bitwise counts, timing)"
  PYTHONPATH=$BENCH_PATH timeout 90 python3 kernels_ext/tools/vllm_hc_triton.py --src .vllm_src/hc.py --hidden 2560 \
    >"$OUT/vllm_hc.json" 2>>"$LOG"
  echo "vllm hc rc=$?" | tee -a "$LOG"
  cat "$OUT/vllm_hc.json"
fi

if [ "$QUICK" != 1 ]; then
  step "PDL ordering check (static-weight GEMV chains, eager and graph replay)"
  timeout 200 python3 kernels_ext/tools/pdl_race_check.py --iters 200 2>&1 | tee -a "$LOG"
fi

# vLLM's own top-k (cooperative_topk, what its Qwen4Exp indexer runs for a decode batch on sm_90)
# from vLLM 0.32's csrc in .vllm_src/csrc (its sdist's files, unmodified), built into the stub tree
# (or a tree of its own) as a stand-in vllm._C; --check compares its sets with the reference.
if [ -f .vllm_src/csrc/cooperative_topk.cuh ] && [ ! -f "$TOPK_TREE/vllm/_C.py" ]; then
  step "vLLM's cooperative_topk built standalone"
  timeout 300 python3 kernels_ext/tools/vllm_topk_build.py .vllm_src/csrc "$TOPK_TREE" --check \
    >"$OUT/vllm_topk.json" 2>>"$LOG"
  echo "vllm topk build rc=$?" | tee -a "$LOG"
  cat "$OUT/vllm_topk.json"
fi

# vLLM's consumer of the top-k (expand_qsa_block_indices, Triton, from the stub tree) on the route's
# output (increasing index order) against the reference's value-ordered indices: same tokens per row.
if [ -n "${VLLM_STUB:-}" ] && [ "$EXPAND" = 1 ]; then
  step "vLLM's expand_qsa_block_indices on the route's top-k and on the value-ordered reference"
  PYTHONPATH=$VLLM_STUB:$PYTHONPATH timeout 200 python3 kernels_ext/tools/vllm_expand_check.py \
    >"$OUT/vllm_expand.json" 2>>"$LOG"
  echo "vllm expand check rc=$?" | tee -a "$LOG"
  head -c 1500 "$OUT/vllm_expand.json"
fi

if [ "$BENCH" = 1 ]; then
  step "ops bench at the production shapes (decode step, back to back, layer chains; vLLM's own paths)"
  PYTHONPATH=$BENCH_PATH timeout 300 python3 kernels_ext/tools/prod_bench.py "$OUT/prod" >>"$LOG" 2>&1
  echo "prod bench rc=$?" | tee -a "$LOG"
  cat "$OUT/prod/bench.md" 2>/dev/null | head -n 60
fi

NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ "$NCU" = 1 ] && [ -n "$NCU_BIN" ]; then
  step "Nsight Compute: the routes' and vLLM's kernels after a producer (tools/profile_kernels.py)"
  PYTHONPATH=$BENCH_PATH timeout 150 "$NCU_BIN" --clock-control none --kernel-name-base function \
    -k 'regex:gemv|gemm|hc_|topk|cutlass|cute|Cute|skinny|silu|fused|gdn|norm|mix' -c 150 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    python3 kernels_ext/tools/profile_kernels.py >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?" | tee -a "$LOG"
  grep -E "^  [A-Za-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy" "$OUT/ncu.txt" | head -n 40
fi
[ "$QUICK" = 1 ] && { step "done"; exit 0; }

step "ops screen (default shapes)"
timeout 240 python3 -m qgate.cli.ops run -c contracts/smoke-cpu.yaml -o "$OUT/s" --device cuda >>"$LOG" 2>&1
echo "screen rc=$?" | tee -a "$LOG"
cat "$OUT/s/ops/ops.md" 2>/dev/null

step "ops bench (default shapes)"
timeout 300 python3 -m qgate.cli.ops bench -o "$OUT/b" --device cuda >>"$LOG" 2>&1
echo "bench rc=$?" | tee -a "$LOG"
cat "$OUT/b/ops/bench.md" 2>/dev/null
step "done"
