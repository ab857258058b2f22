#!/usr/bin/env bash
# Device call of the top-k pass-0 second histogram / uniform-bin work (notes: /tmp/notes_topk.md, BENCH.md):
# harness binaries built on the CPU machine (CUDA 13, sm_90) and carried in .topkbin/:
#   tb   default sources (QGATE_TP_SPEC=2, QGATE_TP_UNIFORM=1)     tbp  the same with phase clocks
#   tb0  the sources of HEAD before this work (value-order kernel)  tbp0 the same with phase clocks
#   tbU  -DQGATE_TP_SPEC=0 (uniform-bin check only)   tbA -DQGATE_TP_SPEC=1 (second histogram, lazy)
#   tbB0 -DQGATE_TP_UNIFORM=0 (second histogram only)
# then the extension (default sources), the top-k CUDA tests and the op as `qgate bench ops` times it.
# Usage (repository root, .topkbin and .whl carried): OUT=$OUT bash kernels_ext/tools/topk_spec_run.sh
set -u
T0=$(date +%s)
source kernels_ext/tools/device_env.sh
chmod +x .topkbin/tb*
el() { echo "t=$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
P=push1024x8pdl
summ() { python3 kernels_ext/tools/topk_summary.py time "$1"; }
timeout 150 .topkbin/tb --check >$OUT/tb_check.txt 2>&1; echo "tb check rc=$? $(tail -1 $OUT/tb_check.txt)"
grep -E "MISMATCH" $OUT/tb_check.txt | head -5
timeout 80 .topkbin/tb --time --only $P >$OUT/tb.txt 2>&1; echo "tb rc=$? $(grep -c MISMATCH $OUT/tb.txt) mismatch lines; $(tail -1 $OUT/tb.txt)"; el
grep -E "MISMATCH" $OUT/tb.txt | head -5
summ $OUT/tb.txt
for b in tb0 tbU tbA tbB0; do
  chk=--check; [ $b = tb0 ] && chk=
  timeout 80 .topkbin/$b $chk --time --only $P >$OUT/$b.txt 2>&1; echo "$b rc=$? $(tail -1 $OUT/$b.txt)"
  grep -E "MISMATCH" $OUT/$b.txt | head -3
  summ $OUT/$b.txt
done
el
for b in tbp tbp0; do
  timeout 40 .topkbin/$b --phases --only $P >$OUT/$b.txt 2>&1; echo "$b rc=$?"
done
el
step build
TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 timeout 200 python3 -m pip install --no-build-isolation \
  --no-deps --no-index -e kernels_ext >$OUT/build.log 2>&1; echo "build rc=$?"; el
timeout 120 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" >$OUT/pytest.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest.txt; el
timeout 90 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk --tag default >$OUT/variants.jsonl 2>$OUT/variants.txt
echo "bench rc=$?"; grep -E "qsa_topk" $OUT/variants.txt | cut -c1-150
python3 - "$OUT/variants.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    by = {k: round(v["median_us"], 2) for k, v in d.get("by_input", {}).items()}
    print(d.get("label"), "all", round(d["route_timing"]["median_us"], 2), "by input", by)
PY
el
python3 kernels_ext/tools/topk_summary.py phases $OUT/tbp0.txt $OUT/tbp.txt
cd $OUT && tar czf all.tgz --remove-files *.txt *.log *.jsonl 2>/dev/null; ls $OUT
