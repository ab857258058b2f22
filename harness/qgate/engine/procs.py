"""The processes a run starts: their record in the output folder, finding and ending leftovers, stops.

Every engine child qgate starts (and so every process vLLM starts under it, which inherit the
environment) carries `RUN_ENV=<token>`; the token names the qgate process that owns the run
(`<pid>.<start ticks>.<random>`), which tells an orphan (its qgate is gone) from a live run. Each of
them also lists itself in the run's pid file (`pids_file(token)`, per user, in the qgate cache):
vLLM renames its processes, which blanks what /proc shows of their environment. Together the two
make a run's processes findable whatever their parent or process group became.

`claimed(out_dir)` wraps a run: it refuses to start while processes of an earlier run recorded in
`out_dir/RECORD` are alive (or ends them when asked), then records this run there; the launcher adds
each engine child's process group as it starts.

`Stopped` is what SIGINT and SIGTERM raise in qgate (`stop_signals()`): the launcher ends the engine
child's group on the way out, the CLI prints what was kept and exits 128 + the signal number.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgate.engine.lifeline import start_ticks
from qgate.errors import QgateError
from qgate.launch_env import RUN_ENV
from qgate.paths import cache_root
from qgate.results import ResultError, atomic_write_json, current_schema, read_object, utc_now
from qgate.writer_lock import one_writer

RECORD = "processes.json"
MAX_RECORD_BYTES = 1024 * 1024  # a run's groups: some hundred bytes each
RECORD_SCHEMA_VERSION = current_schema("processes")
TERM_GRACE_S = 3.0  # SIGTERM first, SIGKILL for what is still there after this
KILL_WAIT_S = 5.0
DYING_WAIT_S = 5.0  # orphans of a just-killed run are dying (parent-death signal): give them this


# ---------------------------------------------------------------------------------------------------
# Stop signals


class Stopped(KeyboardInterrupt):
    """qgate got SIGINT or SIGTERM; a KeyboardInterrupt so every cleanup path treats both alike."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum
        self.signal_name = signal.Signals(signum).name


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Stopped in the main thread, once; later ones wait for that stop.

    Also a SIGINT that was ignored when qgate started (a background job of a script): a stop asked
    for explicitly must stop the run, and a run stopped this way leaves nothing behind.
    """
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return  # the stop in progress is bounded (TERM_GRACE_S + KILL_WAIT_S); don't break it
        fired.append(signum)
        raise Stopped(signum)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals as they are
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---------------------------------------------------------------------------------------------------
# /proc


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _run_token_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    prefix = RUN_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def describe(pid: int) -> str:
    """'PID (command)' for messages: vLLM names its processes (VLLM::EngineCore, VLLM::Worker)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = "?"
    cmd = cmd.strip() or "?"
    return f"{pid} ({cmd[:60]})"


@dataclass(frozen=True)
class Owner:
    """The qgate process named by a run token."""

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.start_ticks


