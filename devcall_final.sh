#!/usr/bin/env bash
# temporary (not committed): the coordinator's final device calls. PHASE=a: build, bf16 48-layer screen, kernel tests; PHASE=b: fp16 screen on the same checkpoint
set -uo pipefail
D=$OUT
if [ "$PHASE" = a ]; then
  QUICK=1 TESTS=0 BENCH=0 NCU=0 HC_CHECK=0 EXPAND=0 OUT=$D bash kernels_ext/tools/device_run.sh >/dev/null 2>&1
  tail -n 4 $D/log.txt
  OUT=/tmp/ps CK=/tmp/ck DTYPES=bf16 timeout 260 bash kernels_ext/tools/prod_screen.sh >/dev/null 2>&1; echo "prod_screen bf16 rc=$?"
  cp /tmp/ps/times.txt $D/ps_times_a.txt; cp /tmp/ps/log.txt $D/ps_log_a.txt; cp /tmp/ps/bf16/ops/real.md $D/real_bf16.md
  gzip -c /tmp/ps/bf16/ops/real.json > $D/real_bf16.json.gz; cat $D/ps_times_a.txt
  source kernels_ext/tools/device_env.sh
  timeout 200 python3 -m pytest tests/kernels -q -ra -p no:cacheprovider --ignore=tests/kernels/test_cpu_kernels.py > $D/pytest.log 2>&1; echo "pytest rc=$?"
  tail -n 15 $D/pytest.log
else
  OUT=/tmp/ps CK=/tmp/ck DTYPES=fp16 REUSE=1 timeout 400 bash kernels_ext/tools/prod_screen.sh >/dev/null 2>&1; echo "prod_screen fp16 rc=$?"
  cp /tmp/ps/times.txt $D/ps_times_b.txt; cp /tmp/ps/log.txt $D/ps_log_b.txt; cp /tmp/ps/fp16/ops/real.md $D/real_fp16.md
  gzip -c /tmp/ps/fp16/ops/real.json > $D/real_fp16.json.gz; cat $D/ps_times_b.txt
  source kernels_ext/tools/device_env.sh
  timeout 150 python3 -X faulthandler -m pytest tests/kernels/test_cpu_kernels.py -q -p no:cacheprovider > $D/pytest_cpu.log 2>&1; echo "cpu kernels rc=$?"; tail -3 $D/pytest_cpu.log
fi
