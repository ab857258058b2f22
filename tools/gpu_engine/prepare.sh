#!/usr/bin/env bash
# prepare.sh: everything the device calls carry, built here (no accelerator needed), from the checkout root.
#   1. the payload (make_payload.sh): vLLM 0.32.0's CUDA wheel unpacked --no-deps for the device image's
#      torch 2.11 + the packages it lacks + the CuTe DSL, xz-packed and split into .gpu-engine/call-NN
#      (one part a call; skipped when .gpu-engine/SHA256SUMS is there, GE_REBUILD=1 forces it);
#   2. .gpu-engine/extra/: the built-in models the H200 contracts name, built by qgate itself into a
#      QGATE_CACHE (tiny-qwen4exp; tiny-trained-wide, trained here on the frozen GSM8K items), and a copy
#      of the GSM8K test split (QGATE_GSM8K_PATH; never committed: .gpu-engine/ is git-ignored);
#   3. checks that each call's carry plus the checkout stays under the tool's 64 MiB, prints the plan.
# TP=2|4: also validates the production-shape contracts of that tensor parallel size here (the calls run
# them with the same TP; docs/gpu.md "Tensor parallel"), so a contract qgate refuses costs no device time.
# Needs the project's venv (qgate importable) and QGATE_GSM8K_PATH. The production-shape checkpoint is
# not built here: at 248,320 x 2560 it is gigabytes; calls/10-install.sh writes it on the device.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
GE=.gpu-engine
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpu-engine/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-engine/' >> "$EXCLUDE"
mkdir -p "$GE"  # a directory-only pattern matches an existing directory only (a fresh clone has none)
git check-ignore -q "$GE" || { echo "prepare: $GE is not ignored by git; refusing to build it here" >&2; exit 2; }
: "${QGATE_GSM8K_PATH:?set QGATE_GSM8K_PATH to the GSM8K test split (test.jsonl)}"

if [ "${GE_REBUILD:-0}" = 1 ] || [ ! -f "$GE/SHA256SUMS" ]; then
  nice -n 10 bash tools/gpu_engine/make_payload.sh "$GE"
fi
mkdir -p "$GE/extra/gsm8k"
cp "$QGATE_GSM8K_PATH" "$GE/extra/gsm8k/test.jsonl"
QGATE_CACHE=$PWD/$GE/extra/cache nice -n 10 python3 -c "
from pathlib import Path
from qgate.models import resolve_model
for spec in ('tiny-qwen4exp', 'tiny-trained-wide'):
    print(spec, resolve_model(spec, Path('$GE/extra/gsm8k/test.jsonl'))[0])
"
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
untracked=$(git ls-files -z -o --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -n 1 | cut -f1)
tree=$((tree + ${untracked:-0}))
limit=$((64 * 1024 * 1024))
echo "checkout that travels: $tree bytes"
for d in "$GE"/call-*; do
  n=$(du -sb "$d" | cut -f1); echo "  $(basename "$d"): $n bytes"
  [ $((n + tree)) -lt $limit ] || { echo "prepare: $d + checkout is over 64 MiB (rebuild with GE_PART_MIB=50)" >&2; exit 3; }
done
last=$(ls -d "$GE"/call-* | tail -n 1)
n=$(( $(du -sb "$last" | cut -f1) + $(du -sb "$GE/extra" | cut -f1) + tree ))
echo "  last part + extra + checkout: $n bytes"
[ $n -lt $limit ] || { echo "prepare: $last + extra is over 64 MiB" >&2; exit 3; }
if [ "${TP:-1}" != 1 ]; then
  for dt in bf16 fp16; do
    python3 -m qgate contract validate "contracts/qwen38-prodshape-$dt-tp$TP.yaml" || exit 2
  done
fi
echo "plan (docs/gpu.md): stage.sh for each part but the last, then calls/10-install.sh with the last part + extra${TP:+ (TP=$TP on every call, on a machine of $TP GPUs)}"
