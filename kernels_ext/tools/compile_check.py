"""Compile every CUDA source of kernels_ext for sm_70 and sm_90 and fail on an error or a register spill.

sm_70 (V100) needs a CUDA toolkit that still targets it: CUDA 13 has dropped sm_70, so this uses
Debian's CUDA 11.8 (`bash .ci/install_cuda118.sh`), whose own bin directory and /usr/bin (where
Debian puts its ptxas) must come first in PATH, or CUDA 13's ptxas is picked and rejects sm_70.
sm_90 (H100/H200) uses the machine's nvcc (CUDA 12.x or 13). Each .cu in csrc/ compiles alone (no
torch headers), with -Xptxas -v; the report lists every kernel's registers, stack frame and spills.

Usage: python kernels_ext/tools/compile_check.py [--arch 70 --arch 90] [--json FILE] [--skip-missing]
Exit status: 0 all compiled without spills (or, with --skip-missing, every missing toolkit skipped),
1 an error or a spill, 2 a required toolkit is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
DEBIAN_CUDA118_BIN = Path("/usr/lib/nvidia-cuda-toolkit/bin")
FLAGS = ["-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v"]

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


@dataclass
class Kernel:
    name: str
    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0


@dataclass
class Unit:
    source: str
    arch: str
    nvcc: str
    ok: bool
    error: str = ""
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def spills(self) -> list[Kernel]:
        return [k for k in self.kernels if k.spill_store_bytes or k.spill_load_bytes]


def _toolchain(arch: str) -> tuple[str, dict[str, str]] | None:
    """The nvcc for this arch and the environment to run it in; None when not installed."""
    env = dict(os.environ)
    if arch == "70":
        nvcc = os.environ.get("QGATE_NVCC_SM70", str(DEBIAN_CUDA118_BIN / "nvcc"))
        if not Path(nvcc).exists():
            return None
        # The 11.8 toolkit's ptxas is /usr/bin/ptxas on Debian: put it ahead of any CUDA 13 one.
        env["PATH"] = os.pathsep.join([str(Path(nvcc).parent), "/usr/bin", env.get("PATH", "")])
        return nvcc, env
    nvcc = os.environ.get("QGATE_NVCC_SM90") or shutil.which("nvcc")
    if nvcc is None:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        nvcc = str(Path(cuda_home) / "bin" / "nvcc") if (Path(cuda_home) / "bin" / "nvcc").exists() else None
    return (nvcc, env) if nvcc else None


def parse_ptxas(text: str) -> list[Kernel]:
    """Kernels named in ptxas -v output, with their resource lines."""
    kernels: list[Kernel] = []
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            kernels.append(Kernel(name=m.group(1)))
        elif kernels and (m := _STACK.search(line)):
            kernels[-1].stack_bytes, kernels[-1].spill_store_bytes, kernels[-1].spill_load_bytes = map(
                int, m.groups()
            )
        elif kernels and (m := _REGS.search(line)):
            kernels[-1].registers = int(m.group(1))
    return kernels


def compile_unit(source: Path, arch: str, nvcc: str, env: dict[str, str], outdir: Path) -> Unit:
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    cmd = [
        nvcc,
        *FLAGS,
        gencode,
        "-I",
        str(CSRC),
        "-c",
        str(source),
        "-o",
        str(outdir / f"{source.stem}.sm{arch}.o"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    text = proc.stdout + proc.stderr
    unit = Unit(
        source=source.name, arch=f"sm_{arch}", nvcc=nvcc, ok=proc.returncode == 0, kernels=parse_ptxas(text)
    )
    if not unit.ok:
        errors = [ln for ln in text.splitlines() if "error" in ln.lower()] or text.splitlines()[-5:]
        unit.error = "\n".join(errors[:20])
    return unit


def run(archs: list[str], jobs: int = 1) -> tuple[list[Unit], list[str]]:
    """Compile every csrc/*.cu for each arch, `jobs` nvcc at a time (units in arch, then file, order);
    also returns the archs whose toolkit is missing."""
    tasks: list[tuple] = []  # (source, arch, nvcc, env): compile_unit's arguments before outdir
    missing: list[str] = []
    sources = sorted(CSRC.glob("*.cu"))
    for arch in archs:
        chain = _toolchain(arch)
        if chain is None:
            missing.append(f"sm_{arch}")
            continue
        tasks.extend((src, arch, *chain) for src in sources)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        units = list(pool.map(lambda task: compile_unit(*task, Path(tmp)), tasks))
    return units, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", choices=["70", "90"], help="repeatable; default 70 and 90")
    parser.add_argument("--json", type=Path, help="write the full report here")
    parser.add_argument(
        "--skip-missing", action="store_true", help="skip an arch whose toolkit is not installed"
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="nvcc processes at a time (default: the cores)"
    )
    args = parser.parse_args(argv)
    units, missing = run(args.arch or ["70", "90"], args.jobs)
    bad = 0
    for u in units:
        worst = max((k.registers for k in u.kernels), default=0)
        status = "ok" if u.ok and not u.spills else ("SPILL" if u.ok else "ERROR")
        print(f"{u.arch:6} {u.source:16} {status:6} kernels={len(u.kernels):2} max_registers={worst}")
        if not u.ok:
            print("    " + u.error.replace("\n", "\n    "))
        for k in u.spills:
            print(f"    spill in {k.name}: {k.spill_store_bytes} B stored, {k.spill_load_bytes} B loaded")
        bad += (not u.ok) or bool(u.spills)
    if args.json:
        args.json.write_text(json.dumps([asdict(u) for u in units], indent=2) + "\n")
    if missing:
        hint = "sm_70 needs CUDA 11.8: bash .ci/install_cuda118.sh (apt, root); then nox -s kernels"
        word = "skipped" if args.skip_missing else "missing"
        print(f"compile_check: {', '.join(missing)} {word}: no toolkit ({hint})", file=sys.stderr)
        if not args.skip_missing:
            return 2
    if not units:
        if missing and args.skip_missing:
            return 0  # nothing here to compile with, and the caller asked to skip: said above
        print("compile_check: nothing compiled", file=sys.stderr)
        return 1
    print(f"compile_check: {len(units)} units, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
