#!/usr/bin/env bash
# One device call for the HC route: build, the HC tests under each kept QGATE_HC_IMPL (tma, tma_v1,
# split, fused) and pytest tests/kernels whole under the default, side by side; the HC bench per impl
# (tma also without PDL; tma and split twice, for the spread); vLLM's Triton HC against the route
# (tma); then the phase clocks of the tma kernel (tools/hc_phases.py) while time is left.
# Usage (repository root, carrying .whl and .vllm_src): OUT=... bash kernels_ext/tools/hc_device.sh
# HC_DEADLINE (s, default 330): optional steps are skipped once the script has run that long.
set -uo pipefail
OUT=${OUT:-/tmp/hc-out}
source kernels_ext/tools/device_env.sh
DEADLINE=${HC_DEADLINE:-330}
IMPLS=${HC_IMPLS:-tma tma_v1 split fused}
left() { [ "$SECONDS" -lt "$DEADLINE" ] || { echo "skipped (deadline, ${SECONDS}s): $*" | tee -a "$LOG"; return 1; }; }

step "build (TORCH_CUDA_ARCH_LIST=9.0)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
if ! python3 -m pip install -v --no-build-isolation --no-deps --no-index -e kernels_ext >/tmp/build.log 2>&1; then
  tail -n 60 /tmp/build.log; tail -n 200 /tmp/build.log >"$OUT/build_tail.log"; echo "BUILD FAILED" | tee -a "$LOG"; exit 1
fi
echo "build done at ${SECONDS}s" | tee -a "$LOG"

step "HC tests per impl (side by side)"
for impl in $IMPLS; do
  QGATE_HC_IMPL=$impl timeout 240 python3 -m pytest tests/kernels/test_cuda.py -q -p no:cacheprovider \
    -k "hc or graphs or opcheck" >/tmp/pytest_hc_$impl.log 2>&1 &
done
timeout 300 python3 -X faulthandler -m pytest tests/kernels -q -p no:cacheprovider >/tmp/pytest_all.log 2>&1 &
wait
for impl in $IMPLS; do
  echo "tests impl=$impl: $(tail -n 1 /tmp/pytest_hc_$impl.log)" | tee -a "$LOG"
  grep -m6 -E "^E |^FAILED|Error" /tmp/pytest_hc_$impl.log | cut -c1-300 | tee -a "$LOG"
  { echo "=== $impl"; cat /tmp/pytest_hc_$impl.log; } >>"$OUT/pytest_hc.log"
done
echo "tests/kernels whole (default impl): $(tail -n 1 /tmp/pytest_all.log)" | tee -a "$LOG"
grep -m6 -E "^E |^FAILED|Error" /tmp/pytest_all.log | cut -c1-300 | tee -a "$LOG"
{ echo "=== tests/kernels whole"; cat /tmp/pytest_all.log; } >>"$OUT/pytest_hc.log"
echo "tests done at ${SECONDS}s" | tee -a "$LOG"

step "HC bench per impl (bench_variants, CUDA-graph medians, rotated inputs)"
bench() {  # tag, then env assignments
  local tag=$1; shift
  env "$@" timeout 150 python3 kernels_ext/tools/bench_variants.py --routes fused_hc_fp16 --tag "$tag" \
    >>"$OUT/bench.jsonl" 2>/tmp/bench_err.log
  grep -E "fused_hc_fp16|Error|error" /tmp/bench_err.log | cut -c1-200 | tee -a "$LOG"
}
bench tma QGATE_HC_IMPL=tma
bench split QGATE_HC_IMPL=split
bench tma_v1 QGATE_HC_IMPL=tma_v1
left "bench tma_nopdl" && bench tma_nopdl QGATE_HC_IMPL=tma QGATE_HC_PDL=0
left "bench fused" && bench fused QGATE_HC_IMPL=fused
left "bench tma again" && bench tma#2 QGATE_HC_IMPL=tma
left "bench split again" && bench split#2 QGATE_HC_IMPL=split

step "vLLM Triton HC against the route (tma)"
if left "vllm triton"; then
  QGATE_HC_IMPL=tma timeout 150 python3 kernels_ext/tools/vllm_hc_triton.py --src .vllm_src/hc.py \
    >"$OUT/vllm_hc_tma.json" 2>>"$LOG"
  echo "vllm rc=$?" | tee -a "$LOG"
  python3 - "$OUT/vllm_hc_tma.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print("fallbacks", d["fallbacks"])
for r in d["results"]:
    print(r["dtype"], r["op"], r["bitwise"], {k: round(v, 2) for k, v in r["max_ulp"].items()},
          f"route {r['route_us']:.2f} us  vllm {r['vllm_triton_us']:.2f} us  x{r['speedup']:.2f}")
PY
fi

step "phase clocks (tma, QGATE_HC_PDL=0 so that kernel times are the kernel's own; then PDL)"
for stop in 5 1 2 3 0; do
  left "phases stop $stop" || break
  QGATE_HC_IMPL=tma QGATE_HC_PDL=0 QGATE_HC_PHASE_STOP=$stop timeout 60 python3 kernels_ext/tools/hc_phases.py \
    2>>"$LOG" | tee -a "$OUT/phases.jsonl"
done
left "phases pdl" && QGATE_HC_IMPL=tma timeout 60 python3 kernels_ext/tools/hc_phases.py 2>>"$LOG" | tee -a "$OUT/phases.jsonl"

step "summary (${SECONDS}s)"
grep -E "^tests impl|^tests/kernels whole" "$LOG"
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    s = r["shape"]
    print(f"{r['tag']:10} {s['dtype']} {s['op']:16} {r['route_timing']['median_us']:6.2f} us (baseline {r['baseline_timing']['median_us']:.2f})")
PY
