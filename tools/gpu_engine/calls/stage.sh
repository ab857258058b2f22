#!/usr/bin/env bash
# stage.sh K: one payload part onto the device machine (the call carries .gpu-engine/call-K).
# With K = 01 it also starts the kernels_ext build for sm_90 in its own session (setsid: it outlives
# the call and runs while the other parts travel; build_kernels.sh writes $GE/build.rc when done).
source tools/gpu_engine/calls/lib.sh
need_gpus  # TP=2|4 on a machine of fewer GPUs: stopped at the first call
K=${1:?usage: stage.sh K}
mkdir -p "$GE" && cp ".gpu-engine/call-$K"/* "$GE/" || { echo "STAGE FAILED: .gpu-engine/call-$K not carried"; exit 3; }
ls -l "$GE" | tee -a "$LOG"
if [ "$K" = 01 ] && [ ! -f "$GE/build.rc" ] && [ "${GE_BUILD:-1}" = 1 ]; then  # GE_BUILD=0: a dry run
  setsid nohup bash tools/gpu_engine/build_kernels.sh >"$GE/build.log" 2>&1 </dev/null &
  echo "kernels_ext build started in the background (pid $!)" | tee -a "$LOG"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
fi
[ -f "$GE/build.rc" ] && echo "kernels_ext build: $(cat "$GE/build.rc")" | tee -a "$LOG"
exit 0
