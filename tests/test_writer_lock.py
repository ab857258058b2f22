"""One writer per output folder, and stops before a command's own handling (issue 63).

A second `compare` or `run` into a folder another qgate process writes is refused in one line naming
the folder and that process's pid (qgate.writer_lock); the lock goes with its holder, even a SIGKILLed
one. SIGINT / SIGTERM while `qgate` is still importing its modules end it in one line, 130 / 143
(qgate.entry), not a KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import comparable
from qgate.cli import app
from qgate.engine import procs
from qgate.writer_lock import FolderBusy, one_writer

runner = CliRunner()
HOLD = (
    "import sys, time\n"
    "from qgate.writer_lock import one_writer\n"
    "with one_writer(sys.argv[1], 'qgate compare'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(60)\n"
)


@pytest.fixture
def holder(tmp_path: Path):
    """Another process holding tmp_path/out as `qgate compare` does."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield out, proc
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(holder, tmp_path: Path, monkeypatch) -> None:
    out, proc = holder
    monkeypatch.setattr(comparable, "routes", support.standin_routes())
    ctrl, cand, _ = support.written_pair(tmp_path)
    args = ["compare", str(ctrl), str(cand), "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and f"{out}: another qgate writes there (pid {proc.pid}" in res.output
    assert not (out / "verdict.json").exists()
    with pytest.raises(FolderBusy, match=f"pid {proc.pid}"):  # a run's claim of the folder too
        with procs.claimed(out):
            pass
    proc.kill()  # the lock dies with its holder: nothing to clear by hand
    proc.wait()
    with one_writer(out, "qgate compare"):
        assert not (out / "verdict.json").exists()


def test_one_process_may_hold_a_folder_twice(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with one_writer(out, "qgate ablate"), procs.claimed(out, command="qgate run"):
        pass
    with one_writer(out, "qgate compare"):  # released: taken again
        pass


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Python has none until qgate.entry sets one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_qgate_imports_is_one_line(tmp_path: Path, signum: int) -> None:
    args = [sys.executable, "-m", "qgate", "compare", "a.json", "b.json", "--out", str(tmp_path / "o")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signum)  # qgate.cli's imports take ~1 s on 2 cores: this lands in them
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err == f"qgate: stopped by {signal.Signals(signum).name}\n", err


# A stop raised inside a callback (here a weakref's; in the suite, importlib's module-lock cleanup during
# `qgate compare`'s imports, 6 Dec 2026) cannot leave it: Python printed "Exception ignored", went on,
# and the command ended with its own exit 2. The stop must end the process there, in one line.
IGNORED_STOP = """
import signal, weakref
from qgate import entry
entry.install()
class Held:
    pass
held = Held()
ref = weakref.ref(held, lambda _: entry.stop_line(signal.SIGTERM))
del held
print("went on")
"""


def test_a_stop_raised_where_python_ignores_exceptions_still_stops() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", IGNORED_STOP], capture_output=True, text=True, env=env, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (143, "", "qgate: stopped by SIGTERM\n")
