"""One writer per output folder: `compare`, `run` (speed, quality, ops) and `ablate` hold a lock on
their --out while they write it, so that a second qgate writing the same folder is refused in one line
naming the folder and the holder's pid, instead of the two writing over each other's records.

The lock is filelock's (flock(2) on DIR/.qgate.lock, released by the kernel when its holder dies, even
by SIGKILL: no stale lock to clear by hand); who holds it is written beside it (DIR/.qgate-writer.json:
pid, command, host, since), read by the writer that is refused. Nested holds of one folder in one
process (the ablation's speed then quality parts, a run inside a command that already holds it) are
one hold: flock refuses a second descriptor even of the same process.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from qgate.errors import QgateError
from qgate.results import atomic_write_json, utc_now

LOCK_NAME = ".qgate.lock"
HOLDER_NAME = ".qgate-writer.json"
_held: dict[Path, int] = {}  # folder (resolved) -> nesting depth, in this process


class FolderBusy(QgateError):
    """Another qgate process writes the folder; str() is one line naming it and the holder's pid."""


def _holder(out: Path) -> str:
    """What the holder wrote of itself, for the refusal's line ("pid unknown" when it has not yet)."""
    try:
        with open(out / HOLDER_NAME, "rb") as fh:  # written by qgate beside its lock: small
            data = json.loads(fh.read(4096))
        return f"pid {int(data['pid'])}, `{data['command']}` since {data['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


@contextmanager
def one_writer(out_dir: str | Path, command: str) -> Iterator[None]:
    """Hold out_dir (created if missing) for `command` (e.g. "qgate compare") while the block runs;
    FolderBusy when another process holds it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = out.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    lock = FileLock(out / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FolderBusy(
            f"{out}: another qgate writes there ({_holder(out)}): wait for it to end, stop it, or choose "
            "another --out"
        ) from None
    _held[key] = 1
    try:
        since = {"pid": os.getpid(), "command": command, "host": socket.gethostname(), "since": utc_now()}
        atomic_write_json(out / HOLDER_NAME, since)
        yield
    finally:
        del _held[key]
        with suppress(OSError):
            (out / HOLDER_NAME).unlink()
        lock.release()
