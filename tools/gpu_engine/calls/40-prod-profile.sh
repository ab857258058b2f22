#!/usr/bin/env bash
# 40-prod-profile.sh [DTYPES]: a per-kernel decode timeline of both arms at the production shapes
# (tools/gpu_engine/profile_decode.py; one engine start per arm and dtype). DTYPES: "fp16" (default),
# "fp16 bf16". Needs the checkpoint 10-install.sh wrote.
source tools/gpu_engine/calls/lib.sh
use_engine
[ -f /tmp/qgate-prodshape/config.json ] || { echo "MISSING /tmp/qgate-prodshape (10-install.sh writes it)" | tee -a "$LOG"; exit 3; }
names=()
for dt in ${1:-fp16}; do
  step "profile_decode $dt"
  t0=$(date +%s)
  python3 tools/gpu_engine/profile_decode.py "contracts/qwen38-prodshape-$dt-h200.yaml" "$RUNS/prof-$dt" \
    --tokens 64 2>&1 | tee "$RUNS/prof-$dt.txt" | tee -a "$LOG"
  echo "profile $dt: $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  for arm in control candidate; do tail -n 25 "$RUNS/prof-$dt/$arm.log" >> "$LOG"; done
  names+=("prof-$dt" "prof-$dt.txt")
done
pack_runs "${names[@]}"
