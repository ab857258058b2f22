#!/usr/bin/env bash
# Device call of the top-k switches QGATE_TP_SPEC (pass 1 from pass 0's second histogram) and
# QGATE_TP_PACK (pass counts pushed as 16-bit pairs); notes in BENCH.md. Harness binaries built on
# the CPU machine (CUDA 13, sm_90) and carried in .topkbin/:
#   tb   -DQGATE_TP_SPEC=1 (SPEC=1 PACK=1)   tbp  the same with phase clocks
#   tbS  -DQGATE_TP_SPEC=1 -DQGATE_TP_PACK=0  tbP  the default sources (SPEC=0 PACK=1)
#   tb0  the value-order kernel before this work (commit 2b194a8's sources, this harness)
# then, for each setting (NVCC_APPEND_FLAGS, the same code as the sources with those defaults): the
# extension, the top-k CUDA tests, and the op as `qgate bench ops` times it (by input kind).
# (Run as device call 2 of the ninth session's top-k helper when the sources' defaults were SPEC=1 PACK=1;
# the settings below are written for today's defaults, SPEC=0 PACK=1: the same four builds.)
# Usage (repository root, .topkbin and .whl carried): OUT=$OUT bash kernels_ext/tools/topk_spec_run.sh
set -u
T0=$(date +%s)
source kernels_ext/tools/device_env.sh
chmod +x .topkbin/tb*
el() { echo "t=$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
P=push1024x8pdl
timeout 100 .topkbin/tb --check >$OUT/tb_check.txt 2>&1; echo "tb check (all impls) rc=$? $(tail -1 $OUT/tb_check.txt)"
grep -E "MISMATCH" $OUT/tb_check.txt | head -5
for b in tbS tbP; do
  timeout 60 .topkbin/$b --check --only $P >$OUT/${b}_check.txt 2>&1; echo "$b check rc=$? $(tail -1 $OUT/${b}_check.txt)"
  grep -E "MISMATCH" $OUT/${b}_check.txt | head -3
done
el
for b in tb0 tb tbS tbP; do timeout 60 .topkbin/$b --time --only $P >$OUT/$b.txt 2>&1 || echo "$b rc=$?"; done
timeout 60 .topkbin/tb0 --time --only $P >$OUT/tb0b.txt 2>&1
python3 kernels_ext/tools/topk_summary.py time $OUT/tb0.txt $OUT/tb.txt $OUT/tbS.txt $OUT/tbP.txt $OUT/tb0b.txt
timeout 40 .topkbin/tbp --phases --only $P >$OUT/tbp.txt 2>&1; echo "tbp rc=$?"
el
n=0
for flags in "-DQGATE_TP_SPEC=1" "-DQGATE_TP_SPEC=1 -DQGATE_TP_PACK=0" "" "-DQGATE_TP_PACK=0"; do
  n=$((n + 1))
  step "extension $n: NVCC_APPEND_FLAGS='$flags'"
  find kernels_ext -name 'qsa_topk*.o' -delete 2>/dev/null; touch kernels_ext/csrc/qsa_topk.cu
  NVCC_APPEND_FLAGS="$flags" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 timeout 150 python3 -m pip install \
    --no-build-isolation --no-deps --no-index -e kernels_ext >$OUT/build$n.log 2>&1 || { echo "build rc=$?"; tail -5 $OUT/build$n.log; continue; }
  timeout 100 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" >$OUT/pytest$n.txt 2>&1
  echo "pytest rc=$? $(tail -n 1 $OUT/pytest$n.txt)"
  timeout 60 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk --tag "ext$n" >$OUT/variants$n.jsonl 2>/dev/null
  python3 - "$OUT/variants$n.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    by = " ".join(f"{k} {v['median_us']:.2f}" for k, v in d.get("by_input", {}).items())
    print(f"  {d.get('label'):15} all {d['route_timing']['median_us']:.2f} | {by} | torch {d['baseline_timing']['median_us']:.1f}")
PY
  el
done
python3 kernels_ext/tools/topk_summary.py phases $OUT/tbp.txt
cd $OUT && tar czf all.tgz --remove-files *.txt *.log *.jsonl 2>/dev/null; ls $OUT
