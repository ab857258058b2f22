#!/usr/bin/env bash
# device_install.sh STAGE_DIR      (on the device machine, in the call after the last part was staged)
#
# STAGE_DIR holds every ge-payload.tar.xz.NN part, SHA256SUMS and this kit's small files (each call
# copied its folder there). This script:
#   1. checks that every part is there and its sha256 (exit 3: a part is missing, i.e. the machine went
#      cold between calls or a call was skipped: stage again from the first part; exit 4: bad sha256),
#   2. unpacks once to STAGE_DIR/site (+ STAGE_DIR/model/<name> if a model was packed), then drops the parts,
#   3. writes STAGE_DIR/env.sh (PYTHONPATH, offline switches, VLLM_USE_FLASHINFER_SAMPLER=0) and prints it,
#   4. import check, GE_CHECK_S seconds (default 20): import torch, vllm; torch.cuda.get_device_capability();
#      then a CuTe DSL import (reported, not fatal),
#   5. sampler check: vLLM 0.32's sampler imports flashinfer unless VLLM_USE_FLASHINFER_SAMPLER=0; if the
#      check still reaches that import, patch_sampler.py edits the unpacked vLLM file (GE_PATCH_SAMPLER=1
#      forces the patch, =0 forbids it).
# Run it again at any time in the same machine: the unpack is skipped when done. GE_CHECKS=0 stops after
# step 3 (unpack + env.sh), so that a caller can start work that needs only the unpacked tree (qgate's
# calls/10-install.sh writes the production-shape checkpoint) while a second run does the checks.
# Later commands in the same warm machine:  source STAGE_DIR/env.sh && python3 STAGE_DIR/smoke.py ...
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 STAGE_DIR" >&2; exit 2; }
S=$(cd "$1" 2>/dev/null && pwd) || { echo "MISSING: $1 (the machine is not the one the parts were staged on)"; exit 3; }
PY=${PYTHON:-python3}
CHECK_S=${GE_CHECK_S:-20}
T0=$(date +%s)
say() { echo "[device_install +$(( $(date +%s) - T0 ))s] $*"; }
cd "$S" || exit 3

if [ -f site/GE_PAYLOAD.txt ] && [ -f .unpacked ] && cmp -s .unpacked SHA256SUMS; then
  say "already unpacked in $S"
else
  [ -f SHA256SUMS ] || { echo "MISSING: $S/SHA256SUMS: stage again from the first part"; exit 3; }
  miss=0
  while read -r _ p; do [ -f "$p" ] || { echo "MISSING: $p"; miss=1; }; done < SHA256SUMS
  [ $miss = 0 ] || { echo "parts missing (machine went cold between calls?): stage again from the first part"; exit 3; }
  sha256sum -c --quiet SHA256SUMS || { echo "sha256 mismatch: stage the bad part again"; exit 4; }
  say "sha256 ok ($(wc -l < SHA256SUMS) parts); unpacking"
  rm -rf site model .unpacked
  parts=$(awk '{print $2}' SHA256SUMS | sort)
  if command -v xz >/dev/null; then
    # shellcheck disable=SC2086
    cat $parts | xz -dc -T0 | tar -xf - || { echo "unpack failed"; exit 5; }
  else
    # shellcheck disable=SC2086
    cat $parts | "$PY" -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('.')" \
      || { echo "unpack failed"; exit 5; }
  fi
  cp SHA256SUMS .unpacked
  # shellcheck disable=SC2086
  rm -f $parts
  say "unpacked: site $(du -sh site | cut -f1)$( [ -d model ] && echo ", model/: $(ls model | tr '\n' ' ')")"
fi

cat > "$S/env.sh" <<EOF
# source this before using vLLM from the payload (written by device_install.sh)
export PYTHONPATH=$S/site:$S/site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not in the payload
EOF
echo "---- env to use (also in $S/env.sh):"; cat "$S/env.sh"; echo "----"
# shellcheck disable=SC1091
source "$S/env.sh"
[ "${GE_CHECKS:-1}" = 0 ] && { say "unpacked; checks left to the next run (GE_CHECKS=0)"; exit 0; }

say "import check (limit ${CHECK_S} s)"
timeout "$CHECK_S" "$PY" - <<'PY'
import time
t = time.time()
import torch, vllm
cap = torch.cuda.get_device_capability()
import triton, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "| triton", triton.__version__,
      "| transformers", transformers.__version__, "| vllm", vllm.__version__, "from", vllm.__file__)
print("device", torch.cuda.get_device_name(0), "capability", cap, "| import", round(time.time() - t, 1), "s")
PY
rc=$?
if [ $rc = 124 ]; then
  echo "import check: timed out after ${CHECK_S} s (a first import compiles .pyc files; try GE_CHECK_S=60)"; exit 6
elif [ $rc != 0 ]; then
  echo "import check failed (rc $rc)"; exit 6
fi

say "CuTe DSL check (needed for Qwen4Exp's HC on SM90; not fatal here)"
timeout 60 "$PY" -c "
import importlib.metadata as md
import cutlass, cutlass.cute, quack  # noqa: F401
print('nvidia-cutlass-dsl', md.version('nvidia-cutlass-dsl'), '| libs-cu13', md.version('nvidia-cutlass-dsl-libs-cu13'),
      '| quack-kernels', md.version('quack-kernels'), '| apache-tvm-ffi', md.version('apache-tvm-ffi'))" 2>&1 | tail -n 3 \
  || echo "CuTe DSL import failed: Qwen4Exp's HC down projection will fail on SM90 (see above)"

if [ "${GE_PATCH_SAMPLER:-}" = 1 ]; then
  "$PY" "$S/patch_sampler.py" "$S/site"
elif [ "${GE_PATCH_SAMPLER:-}" != 0 ]; then
  say "sampler check (VLLM_USE_FLASHINFER_SAMPLER=0)"
  out=$(timeout 90 "$PY" -c "
from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sampler_supported
print('flashinfer sampler used:', flashinfer_sampler_supported())" 2>&1)
  rc=$?
  echo "$out" | tail -n 3
  if [ $rc != 0 ] && echo "$out" | grep -q "No module named 'flashinfer'"; then
    say "the env var did not avoid the flashinfer import: patching the unpacked vLLM"
    "$PY" "$S/patch_sampler.py" "$S/site" || exit 7
  elif [ $rc != 0 ]; then
    echo "sampler check failed (rc $rc); see above"; exit 7
  fi
fi
say "ok. Next, in this warm machine: source $S/env.sh && python3 $S/smoke.py MODEL_DIR [--dtype bfloat16] [--eager]"
