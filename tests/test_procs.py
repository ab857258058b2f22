"""Process bookkeeping without vLLM: the parent-death line, run tokens in /proc, the run record, signals.

Every process these tests start is a short python that they end themselves; none touches another's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, small_contract

from qgate.engine import lifeline, procs
from qgate.errors import QgateError

# A parent that arms itself, forks a child (armed by the at-fork hook), prints both pids, then sleeps.
_CHAIN = """
import os, sys, time
from qgate.engine import lifeline
lifeline.arm()
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), pid, flush=True)
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pid files go to a cache of this test's own, not the user's."""
    monkeypatch.setenv("QGATE_CACHE", str(tmp_path / "cache"))


def _python(code: str, env: dict[str, str], **kw: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env}, cwd=REPO, **kw)


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if procs.start_ticks(pid) is None:  # exited (a zombie counts as exited)
            return True
        time.sleep(0.02)
    return False


def test_a_fork_dies_with_its_parent_sigkill_included() -> None:
    parent = _python(_CHAIN, {lifeline.LIFELINE_ENV: str(os.getpid())}, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    ppid, child = map(int, parent.stdout.readline().split())
    assert ppid == parent.pid and procs.start_ticks(child) is not None
    parent.kill()
    parent.wait()
    assert _gone(child, 2.0), "the forked child outlived its SIGKILLed parent"


def test_without_the_env_nothing_is_armed() -> None:
    env = {k: v for k, v in os.environ.items() if k != lifeline.LIFELINE_ENV}
    parent = subprocess.Popen([sys.executable, "-c", _CHAIN], env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    _, child = map(int, parent.stdout.readline().split())
    parent.kill()
    parent.wait()
    try:
        assert not _gone(child, 0.5)  # the test above can fail: without the line, the orphan lives
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_process_whose_parent_is_already_gone_ends_itself() -> None:
    # The named parent is not this process's parent: it died before the signal could be armed.
    proc = _python("from qgate.engine import lifeline; lifeline.arm(); print('alive')", {
        lifeline.LIFELINE_ENV: "1"}, stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL and out == ""


def test_stop_signals_raise_stopped_once_with_the_exit_code() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(procs.Stopped) as info, procs.stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert (info.value.exit_code, info.value.signal_name) == (143, "SIGTERM")
    assert isinstance(info.value, KeyboardInterrupt)
    with pytest.raises(procs.Stopped) as info, procs.stop_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert info.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) == before  # restored


@pytest.fixture
def leftover(tmp_path: Path):
    """A run record in tmp_path and a live process carrying its token (its qgate: this test)."""
    out = tmp_path / "out"
    with procs.claimed(out) as record:
        # Nothing is recorded before an engine child starts (the folder holds only its writer lock).
        assert not (out / procs.RECORD).exists()
        record.add_group(os.getpid(), "test")
    proc = _python("import time; time.sleep(60)", {procs.RUN_ENV: record.token})
    deadline = time.monotonic() + 10
    while proc.pid not in procs.run_processes(record.token) and time.monotonic() < deadline:
        time.sleep(0.02)  # the token shows in /proc/PID/environ once the exec is done
    yield out, proc
    proc.kill()
    proc.wait()


def test_a_live_process_of_a_run_in_progress_is_refused_with_its_pid(leftover) -> None:
    # Its qgate (this test) is alive: a run in progress, not an earlier run's leftovers, and
    # --kill-leftovers (which would end it) is not suggested (issue 30).
    out, proc = leftover
    with pytest.raises(
        QgateError, match=rf"another run is in progress there .*{proc.pid} \(.*python"
    ) as info:
        with procs.claimed(out):
            pass
    assert "--kill-leftovers" not in str(info.value) and f"kill {os.getpid()}" in str(info.value)
    assert procs.earlier_run(out) is not None


def test_a_live_orphan_of_an_earlier_run_is_refused_with_kill_leftovers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    token = "999999999.1.deadbeef"  # its qgate is gone
    record = {
        "kind": "processes", "schema_version": procs.RECORD_SCHEMA_VERSION, "token": token,
        "qgate_pid": 999999999, "host": socket.gethostname(), "boot_id": procs._boot_id(), "groups": [],
    }  # fmt: skip
    (out / procs.RECORD).write_text(json.dumps(record))
    orphan = _python("import time; time.sleep(60)", {procs.RUN_ENV: token})
    try:
        deadline = time.monotonic() + 10
        while orphan.pid not in procs.run_processes(token) and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(
            QgateError, match=rf"earlier run are still alive: {orphan.pid} .*--kill-leftovers"
        ):
            with procs.claimed(out):
                pass
    finally:
        orphan.kill()
        orphan.wait()


def test_kill_leftovers_ends_them_and_records_the_new_run(leftover) -> None:
    out, proc = leftover
    with procs.claimed(out, kill_leftovers=True) as record:
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert procs.active() is record
        record.add_group(12345, "test")
    assert procs.active() is None
    data = json.loads((out / procs.RECORD).read_text())
    assert data["token"] == record.token and data["qgate_pid"] == os.getpid()
    assert procs.earlier_run(out) is None


def test_cli_leftovers_lists_and_kills_a_recorded_run(leftover) -> None:
    from typer.testing import CliRunner

    from qgate.cli import app

    out, proc = leftover
    listed = CliRunner().invoke(app, ["run", "leftovers", "--out", str(out)])
    assert listed.exit_code == 1 and f"alive: {proc.pid} (" in listed.output
    killed = CliRunner().invoke(app, ["run", "leftovers", "--out", str(out), "--kill"])
    assert killed.exit_code == 0, killed.output
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_a_process_that_ignores_sigterm_gets_sigkill() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    proc = _python(code + "time.sleep(60)", {}, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()
    assert procs.end([proc.pid], grace=0.3) == []
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_a_record_that_is_not_one_is_one_line(tmp_path: Path) -> None:
    (tmp_path / procs.RECORD).write_text("{")
    with pytest.raises(QgateError, match="not a process record"):
        procs.earlier_run(tmp_path)
    (tmp_path / procs.RECORD).write_text(json.dumps({"kind": "processes", "token": "x", "schema_version": 9}))
    with pytest.raises(QgateError, match="schema_version = 9"):
        procs.earlier_run(tmp_path)


def test_a_record_from_another_boot_has_nothing_alive(tmp_path: Path) -> None:
    with procs.claimed(tmp_path) as record:
        record.add_group(os.getpid(), "test")
    assert procs.earlier_run(tmp_path) is None  # nothing of it is alive (this test is not a child)
    data = {**record.data, "boot_id": "another-boot"}
    (tmp_path / procs.RECORD).write_text(json.dumps(data))
    assert procs.earlier_run(tmp_path) is None


def test_run_speed_refuses_a_live_earlier_run_in_one_line(leftover, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from qgate.cli import app

    out, proc = leftover
    contract = small_contract(tmp_path)
    args = ["run", "speed", "--contract", str(contract), "--out", str(out), "--resume"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]  # (the progress bar's blank line)
    assert len(lines) == 1 and lines[0].startswith(f"qgate: error: {out}: another run is in progress")
    assert f"{proc.pid} (" in res.output
    assert not (out / "speed").exists()  # refused before anything ran


def test_cli_leftovers_lists_an_orphan_of_a_dead_qgate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from qgate.cli import app

    # The token names a qgate that is gone (no such pid): its processes are orphans.
    orphan = _python("import time; time.sleep(60)", {procs.RUN_ENV: "999999999.1.deadbeef"})
    try:
        deadline = time.monotonic() + 10
        while orphan.pid not in procs.leftovers(orphans_only=True) and time.monotonic() < deadline:
            time.sleep(0.02)
        listed = CliRunner().invoke(app, ["run", "leftovers"])  # listing only: other runs are not touched
        assert listed.exit_code == 1 and f"alive: {orphan.pid} (" in listed.output
    finally:
        orphan.kill()
        orphan.wait()


def test_run_quality_refuses_a_live_earlier_run_in_one_line(leftover) -> None:
    from typer.testing import CliRunner

    from qgate.cli import app

    out, proc = leftover
    contract = REPO / "contracts" / "quality-cpu.yaml"
    res = CliRunner().invoke(app, ["run", "quality", "--contract", str(contract), "--out", str(out)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{proc.pid} (" in lines[0] and "in progress" in lines[0]
    assert not (out / "quality").exists()
