#!/usr/bin/env bash
# One device call for the HC route and the CPU-kernel test's crash: build (compile commands kept),
# the HC tests under each QGATE_HC_IMPL, vLLM's Triton HC against the route, the HC bench per impl,
# the symbol and toolchain facts behind test_cpu_kernels.py's crash, then pytest tests/kernels whole.
# Usage (repository root, carrying .whl and .vllm_src): OUT=... bash kernels_ext/tools/hc_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/hc-out}
source kernels_ext/tools/device_env.sh

step "build (TORCH_CUDA_ARCH_LIST=9.0, verbose: the compile commands)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
if ! python3 -m pip install -v --no-build-isolation --no-deps --no-index -e kernels_ext >"$OUT/build.log" 2>&1; then
  tail -n 60 "$OUT/build.log"; echo "BUILD FAILED" | tee -a "$LOG"; exit 1
fi
python3 -c "import qgate_kernels as q; print(q.build_info(), q.cuda_kernels_available())" 2>&1 | tee -a "$LOG"

step "which kernels one HC call launches (torch profiler), per impl"
for impl in fused fused_plain split; do
  QGATE_HC_IMPL=$impl python3 - <<'PY' 2>&1 | tee -a "$LOG"
import os, torch, qgate_kernels
from torch.profiler import ProfilerActivity, profile
d, hs, r = torch.device("cuda"), 2048, 320
h = torch.randn(1, 4 * hs, device=d, dtype=torch.bfloat16)
nw = torch.randn(4 * hs, device=d, dtype=torch.bfloat16)
wd = torch.randn(336, 4 * hs, device=d, dtype=torch.bfloat16)
wu = torch.randn(4 * hs, r, device=d, dtype=torch.bfloat16)
qgate_kernels.hc_mix(h, nw, wd, wu, hc_count=4, lora_rank=r, eps=1e-6)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    qgate_kernels.hc_mix(h, nw, wd, wu, hc_count=4, lora_rank=r, eps=1e-6)
    torch.cuda.synchronize()
names = sorted({e.name.split("(")[0][:60] for e in prof.events() if e.device_type.name == "CUDA"})
print(os.environ.get("QGATE_HC_IMPL"), "kernels:", names)
PY
done

step "HC tests per impl"
for impl in ${QGATE_HC_TEST_IMPLS:-fused fused fused fused_plain split}; do
  QGATE_HC_IMPL=$impl timeout 240 python3 -m pytest tests/kernels/test_cuda.py -q -p no:cacheprovider -x \
    -k "hc or graphs or opcheck" >/tmp/pytest_hc_$impl.log 2>&1
  echo "impl=$impl rc=$? $(tail -n 1 /tmp/pytest_hc_$impl.log)" | tee -a "$LOG"
  grep -m5 -E "^E |Error|assert" /tmp/pytest_hc_$impl.log | tee -a "$LOG"
  cat /tmp/pytest_hc_$impl.log >>"$OUT/pytest_hc.log"
done

step "vLLM Triton HC against the route (default impl, then split)"
for impl in ${QGATE_HC_VLLM_IMPLS:-fused split}; do
  QGATE_HC_IMPL=$impl timeout 150 python3 kernels_ext/tools/vllm_hc_triton.py --src .vllm_src/hc.py >"$OUT/vllm_hc_$impl.json" 2>>"$LOG"
  echo "vllm hc impl=$impl rc=$?" | tee -a "$LOG"
  cat "$OUT/vllm_hc_$impl.json" | tee -a "$LOG"
done

step "HC bench per impl"
for impl in fused fused_plain split; do
  QGATE_HC_IMPL=$impl timeout 120 python3 kernels_ext/tools/bench_variants.py --routes fused_hc_fp16 --tag "hc=$impl" \
    2>>"$LOG" | grep -v '^{' | tee -a "$LOG"
done

step "crash facts: toolchain, torch flags, who defines ostream::_M_insert<long>"
{
  g++ --version | head -1; nvcc --version | tail -1
  python3 -c "import torch; print('abi', torch._C._GLIBCXX_USE_CXX11_ABI); print(torch.__config__.show())"
  SO=$(python3 -c "import qgate_kernels._C as c; print(c.__file__)")
  echo "so=$SO"
  nm -C -D --defined-only "$SO" | grep -E "_M_insert|num_put|locale::id" | head -20
  echo "--- objects defining _M_insert"
  for o in $(find kernels_ext/build -name '*.o'); do n=$(nm -C --defined-only "$o" | grep -c "_M_insert"); echo "$o $n"; done
  readelf -d "$SO" | grep -E "NEEDED|RPATH|RUNPATH|FLAGS"
  /opt/gcc/bin/g++ --version 2>&1 | head -1; /opt/gcc/bin/g++ -print-file-name=libstdc++.so; /opt/gcc/bin/g++ -print-file-name=libstdc++.a
  python3 -c "import sysconfig; print('CXX', sysconfig.get_config_var('CXX'), 'LDSHARED', sysconfig.get_config_var('LDSHARED'))"; echo "env CXX=${CXX:-} CC=${CC:-}"
  echo "--- libstdc++ the process maps"
  python3 -c "import torch, qgate_kernels._C; print(''.join(l for l in open('/proc/self/maps') if 'stdc++' in l or 'gcc_s' in l))" | awk '{print $6}' | sort -u
  for l in $(python3 -c "import torch, qgate_kernels._C; print(' '.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'stdc++' in l})))"); do
    echo "$l: $(strings "$l" | grep -E '^GLIBCXX_3\.4\.[0-9]+$' | sort -V | tail -1)"; done
  grep -E "^\[[0-9]+/[0-9]+\].*(gemv_cpu|ops_cuda|fused_hc)" "$OUT/build.log" | head -3 | cut -c1-1500
  grep -m3 -E "(g\+\+|c\+\+).*-shared" "$OUT/build.log" | cut -c1-1500
} >"$OUT/crash_facts.txt" 2>&1
head -c 6000 "$OUT/crash_facts.txt"

step "pytest tests/kernels (whole)"
timeout 300 python3 -X faulthandler -m pytest tests/kernels -q -ra -p no:cacheprovider >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$LOG"
tail -n 15 "$OUT/pytest.log"
step "done"
