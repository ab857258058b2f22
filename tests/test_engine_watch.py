"""The engine watch (qgate.engine.watch) without an engine: real processes standing in for the child
and for a vLLM process of its group (named as vLLM names them), a real pipe. The kill of a real
EngineCore is test_stop_signals.py's kill-engine-core stage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from qgate.engine import launcher, preflight
from qgate.engine.watch import VLLM_NAME_PREFIX, EngineWatch, read_records
from qgate_route_env import ARM_ENV_PREFIXES


def _group_with_vllm_process() -> subprocess.Popen:
    """A 'child' leading its own group, with a member named like a vLLM process (`exec -a`); like
    vLLM's engine child, it outlives that member (`wait; sleep`)."""
    return subprocess.Popen(
        ["bash", "-c", f"exec -a {VLLM_NAME_PREFIX}EngineCore sleep 60 & wait; sleep 60"],
        start_new_session=True,
    )


def _member(pgid: int, name: str) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    cmd = open(f"/proc/{entry.name}/cmdline", "rb").read().decode(errors="replace")
                    stat = open(f"/proc/{entry.name}/stat").read()
                except OSError:
                    continue
                if cmd.startswith(name) and int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                    return int(entry.name)
        time.sleep(0.02)
    raise AssertionError(f"no {name} in group {pgid}")


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextlib.contextmanager
def _watched(
    event: str,
) -> Iterator[tuple[subprocess.Popen, int, EngineWatch, Iterator[str], Callable[[], None]]]:
    """A group with a vLLM-named member, a watch on it, and a pipe whose first record (`event`) has
    been read and seen, as the launcher does with every record; yields (child, member, watch, the
    records still to come, a closer of the pipe's write end)."""
    proc = _group_with_vllm_process()
    read_fd, write_fd = os.pipe()
    closed: list[bool] = []

    def close_write() -> None:
        if not closed:
            os.close(write_fd)
            closed.append(True)

    try:
        core = _member(proc.pid, f"{VLLM_NAME_PREFIX}EngineCore")
        watch = EngineWatch(proc, stall_timeout_s=None)
        line = json.dumps({"event": event})
        os.write(write_fd, line.encode() + b"\n")
        records = read_records(read_fd, watch)
        assert next(records) == line
        watch.saw({"event": event})
        yield proc, core, watch, records, close_write
    finally:
        os.close(read_fd)
        close_write()
        _end(proc)


def test_a_vllm_process_that_dies_ends_the_reading_with_its_name() -> None:
    with _watched("engine_ready") as (_, core, watch, records, _):
        os.kill(core, signal.SIGKILL)
        t0 = time.monotonic()
        assert list(records) == []  # the write end is still open: only the watch can end this
        assert time.monotonic() - t0 < 5
        assert watch.death is not None
        assert f"{VLLM_NAME_PREFIX}EngineCore (pid {core})" in watch.death, watch.death


def test_a_killed_child_is_the_cause_not_its_vllm_process_that_died_with_it() -> None:
    # CI, stop 33: the kill-child stage named VLLM::EngineCore (killed by its parent-death signal the
    # moment the child was killed) when the poll saw it before the child could be reaped.
    with _watched("engine_ready") as (proc, core, watch, records, _):
        # The core seen dead first, the child reaped 0.3 s later (the real race: the parent-death signal
        # comes when the child's thread exits, the child is reaped when all of its threads have).
        os.kill(core, signal.SIGKILL)
        threading.Timer(0.3, os.kill, (proc.pid, signal.SIGKILL)).start()
        assert list(records) == []
        assert watch.death is None and watch.child_gone() and proc.returncode == -signal.SIGKILL


def test_a_vllm_process_ending_after_done_is_the_shutdown() -> None:
    with _watched("done") as (_, core, watch, records, close_write):
        os.kill(core, signal.SIGKILL)
        close_write()
        assert list(records) == [] and watch.death is None


def test_no_record_for_the_stall_timeout_is_a_stall() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    read_fd, write_fd = os.pipe()
    try:
        watch = EngineWatch(proc, stall_timeout_s=0.5)
        t0 = time.monotonic()
        assert list(read_records(read_fd, watch)) == []
        assert 0.5 <= time.monotonic() - t0 < 3
        assert watch.death is not None and "stalled" in watch.death and "stall_timeout_s" in watch.death
    finally:
        os.close(read_fd)
        os.close(write_fd)
        _end(proc)


def test_a_child_gone_with_its_pipe_held_open_ends_the_reading_after_its_records() -> None:
    # A vLLM process forked from the child (the GPU's fork start) inherits the write end of the pipe:
    # the child's exit then brings no end of file. Its last records are still read.
    proc = subprocess.Popen(["true"], start_new_session=True)
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b'{"event": "rep"}\n{"event": "to')
        watch = EngineWatch(proc, stall_timeout_s=None)
        assert list(read_records(read_fd, watch)) == ['{"event": "rep"}']  # the torn line is dropped
        assert watch.death is None and watch.child_gone()
    finally:
        os.close(read_fd)
        os.close(write_fd)
        _end(proc)


def test_the_launcher_drops_every_qgate_and_sm70_variable_the_arm_does_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 30, defect 2: QGATE_HC_PHASE_STOP and the kernels' other knobs reached both engines unrecorded.
    shell = {
        "QGATE_HC_PHASE_STOP": "2",
        "QGATE_HC_IMPL": "v3",
        "QGATE_TOPK_IMPL": "a",
        "QGATE_GEMV_IMPL": "b",
        "QGATE_CPU_ISA": "avx2",
        "QGATE_ROUTE_IMPL_FP16_GEMV": "m:f",
        "VLLM_SM70_ANYTHING": "1",
        "QGATE_KEPT_BY_ARM": "x",
        "OMP_NUM_THREADS": "3",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "UNRELATED_VAR": "1",
    }
    for key, value in shell.items():
        monkeypatch.setenv(key, value)
    arm = {"QGATE_KEPT_BY_ARM": "y", "VLLM_SM70_QWEN38_FP16_GEMV": "1"}
    built = preflight.arm_env("candidate", arm, os.environ)
    env, dropped = launcher.child_env(built, None), built.dropped
    assert set(dropped) >= {k for k in shell if k.startswith(ARM_ENV_PREFIXES)} - set(arm)
    assert "QGATE_KEPT_BY_ARM" not in dropped and env["QGATE_KEPT_BY_ARM"] == "y"
    assert not any(k.startswith(ARM_ENV_PREFIXES) and k not in arm for k in shell if k in env)
    recorded = built.inherited
    assert recorded["OMP_NUM_THREADS"] == "3" and recorded["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "UNRELATED_VAR" not in recorded and not any(k.startswith(ARM_ENV_PREFIXES) for k in recorded)
