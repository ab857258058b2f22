# Sourced by every device call script (tools/gpu_engine/calls/*.sh), from the repository root on the
# device machine. Sets LOG, step(), the payload's env (/tmp/ge/env.sh, written by device_install.sh),
# PYTHONPATH for the checkout's harness + route_env + kernels_ext, the carried models (QGATE_CACHE) and GSM8K split,
# and RUNS (the qgate run folders; pack_runs puts them in $OUT/runs.tgz: the tool brings back at most
# 8 files). GE_COMMIT (given on the command line) is written into every call's log: the device's copy
# of the checkout has no .git.
# TP (1, 2 or 4; default 1): the tensor parallel size of the production-shape contract a call runs
# (prod_contract: contracts/qwen38-prodshape-DTYPE-tpN.yaml at 2 and 4, run folders suffixed -tpN), on
# a machine of at least TP GPUs (need_gpus). DRY_RUN=1: no payload, no GPU; every qgate command that
# would start an engine, write a checkpoint or read a run's results is printed (`DRY_RUN: python3 -m
# qgate ...`, in the log too) instead of run; everything else (a DERIVE, the futility check) runs
# (tests/test_call_scripts.py runs the calls so on the CPU).
set -uo pipefail
GE=${GE:-/tmp/ge}
OUT=${OUT:-/tmp/qgate-gpu-out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RUNS=${RUNS:-/tmp/qgate-runs}
mkdir -p "$RUNS"
export PYTHONUNBUFFERED=1
T_CALL=${T_CALL:-$(date +%s)}  # the call's start: a script another one runs keeps its caller's
export T_CALL
# seconds left of a device call (CALL_S, default 590 of the tool's 600) after keeping `$1` for what follows
call_left() { echo $(( ${CALL_S:-590} - ($(date +%s) - T_CALL) - $1 )); }
# call_limit WANT KEEP: the seconds a step may run: WANT, never past the call's end less KEEP (what is
# packed after it); a script another call script runs keeps its caller's clock (T_CALL)
call_limit() { local left; left=$(call_left "$2"); echo $(( left < $1 ? left : $1 )); }
step() { echo "=== $* ($(date -u +%H:%M:%S), +$(( $(date +%s) - T_CALL )) s)" | tee -a "$LOG"; }
echo "call $(basename "$0") commit ${GE_COMMIT:-unknown} on $(hostname) $(date -u +%FT%TZ)${TP:+ TP=$TP}" | tee -a "$LOG"
TP=${TP:-1}
case $TP in
  1 | 2 | 4) ;;
  *) echo "TP=$TP: expected 1, 2 or 4 (the production-shape contracts' sizes)" | tee -a "$LOG"; exit 2 ;;
esac
if [ "$TP" -gt 1 ]; then
  # the workplace's GPUs keep NVLink multicast off (a program that uses it can take a shared host's
  # GPUs out of service for days): set for every engine and its workers, whatever the image set
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
fi

if [ "${DRY_RUN:-0}" = 1 ]; then
  # python3 -m qgate COMMAND: printed for the commands that start an engine, write a checkpoint or read
  # a run's results; every other python3 (derive_contract.py, the futility check, summarize.py) runs
  python3() {
    if [ "${1:-}" = -m ] && [ "${2:-}" = qgate ] && [[ " run ablate compare model demo " == *" ${3:-} "* ]]; then
      echo "DRY_RUN: python3 $*" | tee -a "$LOG"
      return 0
    fi
    command python3 "$@"
  }
  timeout() { shift; "$@"; }  # the limit is the device's; the functions above run in this shell
  nvidia-smi() { echo "DRY_RUN: nvidia-smi $*"; }
fi

# need_gpus: a TP > 1 call on a machine of fewer GPUs stops here (exit 3), before any device time goes
need_gpus() {
  [ "$TP" -gt 1 ] && [ "${DRY_RUN:-0}" != 1 ] || return 0
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "$n" -ge "$TP" ] || { echo "TP=$TP needs $TP GPUs; this machine has $n" | tee -a "$LOG"; exit 3; }
}

use_engine() {  # the payload's vLLM + qgate from this checkout
  need_gpus
  if [ "${DRY_RUN:-0}" = 1 ]; then  # the machine's own python3 and qgate from this checkout
    export PYTHONPATH=$PWD/harness:$PWD/route_env:$PWD/kernels_ext${PYTHONPATH:+:$PYTHONPATH}
    return 0
  fi
  [ -f "$GE/env.sh" ] || { echo "MISSING $GE/env.sh: the machine went cold (stage again from call-01)" | tee -a "$LOG"; exit 3; }
  # PYTHONPATH from the one the outermost call script started with: a script that another one runs
  # (10-install.sh -> 70-decide.sh) would else add the payload's entries twice, and qgate refuses to
  # resume a run whose PYTHONPATH changed (2026-12-05: the next call's --resume was refused)
  export GE_BASE_PYTHONPATH=${GE_BASE_PYTHONPATH-${PYTHONPATH:-}}
  PYTHONPATH=$GE_BASE_PYTHONPATH  # empty as unset: env.sh and the line below add no empty entry
  # shellcheck disable=SC1091
  source "$GE/env.sh"
  export PYTHONPATH=$PWD/harness:$PWD/route_env:$PWD/kernels_ext${PYTHONPATH:+:$PYTHONPATH}
  wait_build
  export QGATE_CACHE=$GE/extra/cache QGATE_GSM8K_PATH=$GE/extra/gsm8k/test.jsonl
}

