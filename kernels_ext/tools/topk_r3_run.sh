#!/usr/bin/env bash
# Device call of the top-k round-3 switch QGATE_TP_WAIT (how a block waits for pushed data; notes in
# BENCH.md / the round-3 notes). Harness binaries built on the CPU machine (CUDA 13, sm_90), carried
# in .topkbin/r3/: tbD (sources' default, WAIT=0), tbW1..tbW5 (WAIT=1..5), tbSW4 (SPEC=1 WAIT=4),
# tbSW5 (SPEC=1 WAIT=5), tbpD / tbpW4 / tbpW5 (phase clocks).
# Extension A (built at once, beside the harness runs): -DQGATE_TP_WAIT=4. Then the best harness
# variant (integers 1 x 131072 least, continuous and 0.25 steps within 0.1 us of tbD) if it is not
# A's, else the default (op figures of both in this call). Each: top-k CUDA tests and the op.
# Usage (repository root, .topkbin and .whl carried): OUT=$OUT bash kernels_ext/tools/topk_r3_run.sh
set -u
T0=$(date +%s)
source kernels_ext/tools/device_env.sh
R=.topkbin/r3
chmod +x $R/tb*
el() { echo "t=$(( $(date +%s) - T0 ))s"; }
P=push1024x8pdl
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
ext_build() {  # $1 tag, $2 flags
  find kernels_ext -name 'qsa_topk*.o' -delete 2>/dev/null; touch kernels_ext/csrc/qsa_topk.cu
  NVCC_APPEND_FLAGS="$2" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 timeout 150 python3 -m pip install \
    --no-build-isolation --no-deps --no-index -e kernels_ext >$OUT/build$1.log 2>&1
  echo $? >$OUT/build$1.rc
}
ext_bench() {  # $1 tag
  timeout 45 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk --tag "ext$1" >$OUT/variants$1.jsonl 2>/dev/null
  python3 - "$OUT/variants$1.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    by = " ".join(f"{k} {v['median_us']:.2f}" for k, v in d.get("by_input", {}).items())
    print(f"  {d.get('label'):15} all {d['route_timing']['median_us']:.2f} | {by}")
PY
  el
}
ext_test() {  # $1 tag
  echo "ext $1: build rc=$(cat $OUT/build$1.rc)"; [ "$(cat $OUT/build$1.rc)" = 0 ] || { tail -5 $OUT/build$1.log; return; }
  timeout 60 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" >$OUT/pytest$1.txt 2>&1
  echo "  pytest rc=$? $(tail -n 1 $OUT/pytest$1.txt)"
  grep -E "FAILED|Error" $OUT/pytest$1.txt | head -3
  ext_bench $1
}
# The HC files as committed (.topkbin/hc_head): another helper's work in progress does not enter.
for f in .topkbin/hc_head/*; do [ -f "$f" ] && cp "$f" kernels_ext/csrc/; done
ext_build A "-DQGATE_TP_WAIT=4" &
BP=$!
V="tbD tbW1 tbW2 tbW3 tbW4 tbW5 tbSW4 tbSW5"
for b in $V; do
  timeout 40 $R/$b --check --only $P >$OUT/${b}_check.txt 2>&1; echo "$b check rc=$? $(tail -1 $OUT/${b}_check.txt)"
  grep -E "MISMATCH" $OUT/${b}_check.txt | head -3
done
el
for b in $V; do timeout 40 $R/$b --time --only $P >$OUT/$b.txt 2>&1 || echo "$b rc=$?"; done
timeout 40 $R/tbD --time --only $P >$OUT/tbDb.txt 2>&1
python3 kernels_ext/tools/topk_summary.py time $(for b in $V; do echo $OUT/$b.txt; done) $OUT/tbDb.txt
el
BEST=$(python3 - $OUT $V <<'PY'
import re, sys
out, names = sys.argv[1], sys.argv[2:]
def med(b):
    r, cur = {}, None
    for line in open(f"{out}/{b}.txt", errors="replace"):
        m = re.match(r"time 1 x 131072 k=\d+, ([^:]+):", line)
        if m: cur = m.group(1)[:5]; continue
        if line.startswith("time "): cur = None; continue
        m = re.match(r"\s+push1024x8pdl\s+median\s+([\d.]+) us", line)
        if m and cur: r.setdefault(cur, []).append(float(m.group(1)))
    return {k: min(v) for k, v in r.items()}
def ok(b):
    t = open(f"{out}/{b}_check.txt", errors="replace").read()
    return "ok: 0 mismatches" in t and "MISMATCH" not in t
try:
    d = med("tbD"); best, bi = "tbD", d["integ"]
    for b in names[1:]:
        m = med(b)
        if ok(b) and len(m) == 3 and m["conti"] <= d["conti"] + 0.1 and m["steps"] <= d["steps"] + 0.1 and m["integ"] < d["integ"] - 0.03 and m["integ"] < bi:
            best, bi = b, m["integ"]
    print(best)
except Exception as e:
    print("tbD")
PY
)
echo "harness best: $BEST"
flags() { case $1 in tbW*) echo "-DQGATE_TP_WAIT=${1#tbW}";; tbSW*) echo "-DQGATE_TP_SPEC=1 -DQGATE_TP_WAIT=${1#tbSW}";; *) echo "";; esac; }
wait $BP
el
ext_test A
E=$(( $(date +%s) - T0 ))
if [ $E -gt 185 ]; then echo "no time for a second extension (t=${E}s)"; TAGB=none
elif [ "$BEST" != tbW4 ] && [ "$BEST" != tbD ]; then
  ext_build B "$(flags $BEST)" &
  BP=$!; TAGB="B ($BEST)"
else
  ext_build D "" &
  BP=$!; TAGB="D (default)"
fi
for b in tbpD tbpW4 tbpW5; do timeout 30 $R/$b --phases --only $P >$OUT/$b.txt 2>&1; echo "$b rc=$?"; done
if [ "$TAGB" != none ]; then
wait $BP
el
E=$(( $(date +%s) - T0 ))
if [ "${TAGB:0:1}" = B ] && [ $E -lt 175 ]; then echo "ext $TAGB"; ext_test B
elif [ "${TAGB:0:1}" = B ]; then echo "ext $TAGB: build rc=$(cat $OUT/buildB.rc) (no time for pytest)"; ext_bench B
else echo "ext $TAGB: build rc=$(cat $OUT/buildD.rc)"; ext_bench D; fi
fi
for b in tbpD tbpW4 tbpW5; do python3 kernels_ext/tools/topk_summary.py phases $OUT/$b.txt; done
el
cd $OUT && tar czf all.tgz --remove-files *.txt *.log *.jsonl *.rc 2>/dev/null; ls $OUT
