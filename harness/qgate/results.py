"""Result records on disk: schema-versioned JSON, written atomically, never overwritten silently.

Each kind's format history is in its model (qgate.records.<kind>), with its schema versions.

Reading: a result is read by `read_result` only (regular file, size cap, UTF-8, nesting cap, then
JSON); what its records must hold is checked by the kind's own module (qgate.speed.record,
qgate.quality.record) before any figure is computed from it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qgate.errors import cut
from qgate.records import SCHEMAS as RECORD_SCHEMAS
from qgate.records.base import ResultError

# The one registry of the record kinds qgate writes to disk: kind -> the schema versions this qgate
# reads, oldest first; the last is the one it writes. Read from the record models (qgate.records: each
# kind's model holds its versions and their history), so writers (`current_schema`), loading
# (`load_result`) and the JSON Schemas cannot drift apart (`qgate bench ops` once wrote ops_bench 3
# while loading knew {1, 2}). Bump a kind in its model, with a line on what changed, when its shape
# changes.
SCHEMAS: dict[str, tuple[int, ...]] = dict(RECORD_SCHEMAS)
KNOWN_SCHEMAS = {kind: set(versions) for kind, versions in SCHEMAS.items()}


def current_schema(kind: str) -> int:
    """The schema version qgate writes for this record kind."""
    return SCHEMAS[kind][-1]


SPEED_SCHEMA_VERSION = current_schema("speed")


def ids_sha256(ids: list[int]) -> str:
    """The hash of a token id list that every workload records (prompts, outputs)."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def utc_now() -> str:
    """The timestamp every record carries (UTC, ISO 8601, to the second)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from open(): 0o666 less the umask. mkstemp makes its files 0600, which
    would leave every result unreadable to the group a shared output folder is meant for."""
    return 0o666 & ~_umask()


def _name(exc: BaseException, target: Path) -> None:
    """An OSError of a write names no file (write, fsync on a descriptor): name the record's path, so
    the one line a full disk ends in says which record could not be written."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = str(target)


def temp_prefix(name: str) -> str:
    """The prefix of a temporary file beside `name`: the name cut to 64 characters, so that a legal
    long name (up to NAME_MAX, 255 bytes) leaves room for mkstemp's random part (issue 63)."""
    return f".{name[:64]}."


def destination(path: str | Path) -> tuple[Path, bool]:
    """Where a write to `path` lands, and whether it is written through in place.

    A symlink is followed: the file it names is replaced, never the link (a --junit that is a link to a
    file, or /dev/stdout). A path that is, or leads to, something other than a regular file (a terminal,
    a pipe, a FIFO, a device) is written through as it is: it cannot be replaced, and a rename over it
    would put a regular file in its place. A folder is refused (IsADirectoryError naming it)."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows links
    except FileNotFoundError:
        return (Path(os.path.realpath(p)) if p.is_symlink() else p), False  # a dangling link: its target
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(p))
    if not stat.S_ISREG(st.st_mode):
        return p, True
    return (Path(os.path.realpath(p)) if p.is_symlink() else p), False


def _write_through(target: Path, data: bytes) -> None:
    """Write data into a file that is not a regular one (a terminal, a pipe, a FIFO); a FIFO without a
    reader is refused at once (O_NONBLOCK: ENXIO) instead of blocking until one comes."""
    try:
        fd = os.open(target, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            said = "a FIFO with no reader: nothing would read what qgate writes"
            raise OSError(errno.ENXIO, said, str(target)) from None
        raise
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


@dataclass
class Staged:
    """A file written in full but not yet in place: `commit` moves it there in one step (a rename), or,
    for a target that is written through (destination), writes it then; `discard` removes it."""

    target: Path
    tmp: Path | None  # the filled temporary file beside the target; None: written through at commit
    data: bytes = b""

    def commit(self) -> None:
        try:
            if self.tmp is None:
                _write_through(self.target, self.data)
            else:
                os.replace(self.tmp, self.target)
        except OSError as exc:
            self.discard()
            _name(exc, self.target)
            raise

    def discard(self) -> None:
        if self.tmp is not None:
            Path(self.tmp).unlink(missing_ok=True)


def _temp_beside(target: Path, suffix: str = "") -> tuple[int, str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=suffix, dir=target.parent)


def stage_bytes(path: str | Path, data: bytes) -> Staged:
    """data in a temporary file beside path (symlinks followed: destination), flushed to disk; nothing
    is left behind when the write fails (a full disk: OSError naming path)."""
    target, through = destination(path)
    if through:
        return Staged(target, None, data)
    fd, tmp = _temp_beside(target)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        _name(exc, Path(path))
        raise
    return Staged(target, Path(tmp))


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text so that a reader sees the old file or the new one, never half of one (a symlink is
    written through: destination)."""
    stage_bytes(path, text.encode("utf-8")).commit()


