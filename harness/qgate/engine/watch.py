"""Watching one engine child while its records come in: a dead or stalled engine ends the segment.

A vLLM process that dies (SIGKILL, the OOM killer, a crash in a worker) does not always end the engine
child: measured with vLLM 0.32's multi-process engine on the CPU, `kill -9` of VLLM::EngineCore left
the child (and so qgate) waiting forever after vLLM logged "engine core exited unexpectedly". So the
launcher does not rely on the child to notice: while no record arrives it polls (POLL_S)

- the child: gone means no more records (those still in the pipe are read first);
- vLLM's processes in the child's process group (named `VLLM::...` by vLLM): one that ends before
  the child reported `done` or `error` died; its wait status is read while it is a zombie, when the
  poll catches it there, so the line can say "killed by SIGKILL". Unless the child itself ends by a
  signal within CHILD_GRACE_S: then they died with it (their parent-death signal), and the child's
  end is what the launcher reports;
- the time since the last record: beyond the contract's `stall_timeout_s` the engine has stalled.

Any of these sets `death` (one line) and stops the reading; the launcher then stops the whole group.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.25
CHILD_GRACE_S = 2.0  # a killed child is reaped within this of its vLLM processes' parent-death signal
VLLM_NAME_PREFIX = "VLLM::"  # vLLM's setproctitle names: VLLM::EngineCore, VLLM::Worker_TP0, ...


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) members of a process group."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def how_it_ended(pid: int) -> str:
    """'killed by SIGKILL' / 'exited with code 1' from a zombie's wait status; '' once it was collected."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] != "Z" or len(fields) < 50:
        return ""
    status = int(fields[49])  # field 52, exit_code: the wait status
    if status & 0x7F:
        try:
            return f"killed by {signal.Signals(status & 0x7F).name}"
        except ValueError:
            return f"killed by signal {status & 0x7F}"
    return f"exited with code {status >> 8}"


class EngineWatch:
    """The state of one engine child as the launcher reads it (see the module doc)."""

    def __init__(self, proc: subprocess.Popen, stall_timeout_s: float | None) -> None:
        self.proc = proc
        self.stall_timeout_s = stall_timeout_s
        self.last_record = time.monotonic()
        self.finished = False  # the child said `done` or `error`: its engine's processes may end now
        self.ready = False  # the child said `engine_ready`: vLLM's processes are all started
        self.death: str | None = None
        self._vllm: dict[int, tuple[str, int]] = {}  # pid -> (name, start ticks) of vLLM's processes

    def saw(self, record: dict) -> None:
        """A record arrived: progress. Scans too (a few ms): the engine is known from `engine_ready` on,
        and a vLLM process that died before the child's `error` is named as its cause."""
        self.last_record = time.monotonic()
        self._scan()
        self.ready = self.ready or record.get("event") == "engine_ready"
        if record.get("event") in ("done", "error"):
            self.finished = True

    def child_gone(self) -> bool:
        return self.proc.poll() is not None

    def _child_was_killed(self) -> bool:
        """The child itself ends by a signal within CHILD_GRACE_S. Its vLLM processes end by their
        parent-death signal, which the kernel sends when the child's thread that started them exits,
        before the child, a process of many threads, can be reaped: a poll then sees VLLM::EngineCore
        dead and the child not yet (CI, stop 33). The child's end, not theirs, is what the launcher
        reports; a child that outlives the grace is not dying with them (a killed EngineCore leaves
        the child waiting forever)."""
        deadline = time.monotonic() + CHILD_GRACE_S
        while (returncode := self.proc.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return returncode is not None and returncode < 0

    def _scan(self, learn: bool = True) -> None:
        """Learn vLLM's processes in the group (a walk of /proc, a few ms: on records and until the engine
        is ready, never between them while a rep is timed); set `death` when one seen before has ended."""
        live = set(_group(self.proc.pid)) if learn else set()
        for pid in live - set(self._vllm):
            name = _cmdline(pid)
            if name.startswith(VLLM_NAME_PREFIX):
                fields = _stat_fields(pid)
                if fields is not None:
                    self._vllm[pid] = (name.split()[0], int(fields[19]))
        if self.finished or self.death is not None:
            return
        for pid, (name, ticks) in self._vllm.items():
            fields = _stat_fields(pid)
            alive = fields is not None and fields[0] != "Z" and int(fields[19]) == ticks
            if not alive and self._child_was_killed():
                return  # its vLLM processes got the parent-death signal: the child's end is the cause
            if not alive:
                how = how_it_ended(pid) or "ended (killed or crashed; an OOM kill is logged by the kernel)"
                self.death = f"the engine died: {name} (pid {pid}) {how} while the run was in progress"
                return

    def check(self) -> bool:
        """One poll while no record is waiting; True when the reading must stop (death or child gone)."""
        self._scan(learn=not self.ready)  # once ready: a stat read per known vLLM process
        if self.death is not None:
            return True
        if self.child_gone():
            return True
        if self.stall_timeout_s is not None and time.monotonic() - self.last_record > self.stall_timeout_s:
            self.death = (
                f"the engine stalled: no record for {self.stall_timeout_s:g} s (the contract's "
                "stall_timeout_s)"
            )
            return True
        return False


def _read_more(fd: int, buf: bytes) -> tuple[bytes, bool]:
    """buf with the next chunk of the pipe appended, and whether there was one (False: end of file)."""
    chunk = os.read(fd, 1 << 16)
    return buf + chunk, bool(chunk)


def _complete_lines(buf: bytes) -> tuple[list[str], bytes]:
    """The complete lines in buf (decoded), and the partial line that stays buffered."""
    *lines, rest = buf.split(b"\n")
    return [line.decode("utf-8") for line in lines], rest


def read_records(fd: int, watch: EngineWatch) -> Iterator[str]:
    """Complete lines from the child's record pipe until it closes or `watch` says stop.

    A torn last line (a child killed mid-write: a rep can exceed a pipe's atomic size) is dropped. The
    caller closes fd.
    """
    buf = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            buf, more = _read_more(fd, buf)
            if not more:
                return
            lines, buf = _complete_lines(buf)
            yield from lines
            continue
        if watch.check():
            if watch.death is None:  # the child is gone: what it wrote before it ended is still read
                more = True
                while more and select.select([fd], [], [], 0)[0]:
                    buf, more = _read_more(fd, buf)
                lines, buf = _complete_lines(buf)
                yield from lines
            return