def _owner(token: str) -> Owner | None:
    parts = token.split(".")
    try:
        return Owner(int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None


def pids_dir() -> Path:
    """Where runs list their processes: per user, outside any output folder (a nightly's folder may
    be wiped before the next night looks for leftovers)."""
    return cache_root() / "runs"


def pids_file(token: str) -> Path:
    return pids_dir() / f"{token}.pids"


def _listed(path: Path) -> list[int]:
    """The live processes a run's pid file lists (a pid whose start time differs was reused)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    live = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and start_ticks(int(parts[0])) == _int(parts[1]):
            live.append(int(parts[0]))
    return live


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def run_processes(token: str | None = None) -> dict[int, str]:
    """{pid: token} of the live processes of one run (token) or of every run this user started.

    Two sources: the pid files (vLLM's processes, whose environment /proc no longer shows once vLLM
    renames them) and RUN_ENV in /proc/PID/environ (processes that never armed, e.g. multiprocessing's
    resource tracker).
    """
    found: dict[int, str] = {}
    files = [pids_file(token)] if token else sorted(pids_dir().glob("*.pids"))
    for path in files:
        for pid in _listed(path):
            found[pid] = path.name[: -len(".pids")]
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        got = _run_token_of(pid)
        if got is not None and (token is None or got == token) and start_ticks(pid) is not None:
            found[pid] = got
    found.pop(me, None)
    return found


def prune() -> None:
    """Remove the pid files of runs that have nothing left alive, their qgate included."""
    for path in pids_dir().glob("*.pids"):
        owner = _owner(path.name[: -len(".pids")])
        if not _listed(path) and not (owner is not None and owner.alive()):
            path.unlink(missing_ok=True)


def leftovers(token: str | None = None, orphans_only: bool = False) -> list[int]:
    """Live processes of a qgate run: of one token (its owning qgate included), or of every run.

    `orphans_only`: only those whose owning qgate is gone (a live qgate's engine is not a leftover).
    """
    if token is None:
        prune()
    found = run_processes(token)
    owners = {t: _owner(t) for t in set(found.values()) | ({token} if token else set())}
    pids = set()
    for pid, t in found.items():
        owner = owners[t]
        if not (orphans_only and owner is not None and owner.alive()):
            pids.add(pid)
    if not orphans_only:
        pids |= {o.pid for o in owners.values() if o is not None and o.alive() and o.pid != os.getpid()}
    return sorted(pids)


def _alive(pids: list[int], since: dict[int, int | None]) -> list[int]:
    return [p for p in pids if since[p] is not None and start_ticks(p) == since[p]]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to timeout for pids to exit; returns those still alive (pid reuse is not mistaken)."""
    since = {p: start_ticks(p) for p in pids}
    deadline = time.monotonic() + timeout
    left = _alive(pids, since)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left, since)
    return left


def end(pids: list[int], grace: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after `grace` s for what is left; returns the pids still alive after that."""
    since = {p: start_ticks(p) for p in pids}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        for pid in _alive(pids, since):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        pids = wait_gone(_alive(pids, since), wait)
        if not pids:
            break
    return pids


# ---------------------------------------------------------------------------------------------------
# The run record


@dataclass
class RunRecord:
    """This run's entry in out_dir/RECORD: who owns it and the engine process groups it started."""

    path: Path
    token: str
    data: dict[str, Any] = field(default_factory=dict)

    def add_group(self, pgid: int, label: str) -> None:
        """Record an engine child's process group (its pid: the child leads its own group)."""
        now = utc_now()
        self.data["groups"].append({"pgid": pgid, "label": label, "started_at": now})
        atomic_write_json(self.path, self.data)


_active: RunRecord | None = None


def active() -> RunRecord | None:
    """The run in progress in this process (set by `claimed`), or None (a bare launcher call)."""
    return _active


def new_token() -> str:
    me = os.getpid()
    return f"{me}.{start_ticks(me)}.{secrets.token_hex(4)}"


def _load_record(path: Path) -> dict[str, Any]:
    try:  # a regular file of bounded size (results.read_object): a FIFO must not hang the run's start
        data = read_object(path, MAX_RECORD_BYTES).data
    except ResultError as exc:
        raise QgateError(f"{path}: not a process record ({exc}); remove it if no run uses it") from None
    if not isinstance(data, dict) or data.get("kind") != "processes" or "token" not in data:
        raise QgateError(f"{path}: not a process record; remove it if no run uses it")
    if data.get("schema_version") != RECORD_SCHEMA_VERSION:
        raise QgateError(f"{path}: schema_version = {data.get('schema_version')!r} is not one qgate knows")
    return data


def earlier_run(out_dir: Path) -> tuple[str, list[int]] | None:
    """(token, live pids) of the run recorded in out_dir when some of its processes live, else None."""
    path = out_dir / RECORD
    if not path.exists():
        return None
    data = _load_record(path)
    if data.get("host") != socket.gethostname() or data.get("boot_id") != _boot_id():
        return None  # recorded on another machine or before a reboot: nothing of it can live here
    token = str(data["token"])
    pids = leftovers(token)
    owner = _owner(token)
    if pids and owner is not None and not owner.alive():
        pids = wait_gone(pids, DYING_WAIT_S)  # an orphan gets its parent-death signal within moments
    return (token, pids) if pids else None


@contextmanager
def claimed(out_dir: Path, kill_leftovers: bool = False, command: str = "qgate run") -> Iterator[RunRecord]:
    """Hold out_dir (qgate.writer_lock: a second writer is refused, naming this one's pid), refuse (or
    end) live processes of the run recorded there, then record this run there."""
    if _active is not None and _active.path == out_dir / RECORD:
        yield _active  # nested in a run of the same folder (the ablation's speed then quality)
        return
    with one_writer(out_dir, command), _claim(out_dir, kill_leftovers) as record:
        yield record


@contextmanager
def _claim(out_dir: Path, kill_leftovers: bool) -> Iterator[RunRecord]:
    global _active
    prune()
    found = earlier_run(out_dir)
    if found is not None:
        token, pids = found
        names = ", ".join(describe(p) for p in pids)
        owner = _owner(token)
        if not kill_leftovers and owner is not None and owner.alive():
            # Not leftovers: a run in progress. --kill-leftovers would end it, so it is not offered.
            raise QgateError(
                f"{out_dir}: another run is in progress there (its qgate, pid {owner.pid}, is alive; its "
                f"processes: {names}); wait for it to end, stop it (kill {owner.pid}) or choose another --out"
            )
        if not kill_leftovers:
            raise QgateError(
                f"{out_dir}: processes of an earlier run are still alive: {names}; end them with "
                f"--kill-leftovers (or `qgate run leftovers --out {out_dir} --kill`)"
            )
        left = end(pids)
        if left:
            raise QgateError(f"{out_dir}: could not end {', '.join(describe(p) for p in left)}")
    token = new_token()
    record = RunRecord(
        out_dir / RECORD,
        token,
        {
            "kind": "processes",
            "schema_version": RECORD_SCHEMA_VERSION,
            "token": token,
            "qgate_pid": os.getpid(),
            "host": socket.gethostname(),
            "boot_id": _boot_id(),
            "started_at": utc_now(),
            "groups": [],
        },
    )
    # Written with the first engine child (add_group): a run refused before it starts leaves no trace.
    previous, _active = _active, record
    try:
        yield record
    finally:
        _active = previous
        if not _listed(pids_file(token)):  # nothing of the run is left: its pid file has done its job
            pids_file(token).unlink(missing_ok=True)


def stop_group(pgid: int, reap: Callable[[], object]) -> None:
    """End a process group: SIGTERM, SIGKILL after TERM_GRACE_S; `reap` collects the leader (our child).

    Waits until no process of the group is left (a zombie of a dead parent counts as gone).
    """
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            reap()
            if not _group_members(pgid):
                return
            time.sleep(0.05)
    reap()


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