def atomic_write_with(path: str | Path, write: Callable[[str], None], suffix: str = "") -> None:
    """Let `write` fill a temp file beside path (e.g. a plot), then move it into place in one step."""
    target, through = destination(path)
    if through:  # a pipe or a terminal: the bytes go through it
        fd, tmp = tempfile.mkstemp(suffix=suffix)
        os.close(fd)
        try:
            write(tmp)
            Staged(target, None, Path(tmp).read_bytes()).commit()
        finally:
            Path(tmp).unlink(missing_ok=True)
        return
    fd, tmp = _temp_beside(target, suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, target)
    except BaseException as exc:
        _name(exc, Path(path))
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record and fsync: a crash loses at most the line being written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = memoryview((json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask applies, as open()'s
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except OSError as exc:
            # A full disk can leave part of the line: cut it off, or the next append (a --resume after
            # space was freed) would follow a torn line that every later read refuses.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            _name(exc, target)
            raise
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read complete JSONL records; a torn last line (crash mid-write) is dropped."""
    records: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return records
    lines = p.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ResultError(f"{p}: line {i + 1} is not valid JSON") from None
    return records


# What a result file may be before it is parsed: qgate's biggest records (a quality run of the whole
# test split under several seeds, every output and token id) stay far below the size; no record qgate
# writes nests deeper than ~8 levels. Both bounds keep a hostile or broken file from exhausting memory
# or the parser's recursion (a 200,000-deep list was a RecursionError traceback).
MAX_RESULT_BYTES = 256 * 1024 * 1024
MAX_RESULT_DEPTH = 64
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


@dataclass(frozen=True)
class ReadResult:
    """A result record as read from disk: its JSON object and the sha256 of the bytes it was read from
    (what a verdict records of the files it judged)."""

    data: dict[str, Any]
    sha256: str


def file_sha256(path: str | Path) -> str:
    """The sha256 of a result file's bytes, read as read_result reads them (regular file, size cap)."""
    return hashlib.sha256(_read_bytes(Path(path))).hexdigest()


def read_regular(path: str | Path, limit: int, noun: str, what: str) -> bytes:
    """The bytes of a file qgate reads that is not a result (a fleet list): _read_bytes's checks, its
    one-line refusals naming the file as `noun` ("fleet list") and saying `what` it must be ("a fleet
    list is a YAML file")."""
    return _read_bytes(Path(path), limit, noun, what)


def _read_bytes(
    p: Path, limit: int | None = None, noun: str = "result", what: str = "a result is a JSON file"
) -> bytes:
    """The file's bytes, refused unless it is a regular file within `limit` bytes (MAX_RESULT_BYTES,
    read at the call: not bound at import). A FIFO, a device
    or a folder given as a result must not block the read (a FIFO hung `qgate compare` forever): the
    type is checked before opening and again on the open descriptor (opened non-blocking, so a file
    swapped for a FIFO in between cannot block either)."""
    limit = MAX_RESULT_BYTES if limit is None else limit
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise ResultError(f"{p}: not a regular file ({_file_type(st.st_mode)}): {what}")
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ResultError(f"{p}: no such {noun} file") from None
    except OSError as exc:
        raise ResultError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ResultError(f"{p}: not a regular file ({_file_type(st.st_mode)}): {what}")
        if st.st_size > limit:
            raise ResultError(f"{p}: {st.st_size} bytes, more than a {noun} can be ({limit})")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:  # grew while read
                raise ResultError(f"{p}: more than {limit} bytes, more than a {noun} can be")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise ResultError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _too_deep(raw: bytes) -> bool:
    """Whether JSON text nests [ / { deeper than MAX_RESULT_DEPTH, strings skipped (a bracket inside a
    string is text); stops at the first level too deep."""
    depth = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > MAX_RESULT_DEPTH:
            return True
    return False


def parse_result_bytes(raw: bytes, where: str | Path) -> Any:
    """JSON from a result file's bytes: UTF-8, nesting within MAX_RESULT_DEPTH; ResultError otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultError(
            f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}): a result is UTF-8 JSON"
        ) from None
    if _too_deep(raw):
        raise ResultError(f"{where}: JSON nested more than {MAX_RESULT_DEPTH} deep: not a result qgate wrote")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (RecursionError, ValueError) as exc:  # the depth scan should have caught it; one line anyway
        raise ResultError(f"{where}: not valid JSON ({type(exc).__name__}: {cut(str(exc))})") from None


def read_object(path: str | Path, limit: int | None = None) -> ReadResult:
    """Read a JSON object safely (_read_bytes within `limit` bytes, parse_result_bytes), with the sha256
    of the bytes read; no kind or schema check (a file another tool wrote: qgate.timeline's profiles)."""
    p = Path(path)
    raw = _read_bytes(p, limit)
    data = parse_result_bytes(raw, p)
    if not isinstance(data, dict):
        raise ResultError(f"{p}: expected a JSON object")
    return ReadResult(data, hashlib.sha256(raw).hexdigest())


def read_result(path: str | Path, kind: str | None = None) -> ReadResult:
    """Read a result JSON safely (read_object) and check its kind and schema_version; with the sha256
    of the bytes read."""
    p = Path(path)
    read = read_object(p)
    data = read.data
    got_kind = data.get("kind")
    if kind is not None and got_kind != kind:
        raise ResultError(f"{p}: kind = {cut(repr(got_kind))}, expected {kind!r}")
    version = data.get("schema_version")
    if type(version) is not int or version not in KNOWN_SCHEMAS.get(str(got_kind), set()):
        raise ResultError(
            f"{p}: schema_version = {cut(repr(version))} of kind {cut(repr(got_kind))} is not one qgate knows"
        )
    return read


def load_result(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Load a result JSON (read_result) and check its kind and schema_version."""
    return read_result(path, kind).data
