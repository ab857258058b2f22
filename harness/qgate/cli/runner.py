"""`qgate check-runner`: can this runner's torch and nvcc run the GPU contracts? Wiring only
(qgate.runner_check decides). Exit 0 with one line of what it found, 2 with one line of what to install."""

from __future__ import annotations

import os

from qgate.cli._options import fail, say


def check_runner() -> None:
    """Check, before anything long, that torch has kernels for every GPU it will use (nvidia-smi,
    CUDA_VISIBLE_DEVICES) and that nvcc is of torch's CUDA major version."""
    from qgate import runner_check as rc

    try:
        smi = rc.run_tool(["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"])
        gpus = rc.gpus_from_smi(smi or "", os.environ.get("CUDA_VISIBLE_DEVICES"))
        nvcc_out = rc.run_tool(["nvcc", "--version"])
    except (RuntimeError, ValueError) as exc:
        fail(f"runner check: {exc}")
    if smi is None:
        fail("runner check: no nvidia-smi on PATH: this runner has no NVIDIA driver")
    import torch

    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)()  # the build's list, GPU or not
    arch_list = flags.split() if flags else list(torch.cuda.get_arch_list())
    nvcc = rc.nvcc_release(nvcc_out) if nvcc_out else None
    found = rc.problems(torch.__version__, torch.version.cuda, arch_list, gpus, nvcc)
    if found:
        fail("runner check: " + "; ".join(found))
    sms = ", ".join(sorted({g.sm for g in gpus}))
    say(
        f"runner ok: torch {torch.__version__} (CUDA {torch.version.cuda}) has kernels for {len(gpus)} "
        f"GPU(s) ({sms}); nvcc {nvcc}"
    )
