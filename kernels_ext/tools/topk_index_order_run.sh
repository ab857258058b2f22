# Device call of the index-order top-k (BENCH.md, eighth session): harness check + time (carried .topkbin/tb,
# tbn = -DQGATE_TP_NO_RESOLVE, tbf = -DQGATE_TP_RESOLVE_FIRST, tbp = phases), extension build, top-k tests, the op as `qgate bench ops` times it.
# Usage (repository root, .topkbin and .whl carried): OUT=$OUT bash kernels_ext/tools/topk_index_order_run.sh
set -u
T0=$(date +%s)
chmod +x .topkbin/tb*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 150 .topkbin/tb --check --time 2>&1 | tee $OUT/bench.txt | grep -v "^  ok" | tail -40; echo "tb rc=${PIPESTATUS[0]} t=$(( $(date +%s)-T0 ))"
grep -A7 "^time 1 x 131072" $OUT/bench.txt | grep -E "^time|pdl"
[ -x .topkbin/tbn ] && { timeout 60 .topkbin/tbn --time > $OUT/bench_noresolve.txt 2>&1; echo "tbn (QGATE_TP_NO_RESOLVE) rc=$?"; grep -A7 "^time 1 x 131072" $OUT/bench_noresolve.txt | grep -E "^time|pdl"; }
[ -x .topkbin/tbf ] && { timeout 90 .topkbin/tbf --check --time > $OUT/bench_resolvefirst.txt 2>&1; echo "tbf (QGATE_TP_RESOLVE_FIRST) rc=$?"; grep -E "mismatch" $OUT/bench_resolvefirst.txt; grep -A7 "^time 1 x 131072" $OUT/bench_resolvefirst.txt | grep -E "^time|pdl"; }
timeout 40 .topkbin/tbp --phases > $OUT/phases.txt 2>&1; echo "tbp rc=$?"; grep -A14 "1 x 131072" $OUT/phases.txt | grep -E "phases|push|local|trim|span|write" | head -30
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/harness
TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 QGATE_KERNELS_CUDA=1 timeout 170 python3 -m pip install --no-build-isolation --no-deps --no-index -e kernels_ext > $OUT/build.log 2>&1; echo "build rc=$? t=$(( $(date +%s)-T0 ))"
timeout 90 python3 -m pytest tests/kernels -q -p no:cacheprovider -k "topk or graphs or opcheck" 2>&1 | tail -n 6; echo "t=$(( $(date +%s)-T0 ))"
timeout 60 python3 kernels_ext/tools/bench_variants.py --routes qsa_topk --tag default > $OUT/variants.jsonl 2>$OUT/variants.txt; echo "bench rc=$?"; tail -5 $OUT/variants.txt; python3 -c "
import json
for l in open('$OUT/variants.jsonl'):
    d=json.loads(l); print(json.dumps(d)[:1500])
"
echo "t=$(( $(date +%s)-T0 ))"
