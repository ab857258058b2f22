#!/usr/bin/env bash
# One device call for the HC route (round 2: the tma3 / tma4 variants of fused_hc_tma.cuh against tma):
# build; side by side pytest tests/kernels whole under each candidate (HC_FULL, default "tma3 tma4")
# and the HC tests under each other kept impl (HC_IMPLS, default "tma"); the HC bench per variant
# (bench_variants --routes fused_hc_fp16), most important first; in-kernel clocks (QGATE_HC_CLOCKS) of
# the candidates (tools/hc_phases.py, no PDL); vLLM's Triton HC against the route while time is left.
# Usage (repository root, carrying .whl and .vllm_src): OUT=... bash kernels_ext/tools/hc_device.sh
# HC_DEADLINE (s, default 200): optional steps are skipped once the script has run that long.
set -uo pipefail
OUT=${OUT:-/tmp/hc-out}
source kernels_ext/tools/device_env.sh
DEADLINE=${HC_DEADLINE:-200}
FULL=${HC_FULL:-tma3 tma4}
IMPLS=${HC_IMPLS:-tma}
left() { [ "$SECONDS" -lt "$DEADLINE" ] || { echo "skipped (deadline, ${SECONDS}s): $*" | tee -a "$LOG"; return 1; }; }

step "build (TORCH_CUDA_ARCH_LIST=9.0)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
if ! python3 -m pip install -v --no-build-isolation --no-deps --no-index -e kernels_ext >/tmp/build.log 2>&1; then
  tail -n 60 /tmp/build.log; tail -n 200 /tmp/build.log >"$OUT/build_tail.log"; echo "BUILD FAILED" | tee -a "$LOG"; exit 1
fi
echo "build done at ${SECONDS}s" | tee -a "$LOG"

step "tests: tests/kernels whole per candidate, HC tests per other impl (side by side)"
for impl in $FULL; do
  QGATE_HC_IMPL=$impl timeout 110 python3 -X faulthandler -m pytest tests/kernels -q -p no:cacheprovider \
    >/tmp/pytest_$impl.log 2>&1 &
done
for impl in $IMPLS; do
  QGATE_HC_IMPL=$impl timeout 110 python3 -m pytest tests/kernels/test_cuda.py -q -p no:cacheprovider \
    -k "hc or graphs or opcheck" >/tmp/pytest_$impl.log 2>&1 &
done
wait
for impl in $FULL $IMPLS; do
  echo "tests impl=$impl: $(tail -n 1 /tmp/pytest_$impl.log)" | tee -a "$LOG"
  grep -m6 -E "^E |^FAILED|Error" /tmp/pytest_$impl.log | cut -c1-300 | tee -a "$LOG"
  { echo "=== $impl"; cat /tmp/pytest_$impl.log; } >>"$OUT/pytest_hc.log"
done
echo "tests done at ${SECONDS}s" | tee -a "$LOG"

step "HC bench per variant (bench_variants, CUDA-graph medians, rotated inputs)"
bench() {  # tag, then env assignments
  local tag=$1; shift
  env "$@" timeout 60 python3 kernels_ext/tools/bench_variants.py --routes fused_hc_fp16 --tag "$tag" \
    >>"$OUT/bench.jsonl" 2>/tmp/bench_err.log
  grep -E "fused_hc_fp16|Error|error" /tmp/bench_err.log | cut -c1-120 | tee -a "$LOG"
  echo "($tag done at ${SECONDS}s)" | tee -a "$LOG"
}
bench tma3 QGATE_HC_IMPL=tma3
bench tma4 QGATE_HC_IMPL=tma4
bench tma QGATE_HC_IMPL=tma
left "bench tma3 up0" && bench tma3_up0 QGATE_HC_IMPL=tma3 QGATE_HC_UP=0
left "bench tma4 up2" && bench tma4_up2 QGATE_HC_IMPL=tma4 QGATE_HC_UP=2
left "bench tma4 nopdl" && bench tma4_nopdl QGATE_HC_IMPL=tma4 QGATE_HC_PDL=0

step "in-kernel clocks (hc_phases.py, bf16 combine_and_mix, no PDL, QGATE_HC_CLOCKS=1: cycles since block entry)"
for impl in tma3 tma4; do
  left "clocks $impl" || break
  QGATE_HC_IMPL=$impl QGATE_HC_PDL=0 QGATE_HC_CLOCKS=1 timeout 40 python3 kernels_ext/tools/hc_phases.py \
    >/tmp/clk_$impl.log 2>>"$LOG"
  { echo "=== $impl"; cat /tmp/clk_$impl.log; } >>"$OUT/clocks.log"
  grep -v HCCLK /tmp/clk_$impl.log | tee -a "$LOG"
  grep HCCLK /tmp/clk_$impl.log | tail -n 3 | tee -a "$LOG"
done
left "phases tma4 stop 5" && QGATE_HC_IMPL=tma4 QGATE_HC_PDL=0 QGATE_HC_PHASE_STOP=5 timeout 40 \
  python3 kernels_ext/tools/hc_phases.py 2>>"$LOG" | tee -a "$LOG"
left "bench tma4 again" && bench tma4#2 QGATE_HC_IMPL=tma4
left "bench tma3 again" && bench tma3#2 QGATE_HC_IMPL=tma3

step "vLLM Triton HC against the route (tma4)"
if left "vllm triton"; then
  QGATE_HC_IMPL=tma4 timeout 60 python3 kernels_ext/tools/vllm_hc_triton.py --src .vllm_src/hc.py \
    >"$OUT/vllm_hc.json" 2>>"$LOG"
  echo "vllm rc=$?" | tee -a "$LOG"
  python3 - "$OUT/vllm_hc.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print("fallbacks", d["fallbacks"])
for r in d["results"]:
    print(r["dtype"], r["op"], r["bitwise"], {k: round(v, 2) for k, v in r["max_ulp"].items()},
          f"route {r['route_us']:.2f} us  vllm {r['vllm_triton_us']:.2f} us  x{r['speedup']:.2f}")
PY
fi

step "summary (${SECONDS}s)"
grep -E "^tests impl" "$LOG"
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    s = r["shape"]
    by.setdefault(r["tag"], []).append(f"{s['dtype'][-4:]}/{s['op'][:7]} {r['route_timing']['median_us']:.2f}")
for tag, v in by.items():
    print(f"{tag:12}", " ".join(v))
PY
