"""The history of nightly verdicts: an append-only SQLite store, one row per arm per night.

The rows come from qgate.night.collect (one night's run directory -> one row per arm).

The store (stdlib sqlite3, one file, rollback journal) holds two tables: `qgate_history` (key/value:
format = qgate-history, schema_version) and `nights` (the rows; primary key night + arm). Triggers abort
any UPDATE or DELETE of `nights`: rows are only ever added.

Rules:
- Only a path that does not exist is created (built in a temporary file beside it, then linked into
  place). An existing file must be a qgate history store of a known schema version, else one line
  names the problem (empty, not SQLite, a SQLite file of something else, unknown version, corrupt)
  and the file is left exactly as it was.
- A second append of a night already recorded is idempotent when its rows are identical (same figures
  and verdicts: a retried workflow step is harmless) and refused when they differ: the history is never
  rewritten, so the night keeps what was first recorded for it. Every arm of a night goes in one
  transaction: a night is recorded whole or not at all.

Format history of the store (`qgate_history.schema_version`):
  1 (2026-11-29): first version.
  2 (2026-11-30): quality_seeds, quality_outputs, quality_item_rates (repeated seeds: per-item
                  correct rates). A version-1 store is read as it is (the new columns read as unset)
                  and upgraded in place, in the append's own transaction, on its next append (columns
                  added; no row is changed).
  3 (2026-12-03): decode_launch_ids (the launch of every decode rep, nights of 2+ launches: the
                  history's between-launch estimate, qgate.launch_cv). A version-1 or -2 store is read
                  as it is and upgraded in place on its next append, as above.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from qgate.night import (  # noqa: F401  (HistoryError and collect re-exported: the CLI's and tests' names)
    COLUMN_NAMES,
    COLUMNS,
    V1_COLUMN_NAMES,
    V2_COLUMN_NAMES,
    V2_COLUMNS,
    V3_COLUMNS,
    HistoryError,
    collect,
    unjudged_kinds,
)
from qgate.results import atomic_write_text, atomic_write_with, file_mode, utc_now

HISTORY_SCHEMA_VERSION = 3
# The columns of the table nights per schema version this qgate reads.
_VERSION_COLUMNS = {"1": V1_COLUMN_NAMES, "2": V2_COLUMN_NAMES, str(HISTORY_SCHEMA_VERSION): COLUMN_NAMES}
FORMAT = "qgate-history"
_SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class AppendOutcome:
    """What an append did: status is "appended" or "already recorded" (an identical night)."""

    store: str
    night: str
    status: str
    arms: tuple[str, ...]
    verdict: str | None


# ---------------------------------------------------------------- the store


def _schema_sql() -> list[str]:
    cols = ",\n  ".join(f"{name} {sql}" for name, sql in COLUMNS)
    return [
        "CREATE TABLE qgate_history (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"CREATE TABLE nights (\n  {cols},\n  PRIMARY KEY (night, arm)\n)",
        "CREATE TRIGGER nights_no_update BEFORE UPDATE ON nights "
        "BEGIN SELECT RAISE(ABORT, 'the qgate history is append-only'); END",
        "CREATE TRIGGER nights_no_delete BEFORE DELETE ON nights "
        "BEGIN SELECT RAISE(ABORT, 'the qgate history is append-only'); END",
    ]


def _check_header(path: Path) -> None:
    """Refuse what is not a SQLite file before SQLite opens it (opening could write to it)."""
    if path.is_dir():
        raise HistoryError(f"{path}: is a directory, not a qgate history store")
    try:
        with open(path, "rb") as fh:
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


def _validate(conn: sqlite3.Connection, path: Path) -> int:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "qgate_history" not in tables or "nights" not in tables:
        raise HistoryError(
            f"{path}: a SQLite database that is not a qgate history store (tables: "
            f"{', '.join(sorted(tables)) or 'none'}); nothing was changed"
        )
    meta = dict(conn.execute("SELECT key, value FROM qgate_history").fetchall())
    if meta.get("format") != FORMAT:
        raise HistoryError(f"{path}: qgate_history.format = {meta.get('format')!r}, expected {FORMAT!r}")
    version = meta.get("schema_version")
    if version not in _VERSION_COLUMNS:
        raise HistoryError(
            f"{path}: history schema_version = {version!r}; this qgate reads 1 to {HISTORY_SCHEMA_VERSION}"
        )
    cols = tuple(r[1] for r in conn.execute("PRAGMA table_info(nights)"))
    if cols != _VERSION_COLUMNS[version]:
        raise HistoryError(f"{path}: table nights has columns {cols}, not those of schema {version}")
    check = conn.execute("PRAGMA quick_check").fetchone()
    if not check or check[0] != "ok":
        raise HistoryError(f"{path}: the store fails SQLite's integrity check: {check}")
    return int(version)


def _upgrade(conn: sqlite3.Connection, version: int) -> None:
    """Schema 1 or 2 -> 3 inside the caller's transaction: add the new columns; no row changes."""
    have = set(_VERSION_COLUMNS[str(version)])
    for name, sql in COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE nights ADD COLUMN {name} {sql}")
    conn.execute(
        "UPDATE qgate_history SET value = ? WHERE key = 'schema_version'", (str(HISTORY_SCHEMA_VERSION),)
    )


