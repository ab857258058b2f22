"""qgate as a user installs it: its wheel built from a copy of the sources, installed in a fresh venv
outside the checkout, run from there.

    python tools/wheel_venv.py --demo      # .ci/run: `qgate demo` to a verdict (minutes of engine time)

tests/test_wheel.py builds the same venv (without kernels_ext) and runs `qgate contract validate` on a
shipped contract, `qgate demo --help` and the faulty demo's plan.

The venv takes qgate's dependencies (vLLM and torch among them) from the interpreter that runs this (the
nox venv) through a .pth line naming its site-packages, so nothing is downloaded or reinstalled.
`venv --system-site-packages` would not do it: a venv's system is the base interpreter, not the venv it
was made from. Python runs only the .pth files of a site directory, not of a folder a .pth names, so the
nox venv's editable qgate (a .pth of its own) stays out: qgate is imported from the wheel.

kernels_ext (the route plugin vLLM loads, and the routes' kernels) is a distribution of its own: the
demo's venv gets its wheel too, built here from a copy of kernels_ext/ against the running torch (no
build isolation; the C++ CPU kernels compile, ~1 min), as a user would `pip install` both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What qgate's wheel is built from: its package data are links into contracts/ and tests/fixtures/.
QGATE_SOURCES = ("pyproject.toml", "harness", "route_env", "contracts", "tests/fixtures")
SKIP = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so", "*.pyc")
# A verdict the demo reached (0 PASS, 1 FAIL, 4 INCONCLUSIVE); 3 (ERROR: a gate could not be judged,
# e.g. a file the wheel lacks) and 2 (bad input) are what this check is for.
VERDICT_OK = {0, 1, 4}


def copy_sources(dest: Path, parts: tuple[str, ...] = QGATE_SOURCES) -> Path:
    """The parts of the checkout a build reads, copied (links kept) to dest: the build's own build/."""
    for part in parts:
        src, out = REPO / part, dest / part
        if src.is_dir():
            shutil.copytree(src, out, symlinks=True, ignore=SKIP)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
    return dest


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project at `source`, built with the running interpreter's setuptools (and torch)."""
    before = set(out.glob("*.whl"))
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ]
    )
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def make_venv(dest: Path, wheels: list[Path]) -> Path:
    """A fresh venv at dest holding `wheels`, its dependencies read from this interpreter's site-packages;
    returns its bin folder."""
    run([sys.executable, "-m", "venv", "--without-pip", str(dest)])
    python = dest / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_deps_from_nox_venv.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            *map(str, wheels),
        ]
    )
    return dest / "bin"


def venv_env(bin_dir: Path) -> dict[str, str]:
    """The environment a user of the venv has: its bin first, no PYTHONPATH into a checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def demo(work: Path) -> int:
    """Both wheels in a fresh venv under `work`, then `qgate demo` from there: its verdict and time."""
    t0 = time.perf_counter()
    src = copy_sources(work / "src")
    shutil.copytree(REPO / "kernels_ext", src / "kernels_ext", symlinks=True, ignore=SKIP)
    wheels = [build_wheel(src, work / "wheels"), build_wheel(src / "kernels_ext", work / "wheels")]
    bin_dir = make_venv(work / "venv", wheels)
    built = time.perf_counter() - t0
    env = venv_env(bin_dir)
    # The frozen GSM8K items: the caller's file, else the one beside the checkout (as noxfile.py says).
    env.setdefault("QGATE_GSM8K_PATH", str(REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"))
    t1 = time.perf_counter()
    proc = subprocess.run([str(bin_dir / "qgate"), "demo", "--out", str(work / "demo")], cwd=work, env=env)
    seconds = time.perf_counter() - t1
    summary = work / "demo" / "summary.json"
    verdict = json.loads(summary.read_text())["verdict"] if summary.is_file() else None
    print(
        f"wheel demo: {verdict} (exit {proc.returncode}) in {seconds:.0f} s, "
        f"wheels and venv {built:.0f} s: {', '.join(w.name for w in wheels)}; {summary}"
    )
    return 0 if verdict is not None and proc.returncode in VERDICT_OK else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="run `qgate demo` from the installed wheels")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    args = parser.parse_args()
    if not args.demo:
        parser.error("nothing to do: --demo")
    work = Path(tempfile.mkdtemp(prefix="qgate-wheel-"))
    try:
        return demo(work)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