wait_build() {  # the kernels_ext build started by stage.sh 01; its .so beside the checkout's Python
  local i=0
  while [ ! -f "$GE/build.rc" ] && [ $i -lt 300 ]; do sleep 2; i=$((i + 2)); done
  echo "kernels_ext build: $(cat "$GE/build.rc" 2>/dev/null || echo 'not done after 300 s')" | tee -a "$LOG"
  grep -q "^rc=0" "$GE/build.rc" 2>/dev/null || { tail -n 30 "$GE/build.log"; exit 4; }
  cp "$(cat "$GE/so.path")" kernels_ext/qgate_kernels/
}

q() { python3 -m qgate "$@"; }

# restore_jit: the JIT caches an earlier machine packed (60-probe.sh JIT_PACK=1: Triton's, vLLM's, the
# CuTe DSL's), when this call carries them as .gpu-engine/jit/jit-cache.tgz.NN: the first engine start
# then skips the compile (~100 s at the production shapes). Same GPU, driver and payload only.
restore_jit() {
  ls .gpu-engine/jit/jit-cache.tgz.* >/dev/null 2>&1 || return 0
  cat .gpu-engine/jit/jit-cache.tgz.* | tar -xzf - -C / && echo "JIT caches restored: $(du -sh .gpu-engine/jit | cut -f1)" | tee -a "$LOG"
}

# prod_contract DTYPE: the production-shape contract a call runs (at TP 2 or 4 the TP contract of DTYPE),
# and the suffixes of its run folders: TPTAG (-tpN, empty at TP 1) and TAGGED.
# DERIVE="TAG PATH=JSON ..." (JSON without spaces) derives it first (derive_contract.py: e.g. the
# candidate with the QSA top-k route, `DERIVE='topk arms.candidate.env.VLLM_SM70_QWEN38_QSA_TOPK="1"'`)
# into $RUNS/contract-TAG.yaml, packed with the runs; a set qgate refuses stops the call (exit 2) before
# any engine starts. Sets CONTRACT and TAGGED (-TAG, or empty). BASE_CONTRACT replaces the production-shape
# one (a dry run of a call on the CPU with a CPU contract). DERIVE=auto takes the first DERIVE the
# probe's reading proposes (READING, default $RUNS/probe-DTYPE/reading.txt: a variant that brought a
# candidate below 85 % of the control back to it), else none: a call after the probe needs no one to
# read it within the machine's 30 s idle window.
prod_contract() {
  CONTRACT=${BASE_CONTRACT:-contracts/qwen38-prodshape-$1.yaml}
  TPTAG=""
  if [ "$TP" -gt 1 ]; then
    CONTRACT=${BASE_CONTRACT:-contracts/qwen38-prodshape-$1-tp$TP.yaml}
    TPTAG=-tp$TP
  fi
  [ -f "$CONTRACT" ] || { echo "no contract $CONTRACT (DTYPE $1, TP $TP)" | tee -a "$LOG"; exit 2; }
  TAGGED=""
  if [ "${DERIVE:-}" = auto ]; then
    local reading=${READING:-$RUNS/probe-$1/reading.txt}
    DERIVE=$(grep -o "DERIVE='[^']*'" "$reading" 2>/dev/null | head -n 1 | sed "s/^DERIVE='//; s/'$//")
    echo "DERIVE=auto: ${DERIVE:-none proposed} (from $reading)" | tee -a "$LOG"
  fi
  [ -n "${DERIVE:-}" ] || return 0
  local parts sets=() s
  read -ra parts <<<"$DERIVE"  # split on blanks, no glob expansion (JSON has [ ])
  for s in "${parts[@]:1}"; do sets+=(--set "$s"); done
  local tag=${parts[0]}
  python3 tools/gpu_engine/derive_contract.py "$CONTRACT" "$RUNS/contract-$tag.yaml" "$tag" "${sets[@]}" 2>&1 \
    | tee -a "$LOG" | grep -q "^ok: " || exit 2
  CONTRACT=$RUNS/contract-$tag.yaml
  TAGGED=-$tag
}

# gate NAME CONTRACT: qgate run speed + qgate compare into $RUNS/NAME, timed, summarised in the log.
gate() {
  local name=$1 contract=$2 t0 rc
  t0=$(date +%s)
  step "gate $name: qgate run speed -c $contract"
  q run speed -c "$contract" -o "$RUNS/$name" >"$RUNS/$name.run.txt" 2>&1
  rc=$?
  tail -n 15 "$RUNS/$name.run.txt" | tee -a "$LOG"
  echo "run speed rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"
  step "gate $name: qgate compare"
  q compare "$RUNS/$name/speed/control.json" "$RUNS/$name/speed/candidate.json" -c "$contract" \
    -o "$RUNS/$name/compare" >"$RUNS/$name.compare.txt" 2>&1
  echo "compare rc=$? ($(( $(date +%s) - t0 )) s in all)" | tee -a "$LOG"
  tail -n 25 "$RUNS/$name.compare.txt" | tee -a "$LOG"
  python3 tools/gpu_engine/summarize.py "$RUNS/$name" 2>&1 | tee -a "$LOG"
}

pack_runs() {  # every run folder of this call (logs of vLLM included), as one file
  step "pack $*"
  (cd "$RUNS" && tar -czf "$OUT/runs-$(basename "$0" .sh).tgz" "$@" 2>&1 | tail -n 3)
  ls -l "$OUT" | tee -a "$LOG"
}
