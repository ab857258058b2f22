"""Can this runner run the production contracts? Checked before anything long (the nightly's setup).

Two facts decide it: the installed torch has kernels for every GPU it will use, and nvcc (which builds
kernels_ext against that torch) is of torch's CUDA major version. A torch has kernels for a GPU of
compute capability X.Y when it was built with sm_XZ for some Z <= Y (a cubin runs on later minors of
its major) or with PTX compute_W for some W <= XY (the driver compiles it). The trap it catches:
`vllm==0.32.0` pins torch 2.13.0, built with CUDA 13, which dropped sm_70: on a V100 it installs an
engine that cannot run there, and a CUDA 12 nvcc would build kernels_ext for another CUDA than torch's.

`problems` is pure (facts in, lines out); `gpus_from_smi` and `nvcc_release` read the two commands'
output (tests give stand-ins); the CLI (`qgate check-runner`) gathers the facts from torch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

FIX = (
    "set QGATE_VLLM_SPEC to a vLLM + torch build with kernels for {arch} and the runner's CUDA "
    "(a V100, sm_70: CUDA 12.x, e.g. the team's fork's wheel; docs/nightly.md, 'A V100 runner')"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


def has_kernels(arch_list: list[str], capability: tuple[int, int]) -> bool:
    major, minor = capability
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch.strip())
        if not m:
            continue
        num, suffix = int(m.group(2)), m.group(3)
        a_major, a_minor = divmod(num, 10)
        if m.group(1) == "sm" and a_major == major and a_minor <= minor and not suffix:
            return True
        if m.group(1) == "compute" and not suffix and num <= major * 10 + minor:
            return True
    return False


def problems(
    torch_version: str, torch_cuda: str | None, arch_list: list[str], gpus: list[Gpu], nvcc: str | None
) -> list[str]:
    """What stops this runner, each a line that says what to install instead; empty when it can run."""
    if not gpus:
        return ["nvidia-smi lists no GPU: this runner cannot run the GPU contracts"]
    sms = ", ".join(sorted({g.sm for g in gpus}))
    if not torch_cuda:
        return [f"torch {torch_version} is a CPU build (no CUDA): " + FIX.format(arch=sms)]
    found = []
    missing = [g for g in gpus if not has_kernels(arch_list, g.capability)]
    if missing:
        which = ", ".join(f"GPU {g.index} {g.name} ({g.sm})" for g in missing)
        found.append(
            f"torch {torch_version} (CUDA {torch_cuda}) has no kernels for {which}; it has "
            f"{' '.join(arch_list) or 'none'}: " + FIX.format(arch=", ".join(sorted({g.sm for g in missing})))
        )
    t_major = torch_cuda.split(".")[0]
    if nvcc is None:
        found.append(
            f"no nvcc on PATH: install the CUDA {t_major}.x toolkit torch {torch_version} was built with"
        )
    elif nvcc.split(".")[0] != t_major:
        found.append(
            f"nvcc is CUDA {nvcc} but torch {torch_version} was built with CUDA {torch_cuda}: kernels_ext "
            f"must be built with torch's CUDA major: install the CUDA {t_major}.x toolkit, or a torch + "
            f"vLLM built for CUDA {nvcc.split('.')[0]} with {sms} kernels (QGATE_VLLM_SPEC)"
        )
    return found


def gpus_from_smi(output: str, visible: str | None = None) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader` -> the GPUs, only those in
    CUDA_VISIBLE_DEVICES (indices) when it is set."""
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not re.fullmatch(r"\d+\.\d+", parts[-1]):
            raise ValueError(f"nvidia-smi: cannot read the line {line!r}")
        major, minor = (int(x) for x in parts[-1].split("."))
        gpus.append(Gpu(int(parts[0]), ", ".join(parts[1:-1]), (major, minor)))
    if visible is not None and visible.strip() and all(v.strip().isdigit() for v in visible.split(",")):
        keep = {int(v) for v in visible.split(",")}
        gpus = [g for g in gpus if g.index in keep]
    return gpus


def nvcc_release(output: str) -> str | None:
    m = re.search(r"release (\d+\.\d+)", output)
    return m.group(1) if m else None


def run_tool(args: list[str]) -> str | None:
    """A tool's stdout, None when it is not there; a failing tool is a RuntimeError with its words."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return None
    if proc.returncode != 0:
        raise RuntimeError(
            f"{args[0]} failed (exit {proc.returncode}): {' '.join(proc.stderr.split())[:200]}"
        )
    return proc.stdout
