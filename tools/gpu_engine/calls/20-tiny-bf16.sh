#!/usr/bin/env bash
# 20-tiny-bf16.sh: the tiny Qwen4Exp gate in bf16 (the H200's own dtype), on the warm machine.
source tools/gpu_engine/calls/lib.sh
use_engine
gate tiny-bf16 contracts/qwen4exp-bf16-gpu.yaml
pack_runs tiny-bf16 tiny-bf16.run.txt tiny-bf16.compare.txt
