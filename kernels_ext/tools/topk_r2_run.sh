#!/usr/bin/env bash
# Device call of the top-k round-2 switches (QGATE_TP_UNI, QGATE_TP_FSEL, QGATE_TP_ZW; notes in
# BENCH.md). Harness binaries built on the CPU machine (CUDA 13, sm_90), carried in .topkbin/:
#   tb    the sources' defaults (UNI=1 FSEL=1 ZW=1)     tbp   the same with phase clocks
#   tbP0  UNI=0 FSEL=0 ZW=0 (push kernel byte-identical to the previous default, 9f1e22d); tbp0 phases
#   tbU   UNI=1 only   tbU2  UNI=2 only   tbF  FSEL=1 only   tbZ  ZW=1 only   tbUF  UNI=1 FSEL=1
# Extension A: the sources' defaults; B: -DQGATE_TP_FSEL=0 -DQGATE_TP_ZW=0 (UNI only); C (if time is
# left): the previous default (all three off). Each: top-k CUDA tests and the op (bench_variants).
# Run as the tenth session's top-k device call on 683902a (its defaults UNI=1 FSEL=1 ZW=1; the default
# since is ZW only, whose push kernel is byte-identical to tbZ's).
# Usage (repository root, .topkbin and .whl carried): OUT=$OUT bash kernels_ext/tools/topk_r2_run.sh
set -u
T0=$(date +%s)
source kernels_ext/tools/device_env.sh
chmod +x .topkbin/tb*
el() { echo "t=$(( $(date +%s) - T0 ))s"; }
P=push1024x8pdl
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
ext_build() {  # $1 tag, $2 flags
  find kernels_ext -name 'qsa_topk*.o' -delete 2>/dev/null; touch kernels_ext/csrc/qsa_topk.cu
  NVCC_APPEND_FLAGS="$2" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 timeout 170 python3 -m pip install \
    --no-build-isolation --no-deps --no-index -e kernels_ext >$OUT/build$1.log 2>&1
  echo $? >$OUT/build$1.rc
}
ext_test() {  # $1 tag
  echo "ext $1: build rc=$(cat $OUT/build$1.rc)"; [ "$(cat $OUT/build$1.rc)" = 0 ] || { tail -5 $OUT/build$1.log; return; }
  timeout 60 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" >$OUT/pytest$1.txt 2>&1
  echo "  pytest rc=$? $(tail -n 1 $OUT/pytest$1.txt)"
  grep -E "FAILED|Error" $OUT/pytest$1.txt | head -3
  timeout 60 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk --tag "ext$1" >$OUT/variants$1.jsonl 2>/dev/null
  python3 - "$OUT/variants$1.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    by = " ".join(f"{k} {v['median_us']:.2f}" for k, v in d.get("by_input", {}).items())
    print(f"  {d.get('label'):15} all {d['route_timing']['median_us']:.2f} | {by}")
PY
  el
}
# The HC files as committed (.topkbin/hc_head, when carried): another helper's work in progress there
# does not enter this build (this copy of the tree is the device's own).
for f in .topkbin/hc_head/*; do [ -f "$f" ] && cp "$f" kernels_ext/csrc/; done
ext_build A "" &
BP=$!
timeout 90 .topkbin/tb --check >$OUT/tb_check.txt 2>&1; echo "tb check (all impls) rc=$? $(tail -1 $OUT/tb_check.txt)"
grep -E "MISMATCH" $OUT/tb_check.txt | head -5
for b in tbP0 tbU tbU2 tbF tbZ tbUF; do
  timeout 40 .topkbin/$b --check --only $P >$OUT/${b}_check.txt 2>&1; echo "$b check rc=$? $(tail -1 $OUT/${b}_check.txt)"
  grep -E "MISMATCH" $OUT/${b}_check.txt | head -3
done
el
wait $BP
el
ext_test A
ext_build B "-DQGATE_TP_FSEL=0 -DQGATE_TP_ZW=0" &
BP=$!
for b in tbP0 tb tbU tbU2 tbF tbZ tbUF; do timeout 40 .topkbin/$b --time --only $P >$OUT/$b.txt 2>&1 || echo "$b rc=$?"; done
timeout 40 .topkbin/tbP0 --time --only $P >$OUT/tbP0b.txt 2>&1
python3 kernels_ext/tools/topk_summary.py time $OUT/tbP0.txt $OUT/tb.txt $OUT/tbU.txt $OUT/tbU2.txt $OUT/tbF.txt \
  $OUT/tbZ.txt $OUT/tbUF.txt $OUT/tbP0b.txt
el
wait $BP
ext_test B
timeout 30 .topkbin/tbp --phases --only $P >$OUT/tbp.txt 2>&1; echo "tbp rc=$?"
timeout 30 .topkbin/tbp0 --phases --only $P >$OUT/tbp0.txt 2>&1; echo "tbp0 rc=$?"
el
if [ $(( $(date +%s) - T0 )) -lt 190 ]; then
  ext_build C "-DQGATE_TP_UNI=0 -DQGATE_TP_FSEL=0 -DQGATE_TP_ZW=0"
  ext_test C
fi
python3 kernels_ext/tools/topk_summary.py phases $OUT/tbp.txt
python3 kernels_ext/tools/topk_summary.py phases $OUT/tbp0.txt
cd $OUT && tar czf all.tgz --remove-files *.txt *.log *.jsonl *.rc 2>/dev/null; ls $OUT
