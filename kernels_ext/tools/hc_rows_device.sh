#!/usr/bin/env bash
# One device call for the HC rounds of the tenth session (fused_hc_tma.cuh): tma4 (default) against
# v5 (QGATE_HC_ROWS=1: down rows whole per block, every block normalises every stream, tagged lora
# words) and the launch / copy-order switches (QGATE_HC_ALLOW, QGATE_HC_UP, QGATE_HC_NWPRE, QGATE_HC_SPIN).
# Build; the HC tests under every variant (side by side); bench_variants --routes fused_hc_fp16 per
# variant, two interleaved passes; pytest tests/kernels whole under the variant with the lowest worst
# case (mean of the passes) and under tma4; phase stops under PDL (hc_phases.py: 6 = launch, wait and
# weights alone) and in-kernel clocks counted from the wait's return (QGATE_HC_CLOCKS=2) for tma4 and
# that variant; a summary.
# Variants: HC_VARIANTS, space-separated "tag:VAR=value,VAR=value" (tag first, tma4 included).
# Usage (repository root, carrying .whl and .vllm_src): OUT=... bash kernels_ext/tools/hc_rows_device.sh
# HC_DEADLINE (s, default 330): optional steps are skipped once the script has run that long.
set -uo pipefail
OUT=${OUT:-/tmp/hc-out}
source kernels_ext/tools/device_env.sh
DEADLINE=${HC_DEADLINE:-330}
VARIANTS=${HC_VARIANTS:-"tma4:QGATE_HC_ROWS=0 tma4_a1:QGATE_HC_ALLOW=1 tma4_a2:QGATE_HC_ALLOW=2 \
tma4_a3:QGATE_HC_ALLOW=3 tma4_up2_a1:QGATE_HC_UP=2,QGATE_HC_ALLOW=1 rows:QGATE_HC_ROWS=1 \
rows_a1:QGATE_HC_ROWS=1,QGATE_HC_ALLOW=1 rows_a2:QGATE_HC_ROWS=1,QGATE_HC_ALLOW=2 \
rows_up2:QGATE_HC_ROWS=1,QGATE_HC_UP=2 rows_pre_a1:QGATE_HC_ROWS=1,QGATE_HC_UP=2,QGATE_HC_ALLOW=1,QGATE_HC_NWPRE=1"}
left() { [ "$SECONDS" -lt "$DEADLINE" ] || { echo "skipped (deadline, ${SECONDS}s): $*" | tee -a "$LOG"; return 1; }; }
envs() { echo "${1#*:}" | tr ',' ' '; }  # "tag:A=1,B=2" -> "A=1 B=2"

step "build (TORCH_CUDA_ARCH_LIST=9.0)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
if ! python3 -m pip install -v --no-build-isolation --no-deps --no-index -e kernels_ext >/tmp/build.log 2>&1; then
  tail -n 60 /tmp/build.log; tail -n 200 /tmp/build.log >"$OUT/build_tail.log"; echo "BUILD FAILED" | tee -a "$LOG"; exit 1
fi
echo "build done at ${SECONDS}s" | tee -a "$LOG"

step "HC tests under every variant (side by side)"
for v in $VARIANTS; do
  env $(envs "$v") timeout 200 python3 -m pytest tests/kernels/test_cuda.py -q -p no:cacheprovider \
    -k "hc or graphs or opcheck" >"/tmp/pytest_${v%%:*}.log" 2>&1 &
done
wait
for v in $VARIANTS; do
  t=${v%%:*}
  echo "tests $t: $(tail -n 1 /tmp/pytest_$t.log)" | tee -a "$LOG"
  grep -m4 -E "^E |^FAILED|Error" /tmp/pytest_$t.log | cut -c1-300 | tee -a "$LOG"
  { echo "=== $t"; cat /tmp/pytest_$t.log; } >>"$OUT/pytest_hc.log"
done
echo "tests done at ${SECONDS}s" | tee -a "$LOG"