@contextmanager
def _open(path: Path, readonly: bool) -> Iterator[sqlite3.Connection]:
    """A validated connection to an existing store; SQLite errors become one line."""
    _check_header(path)
    uri = f"file:{quote(str(path.resolve()))}?mode={'ro' if readonly else 'rw'}"
    conn = None
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        if not readonly:
            conn.execute("BEGIN IMMEDIATE")  # one writer; validation and insert see the same store
        version = _validate(conn, path)
        if version < HISTORY_SCHEMA_VERSION and not readonly:
            _upgrade(conn, version)
        yield conn
        if not readonly:
            conn.execute("COMMIT")
    except sqlite3.IntegrityError as exc:  # a trigger or the primary key said no
        raise HistoryError(f"{path}: {exc}; nothing was changed") from None
    except sqlite3.DatabaseError as exc:
        raise HistoryError(
            f"{path}: corrupt or unreadable history store ({exc}); nothing was changed"
        ) from None
    finally:
        if conn is not None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()


def _insert(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    marks = ", ".join("?" for _ in COLUMN_NAMES)
    conn.executemany(
        f"INSERT INTO nights ({', '.join(COLUMN_NAMES)}) VALUES ({marks})",
        [tuple(row[k] for k in COLUMN_NAMES) for row in rows],
    )


def _create(path: Path, rows: list[dict[str, Any]]) -> None:
    """Build a new store in a temporary file, then link it into place (never over an existing file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.fchmod(fd, file_mode())  # the umask's mode, not mkstemp's 0600
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("BEGIN")
            for stmt in _schema_sql():
                conn.execute(stmt)
            conn.executemany(
                "INSERT INTO qgate_history (key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT),
                    ("schema_version", str(HISTORY_SCHEMA_VERSION)),
                    ("created_at", _now()),
                ],
            )
            _insert(conn, rows)
            conn.execute("COMMIT")
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise HistoryError(f"{path}: appeared while the store was being created; run again") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _now() -> str:
    return utc_now()


def _refusal(path: Path, night: str, existing: dict[str, tuple[str, str, str]], arms: list[str]) -> str:
    arm = next(iter(existing))
    _, commit, at = existing[arm]
    return (
        f"{path}: night {night} is already recorded (arms {', '.join(sorted(existing))}; commit "
        f"{commit[:12]}, appended {at}) and these results (arms {', '.join(arms)}) differ from it; the "
        "history is append-only: nothing was changed"
    )


def append(
    store: str | Path, result_dir: str | Path, night: str | None = None, commit: str | None = None
) -> AppendOutcome:
    """Add one night's rows to the store (created when the path does not exist); see the module doc."""
    path = Path(store)
    rows = collect(result_dir, night, commit)
    # A night is stored with its verdict: rows are never changed, so one appended before its compare
    # ran could never be completed (a second append is refused as a different night).
    unjudged = unjudged_kinds(result_dir)
    if unjudged:
        raise HistoryError(
            f"{result_dir}: no verdict for its {' and '.join(unjudged)} results (no verdict.json from "
            "`qgate compare` in the folder or a subfolder): run compare first; nothing was changed"
        )
    stamp = _now()
    for row in rows:
        row["appended_at"] = stamp
    the_night, arms = rows[0]["night"], [r["arm"] for r in rows]
    outcome = AppendOutcome(str(path), the_night, "appended", tuple(arms), rows[0]["verdict"])
    if not path.exists():
        _create(path, rows)
        return outcome
    with _open(path, readonly=False) as conn:
        existing = {
            r[0]: (r[1], r[2], r[3])
            for r in conn.execute(
                "SELECT arm, content_sha256, commit_sha, appended_at FROM nights WHERE night = ?",
                (the_night,),
            )
        }
        source = rows[0]["source"]
        other = conn.execute(
            "SELECT night FROM nights WHERE source = ? AND night != ? LIMIT 1", (source, the_night)
        ).fetchone()
        if other:
            raise HistoryError(
                f"{path}: {source} is already recorded as night {other[0]}: one run folder is one night; "
                "nothing was changed"
            )
        if existing:
            same = set(existing) == set(arms) and all(
                existing[r["arm"]][0] == r["content_sha256"] for r in rows
            )
            if not same:
                raise HistoryError(_refusal(path, the_night, existing, arms))
            return AppendOutcome(str(path), the_night, "already recorded", tuple(arms), rows[0]["verdict"])
        _insert(conn, rows)
    return outcome


def read_rows(store: str | Path) -> list[dict[str, Any]]:
    """Every row of the store, by night then arm (control first)."""
    path = Path(store)
    if not path.exists():
        raise HistoryError(f"{path}: no such history store")
    with _open(path, readonly=True) as conn:
        have = {r[1] for r in conn.execute("PRAGMA table_info(nights)")}
        cols = [c for c in COLUMN_NAMES if c in have]  # an older store lacks the later columns
        cur = conn.execute(
            f"SELECT {', '.join(cols)} FROM nights "
            "ORDER BY night, CASE arm WHEN 'control' THEN 0 WHEN 'candidate' THEN 1 ELSE 2 END, arm"
        )
        return [{**dict.fromkeys(COLUMN_NAMES), **dict(zip(cols, r, strict=True))} for r in cur.fetchall()]


def write_report(store: str | Path, out_dir: str | Path) -> dict[str, str]:
    """OUT/history.md and OUT/history.png (the trend of every night in the store), written atomically."""
    from qgate.report import trend

    rows = read_rows(store)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": str(out / "history.md")}
    if rows:
        atomic_write_with(out / "history.png", lambda tmp: trend.render_png(rows, tmp), ".png")
        paths["plot"] = str(out / "history.png")
    text = trend.render_markdown(rows, str(store), "history.png" if rows else None)
    atomic_write_text(paths["report"], text)
    return paths
