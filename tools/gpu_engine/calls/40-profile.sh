#!/usr/bin/env bash
# 40-profile.sh CONTRACT_NAME...: a per-kernel decode timeline of both arms of each named contract
# (contracts/NAME.yaml; tools/gpu_engine/profile_decode.py: one engine start per arm), e.g.
# `40-profile.sh qwen38-prodshape-bf16 qwen4exp-bf16-gpu`. The production-shape contracts need
# the checkpoint 10-install.sh wrote.
source tools/gpu_engine/calls/lib.sh
use_engine
names=()
for c in "${@:-qwen38-prodshape-bf16}"; do
  step "profile_decode $c"
  t0=$(date +%s)
  python3 tools/gpu_engine/profile_decode.py "contracts/$c.yaml" "$RUNS/prof-$c" --tokens 64 2>&1 \
    | tee "$RUNS/prof-$c.txt" | tee -a "$LOG"
  echo "profile $c: $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  for arm in control candidate; do tail -n 12 "$RUNS/prof-$c/$arm.log" >> "$LOG"; done
  names+=("prof-$c" "prof-$c.txt")
done
pack_runs "${names[@]}"