step "HC bench per variant (bench_variants, CUDA-graph medians, rotated inputs), two passes"
bench() {  # tag, then env assignments
  local tag=$1; shift
  env "$@" timeout 60 python3 kernels_ext/tools/bench_variants.py --routes fused_hc_fp16 --tag "$tag" \
    >>"$OUT/bench.jsonl" 2>/tmp/bench_err.log
  grep -E "Error|error" /tmp/bench_err.log | cut -c1-160 | tee -a "$LOG"
}
for pass in 1 2; do
  for v in $VARIANTS; do
    left "bench pass $pass ${v%%:*}" || break
    bench "${v%%:*}" $(envs "$v")
  done
  echo "(pass $pass done at ${SECONDS}s)" | tee -a "$LOG"
done
summary() {
  python3 - "$OUT/bench.jsonl" "$VARIANTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
order = [v.split(":")[0] for v in sys.argv[2].split()]
by = {}
for r in rows:
    s = r["shape"]
    by.setdefault(r["tag"], {}).setdefault(f"{s['dtype']}/{s['op']}", []).append(r["route_timing"]["median_us"])
cases = list(by.get("tma4", next(iter(by.values()))).keys())
print("variant       " + " ".join(f"{c:>22}" for c in cases) + "   worst   (mean of passes; each pass)")
best = None
for tag in order:
    if tag not in by:
        continue
    m = [statistics.mean(by[tag].get(c, [float("nan")])) for c in cases]
    print(f"{tag:13} " + " ".join(f"{x:22.2f}" for x in m) + f"  {max(m):6.2f}   "
          + " | ".join("/".join(f"{x:.2f}" for x in by[tag][c]) for c in cases))
    if tag != "tma4" and (best is None or max(m) < best[1]):
        best = (tag, max(m))
print("BEST", best[0] if best else "")
PY
}
summary | tee -a "$LOG" "$OUT/summary.txt"
BEST=$(grep '^BEST' "$OUT/summary.txt" | tail -n 1 | cut -d' ' -f2)
BESTV=$(for v in $VARIANTS; do [ "${v%%:*}" = "$BEST" ] && echo "$v"; done)

step "pytest tests/kernels whole under $BEST ($(envs "$BESTV")) and under tma4 (side by side)"
if [ -n "$BESTV" ] && left "pytest whole"; then
  env $(envs "$BESTV") timeout 150 python3 -X faulthandler -m pytest tests/kernels -q -p no:cacheprovider \
    >/tmp/pytest_whole_best.log 2>&1 &
  QGATE_HC_ROWS=0 timeout 150 python3 -X faulthandler -m pytest tests/kernels -q -p no:cacheprovider \
    >/tmp/pytest_whole_tma4.log 2>&1 &
  wait
  for t in best tma4; do
    echo "pytest whole $t: $(tail -n 1 /tmp/pytest_whole_$t.log)" | tee -a "$LOG"
    grep -m6 -E "^E |^FAILED|Error" /tmp/pytest_whole_$t.log | cut -c1-300 | tee -a "$LOG"
    { echo "=== whole $t"; cat /tmp/pytest_whole_$t.log; } >>"$OUT/pytest_hc.log"
  done
fi

step "phase stops under PDL and clocks from the wait's return (hc_phases.py, bf16 combine_and_mix)"
for v in "tma4:QGATE_HC_ROWS=0" $BESTV; do
  for stop in 6 0; do
    left "phases ${v%%:*} stop=$stop" || break
    env $(envs "$v") QGATE_HC_PHASE_STOP=$stop timeout 40 python3 kernels_ext/tools/hc_phases.py 2>>"$LOG" \
      | sed "s/^/${v%%:*} /" | tee -a "$LOG" "$OUT/phases.log"
  done
  left "clocks ${v%%:*}" || break
  env $(envs "$v") QGATE_HC_CLOCKS=2 timeout 40 python3 kernels_ext/tools/hc_phases.py >/tmp/clk.log 2>>"$LOG"
  { echo "=== ${v%%:*}"; cat /tmp/clk.log; } >>"$OUT/clocks.log"
  grep HCCLK /tmp/clk.log | tail -n 3 | sed "s/^/${v%%:*} /" | tee -a "$LOG"
done

step "summary (${SECONDS}s)"
grep -E "^tests |^pytest whole" "$LOG"
cat "$OUT/summary.txt"
