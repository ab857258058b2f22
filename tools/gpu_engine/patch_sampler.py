"""Fallback for the flashinfer sampler import in vLLM 0.32.0 (used by device_install.sh only when
VLLM_USE_FLASHINFER_SAMPLER=0 does not avoid it).

vLLM 0.32's Sampler calls flashinfer_sampler_supported() (vllm/v1/sample/ops/topk_topp_sampler.py), which
imports vLLM's FlashInfer attention backend and so `flashinfer`, which the payload does not carry: every
engine start then dies in load_model with `ModuleNotFoundError: No module named 'flashinfer'`. This edits
the unpacked file so that the function returns False (vLLM's own sampler) when flashinfer is not
importable. Idempotent.

    python3 patch_sampler.py SITE_DIR
"""

import re
import sys

MARK = "_ge_no_flashinfer"
path = f"{sys.argv[1]}/vllm/v1/sample/ops/topk_topp_sampler.py"
src = open(path).read()
if MARK in src:
    print("sampler: already patched", path)
    sys.exit(0)
m = re.search(r"^( +)from vllm\.v1\.attention\.backends\.flashinfer import FlashInferBackend$", src, re.M)
if m is None:
    sys.exit(f"sampler: anchor line not found in {path} (not vLLM 0.32.0?); nothing changed")
ind = m.group(1)
guard = (
    f"{ind}import importlib.util as {MARK}\n"
    f'{ind}if {MARK}.find_spec("flashinfer") is None:  # payload patch: flashinfer not installed\n'
    f"{ind}    return False\n"
)
open(path, "w").write(src[: m.start()] + guard + src[m.start() :])
print("sampler: patched", path)
