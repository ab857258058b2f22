set -u
T0=$(date +%s)
chmod +x .topkbin/tb .topkbin/tbp
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 150 .topkbin/tb --check --time 2>&1 | tee $OUT/bench.txt | grep -v "^  ok" | tail -40; echo "tb rc=${PIPESTATUS[0]} t=$(( $(date +%s)-T0 ))"
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
