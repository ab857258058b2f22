#!/usr/bin/env bash
# One device call for the GEMV tuning: build, the GEMV/GDN CUDA tests, then bench_variants.py once per
# setting in QGATE_VARIANTS (space-separated specs, each comma-separated VAR=value), one process each.
# Run from the repository root with .whl carried (pydantic for the harness); output under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/qgate-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/harness${PYTHONPATH:+:$PYTHONPATH}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
python3 -m pip install --no-build-isolation --no-deps --no-index -e kernels_ext >"$OUT/build.log" 2>&1 || {
  tail -n 40 "$OUT/build.log"; exit 1; }
timeout 200 python3 -m pytest tests/kernels/test_cuda.py -q -p no:cacheprovider -k "${QGATE_TEST_K:-gemv or gdn or static or opcheck or graphs}" \
  >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$OUT/pytest.log"
for spec in ${QGATE_VARIANTS:-QGATE_DEFAULT=1}; do
  env ${spec//,/ } timeout 120 python3 kernels_ext/tools/bench_variants.py \
    --routes ${QGATE_VARIANT_ROUTES:-fp16_gemv} --tag "$spec" >>"$OUT/variants.jsonl" 2>>"$OUT/variants.txt"
done
grep -v "^\s*$" "$OUT/variants.txt" | grep -E "fp16_gemv|fused_gdn|qsa_topk|Error|error" | cut -c1-170
