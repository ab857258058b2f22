"""The history in one SQLite file (stdlib sqlite3, rollback journal): the default for one machine.

Two tables: `qgate_history` (key/value: format, schema_version, created_at) and `nights` (the rows,
built from qgate.night.COLUMNS; primary key night + arm). The rules are the database's (triggers, run
inside the append's transaction), not a read-then-write in Python:
- no UPDATE or DELETE of `nights`;
- a row without the verdict of each kind it carries is refused (`nights_judged`);
- a run folder (`source`) recorded as one night cannot be recorded as another (`nights_one_source`);
- a night is the rows of one append (`nights_once`): a row for a night already holding rows of another
  append (another appended_at or source) is refused. The Python side then tells an identical night (a
  no-op) from a different one (refused) by reading what the refusal kept.
Writers are serialised by SQLite itself (BEGIN IMMEDIATE: one writer at a time; others wait up to
BUSY_TIMEOUT_S). A store made by an older qgate gets the triggers it lacks in the append's transaction.

Only a path that does not exist is created (built in a temporary file beside it, then linked into
place). An existing file must be a qgate store of a known schema version, else one line names the
problem and the file is left exactly as it was.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from qgate.history import schema
from qgate.history.rows import check_rows
from qgate.night import COLUMN_NAMES, COLUMNS, HistoryError
from qgate.results import file_mode, temp_prefix

_SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 60.0  # a writer waits this long for another's transaction (a night appends in ms)
# SQLite's result codes (sqlite3.h) that get their own line; sqlite_errorcode carries the extended one.
SQLITE_BUSY, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 5, 8, 10, 13, 14
SQLITE_READONLY_ROLLBACK = 776  # a read-only connection met a hot journal it may not roll back
_SAID = {
    SQLITE_FULL: "no space left on the store's filesystem: free space and run the same command again",
    SQLITE_IOERR: "a disk I/O error on the store's filesystem (a full disk, a quota, a failing device)",
    SQLITE_READONLY: "the store cannot be written (read-only file or filesystem)",
    SQLITE_CANTOPEN: "the store cannot be opened (its folder's permissions, or no space for its journal)",
    SQLITE_BUSY: f"another writer held the store for more than {BUSY_TIMEOUT_S:g} s",
}


def _code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0)


def database_error(path: Path, exc: sqlite3.Error) -> str:
    """The one line a SQLite error on the store becomes: what it means where SQLite says (a full disk is
    not a corrupt store), else corrupt or unreadable."""
    said = _SAID.get(_code(exc) & 0xFF)
    if said is not None:
        return f"{path}: {said} ({exc}); nothing was changed"
    return f"{path}: corrupt or unreadable history store ({exc}); nothing was changed"


_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS nights_no_update BEFORE UPDATE ON nights "
    f"BEGIN SELECT RAISE(ABORT, '{schema.APPEND_ONLY}'); END",
    "CREATE TRIGGER IF NOT EXISTS nights_no_delete BEFORE DELETE ON nights "
    f"BEGIN SELECT RAISE(ABORT, '{schema.APPEND_ONLY}'); END",
    "CREATE TRIGGER IF NOT EXISTS nights_judged BEFORE INSERT ON nights WHEN NEW.verdict IS NULL "
    "OR (NEW.speed_contract IS NOT NULL AND json_type(NEW.verdicts, '$.speed') IS NULL) "
    "OR (NEW.quality_contract IS NOT NULL AND json_type(NEW.verdicts, '$.quality') IS NULL) "
    f"BEGIN SELECT RAISE(ABORT, '{schema.UNJUDGED}'); END",
    "CREATE TRIGGER IF NOT EXISTS nights_one_source BEFORE INSERT ON nights WHEN EXISTS "
    "(SELECT 1 FROM nights WHERE source = NEW.source AND night != NEW.night) "
    f"BEGIN SELECT RAISE(ABORT, '{schema.OTHER_NIGHT}'); END",
    "CREATE TRIGGER IF NOT EXISTS nights_once BEFORE INSERT ON nights WHEN EXISTS "
    "(SELECT 1 FROM nights WHERE night = NEW.night "
    "AND (appended_at != NEW.appended_at OR source IS NOT NEW.source)) "
    f"BEGIN SELECT RAISE(ABORT, '{schema.RECORDED}'); END",
)


def _schema_sql() -> list[str]:
    cols = ",\n  ".join(f"{name} {sql}" for name, sql in COLUMNS)
    return [
        "CREATE TABLE qgate_history (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"CREATE TABLE nights (\n  {cols},\n  PRIMARY KEY (night, arm)\n)",
        *_TRIGGERS,
    ]


class SqliteStore:
    """One SQLite file; `append` and `read_rows` are the interface qgate.history uses."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.label = str(self.path)

    # ------------------------------------------------------------ opening

    def _check_header(self) -> None:
        """Refuse what is not a SQLite file before SQLite opens it (opening could write to it): a folder,
        a FIFO or a device (a FIFO's open would wait for a writer forever), a file of another kind."""
        path = self.path
        try:
            mode = os.stat(path).st_mode
            if stat.S_ISDIR(mode):
                raise HistoryError(f"{path}: is a directory, not a qgate history store")
            if not stat.S_ISREG(mode):
                raise HistoryError(
                    f"{path}: not a regular file (a FIFO, a device), not a qgate history store"
                )
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO since the stat
                    raise HistoryError(f"{path}: not a regular file, not a qgate history store")
                head = fh.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise HistoryError(f"{path}: cannot read the history store: {exc.strerror}") from None
        if not head:
            raise HistoryError(f"{path}: an empty file, not a qgate history store; nothing was changed")
        if head != _SQLITE_MAGIC:
            raise HistoryError(
                f"{path}: not a SQLite database (corrupt or foreign file), not a qgate history store; "
                "nothing was changed"
            )

    def _validate(self, conn: sqlite3.Connection) -> tuple[str, ...]:
        """The columns the store lacks (empty at the current version); HistoryError when not ours or
        not whole (SQLite's quick_check, and the file's size against its pages: a store cut short by a
        few bytes passes quick_check, its last page read as zeros)."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "qgate_history" not in tables or "nights" not in tables:
            raise HistoryError(
                f"{self.path}: a SQLite database that is not a qgate history store (tables: "
                f"{', '.join(sorted(tables)) or 'none'}); nothing was changed"
            )
        meta = dict(conn.execute("SELECT key, value FROM qgate_history").fetchall())
        version = schema.check_meta(meta, str(self.path))
        cols = tuple(r[1] for r in conn.execute("PRAGMA table_info(nights)"))
        missing = schema.check_columns(cols, version, str(self.path))
        check = conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise HistoryError(f"{self.path}: the store fails SQLite's integrity check: {check}")
        self._check_size(conn)
        return missing if version < schema.HISTORY_SCHEMA_VERSION else ()

    def _check_size(self, conn: sqlite3.Connection) -> None:
        """In rollback-journal mode (qgate's) a whole store is its pages, no byte more or less; asked
        inside the caller's transaction, so no writer is mid-commit."""
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return  # pages may live in the WAL: the file's size says nothing
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        size = os.stat(self.path).st_size
        if size != pages * page_size:
            raise HistoryError(
                f"{self.path}: {size} bytes, not the {pages} pages of {page_size} bytes its header names "
                "(cut short or added to): the store is not whole; restore it from a copy; nothing was changed"
            )

    def _connect(self, readonly: bool) -> sqlite3.Connection:
        uri = f"file:{quote(os.fsencode(self.path.resolve()))}?mode={'ro' if readonly else 'rw'}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        conn.execute("BEGIN IMMEDIATE" if not readonly else "BEGIN")  # one writer; reads see one store
        return conn

    @contextmanager
    def _open(self, readonly: bool) -> Iterator[sqlite3.Connection]:
        """A validated connection to an existing store (upgraded and given its rules when writing, in
        the write transaction); SQLite errors other than the rules' become one line.

        A store whose last writer was killed mid-append holds a hot journal (PATH-journal): SQLite
        rolls it back when the store is opened for writing, and a read-only connection cannot, so a
        read opens it read-write for that (the store is whole again: the append never happened)."""
        self._check_header()
        conn = None
        try:
            conn = self._connect(readonly)
            try:
                missing = self._validate(conn)
            except sqlite3.OperationalError as exc:
                if not (readonly and _code(exc) == SQLITE_READONLY_ROLLBACK):
                    raise
                conn.close()
                conn = None
                conn = self._rolled_back()
                missing = self._validate(conn)
            if not readonly:
                self._upgrade(conn, missing)
            yield conn
            if not readonly:
                conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError) and str(exc).startswith(("qgate:", "the qgate")):
                raise  # a rule said no: the caller words it
            raise HistoryError(database_error(self.path, exc)) from None
        finally:
            if conn is not None:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.close()

    def _rolled_back(self) -> sqlite3.Connection:
        """A read's connection to a store with a hot journal: read-write, so SQLite rolls it back."""
        try:
            return self._connect(readonly=False)
        except sqlite3.OperationalError as exc:
            if _code(exc) in (SQLITE_READONLY, SQLITE_CANTOPEN):
                raise HistoryError(
                    f"{self.path}: its last append was cut off (a hot journal, {self.path}-journal) and "
                    "this user cannot write the store to roll it back: run `qgate history append` or "
                    "`history report` once as a user who can; nothing was changed"
                ) from None
            raise

    @staticmethod
    def _upgrade(conn: sqlite3.Connection, missing: tuple[str, ...]) -> None:
        """Inside the caller's transaction: the columns an older store lacks, the rules it lacks."""
        for stmt in schema.upgrade_statements(missing):
            conn.execute(stmt)
        for stmt in _TRIGGERS:
            conn.execute(stmt)

    # ------------------------------------------------------------ writing

    @staticmethod
    def _insert(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
        marks = ", ".join("?" for _ in COLUMN_NAMES)
        conn.executemany(
            f"INSERT INTO nights ({', '.join(COLUMN_NAMES)}) VALUES ({marks})",
            [tuple(row[k] for k in COLUMN_NAMES) for row in rows],
        )

    def _create(self, rows: list[dict[str, Any]]) -> bool:
        """Build a new store in a temporary file, then link it into place; False when another process
        created the path meanwhile (the caller then appends to that one)."""
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".new", dir=path.parent)
        os.fchmod(fd, file_mode())  # the umask's mode, not mkstemp's 0600
        os.close(fd)
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("BEGIN")
                for stmt in _schema_sql():
                    conn.execute(stmt)
                conn.executemany("INSERT INTO qgate_history (key, value) VALUES (?, ?)", schema.new_meta())
                self._insert(conn, rows)
                conn.execute("COMMIT")
            except sqlite3.IntegrityError as exc:
                raise _RuleRefused(str(exc)) from None
            except sqlite3.DatabaseError as exc:  # a full disk while the new store is built
                raise HistoryError(database_error(path, exc)) from None
            finally:
                conn.close()
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def append(self, rows: list[dict[str, Any]]) -> str:
        """Insert one night's rows in one transaction: "appended", or "already recorded" when the
        database refused them as a night it holds with the same content; HistoryError otherwise."""
        try:
            if not self.path.exists() and self._create(rows):
                return "appended"
            try:
                with self._open(readonly=False) as conn:
                    self._insert(conn, rows)
                return "appended"
            except sqlite3.IntegrityError as exc:
                raise _RuleRefused(str(exc)) from None
        except _RuleRefused as exc:
            return self._explain(str(exc), rows)

    def _explain(self, message: str, rows: list[dict[str, Any]]) -> str:
        """What a refused append means, read from the store after the refusal (nothing was written)."""
        night = rows[0]["night"]
        if message.startswith(schema.UNJUDGED):
            raise HistoryError(f"{self.path}: night {night}: {message}; nothing was changed")
        with self._open(readonly=True) as conn:
            if message.startswith(schema.OTHER_NIGHT):
                other = conn.execute(
                    "SELECT night FROM nights WHERE source = ? AND night != ? LIMIT 1",
                    (rows[0]["source"], night),
                ).fetchone()
                raise HistoryError(
                    f"{self.path}: {rows[0]['source']} is already recorded as night "
                    f"{other[0] if other else '?'}: one run folder is one night; nothing was changed"
                )
            existing = {
                r[0]: (r[1], r[2], r[3])
                for r in conn.execute(
                    "SELECT arm, content_sha256, commit_sha, appended_at FROM nights WHERE night = ?",
                    (night,),
                )
            }
        if not existing:  # a rule this qgate does not know refused it
            raise HistoryError(f"{self.path}: {message}; nothing was changed")
        if schema.same_night(existing, rows):
            return "already recorded"
        raise HistoryError(schema.refusal(str(self.path), night, existing, [r["arm"] for r in rows]))

    # ------------------------------------------------------------ reading

    def read_rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            raise HistoryError(f"{self.path}: no such history store")
        with self._open(readonly=True) as conn:
            have = {r[1] for r in conn.execute("PRAGMA table_info(nights)")}
            cols = [c for c in COLUMN_NAMES if c in have]  # an older store lacks the newer columns
            cur = conn.execute(f"SELECT {', '.join(cols)} FROM nights ORDER BY {schema.ROW_ORDER}")
            rows = [{**dict.fromkeys(COLUMN_NAMES), **dict(zip(cols, r, strict=True))} for r in cur]
        return check_rows(rows, str(self.path))


class _RuleRefused(Exception):
    """One of the store's rules refused the insert (the message is the rule's)."""
