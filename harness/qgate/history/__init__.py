"""The history of nightly verdicts: an append-only store, one row per arm per night.

The rows come from qgate.night.collect (one night's run directory -> one row per arm). A store is a
SQLite file (qgate.history.sqlite_store: the embedded default for one machine) or a Postgres database
given as a postgresql:// URL (qgate.history.postgres_store: many writers, e.g. a fleet of runners);
both hold the same schema (qgate.history.schema) and enforce the same rules in the database itself:
rows are never changed or deleted, a night without verdicts is refused, one run folder is one night, a
night is recorded by one append. A second append of a recorded night is a no-op when its rows are
identical (a retried step is harmless) and refused when they differ; every arm of a night goes in one
transaction.

A fleet entry's history is its own store (`store_for(store, entry)`): the file <stem>.<entry><suffix>
beside a SQLite store, the Postgres schema qgate_<entry> of the same database.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qgate.history.postgres_store import PostgresStore, is_url
from qgate.history.schema import HISTORY_SCHEMA_VERSION
from qgate.history.sqlite_store import SqliteStore
from qgate.night import (  # noqa: F401  (re-exported: the CLI's and tests' names)
    COLUMN_NAMES,
    COLUMNS,
    V1_COLUMN_NAMES,
    V2_COLUMNS,
    V3_COLUMNS,
    V4_COLUMNS,
    HistoryError,
    collect,
    unjudged_kinds,
)
from qgate.redact import redact_url
from qgate.results import atomic_write_text, atomic_write_with

__all__ = [
    "HISTORY_SCHEMA_VERSION",
    "AppendOutcome",
    "HistoryError",
    "append",
    "open_store",
    "publish",
    "read_rows",
    "store_for",
    "write_report",
]

Store = SqliteStore | PostgresStore
# NAME_MAX (255 bytes on Linux, macOS and Windows' NTFS) less SQLite's "-journal": the longest store name
# whose rollback journal can be created beside it (a longer one is created, then every append fails).
MAX_STORE_NAME = 255 - len("-journal")
ENTRY_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


@dataclass(frozen=True)
class AppendOutcome:
    """What an append did: status is "appended" or "already recorded" (an identical night)."""

    store: str
    night: str
    status: str
    arms: tuple[str, ...]
    verdict: str | None


def open_store(store: str | Path | Store, entry: str | None = None) -> Store:
    """The backend for a store given as a SQLite path or a postgresql:// URL (nothing is opened yet)."""
    if isinstance(store, (SqliteStore, PostgresStore)):
        return store
    if entry is not None and not ENTRY_NAME.fullmatch(entry):
        raise HistoryError(f"fleet entry {entry!r}: expected 1-40 of a-z, 0-9, '-' (starting a-z/0-9)")
    if is_url(str(store)):
        return PostgresStore(str(store), "public" if entry is None else f"qgate_{entry.replace('-', '_')}")
    if str(store).startswith(("postgres:", "postgresql:")) or "://" in str(store):
        raise HistoryError(
            f"{redact_url(str(store))}: a store is a SQLite path or a postgresql://user@host/db URL"
        )
    path = Path(store)
    path = path if entry is None else path.with_name(f"{path.stem}.{entry}{path.suffix}")
    if len(os.fsencode(path.name)) > MAX_STORE_NAME:
        raise HistoryError(
            f"{path}: a file name of {len(os.fsencode(path.name))} bytes: SQLite writes its journal beside "
            f"the store as <name>-journal, which a file system's 255-byte name limit leaves room for only "
            f"up to {MAX_STORE_NAME} bytes; choose a shorter --store"
        )
    return SqliteStore(path)


def store_for(store: str | Path, entry: str | None) -> Store:
    """A fleet entry's own history in the store (open_store with the entry)."""
    return open_store(store, entry)


def _stamp() -> str:
    # To the microsecond: the rows of one append share it, and the database tells appends apart by it.
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def append(
    store: str | Path | Store,
    result_dir: str | Path,
    night: str | None = None,
    commit: str | None = None,
    entry: str | None = None,
) -> AppendOutcome:
    """Add one night's rows to the store (created by the first append); see the module doc."""
    backend = open_store(store, entry)
    rows = collect(result_dir, night, commit)
    # A night is stored with its verdict: rows are never changed, so one appended before its compare
    # ran could never be completed. Said here with the folder's name; the database refuses it too.
    unjudged = unjudged_kinds(result_dir)
    if unjudged:
        raise HistoryError(
            f"{result_dir}: no verdict for its {' and '.join(unjudged)} results (no verdict.json from "
            "`qgate compare` in the folder or a subfolder): run compare first; nothing was changed"
        )
    stamp = _stamp()
    for row in rows:
        row["appended_at"] = stamp
        for key, value in row.items():  # a path that is not UTF-8 (bytes read as surrogates): no store
            if isinstance(value, str):  # holds a lone surrogate, so its bytes are kept as \xNN text
                row[key] = _storable(value)
    status = backend.append(rows)
    arms = tuple(r["arm"] for r in rows)
    return AppendOutcome(backend.label, rows[0]["night"], status, arms, rows[0]["verdict"])


def _storable(text: str) -> str:
    """Text a database can hold: a path's undecodable bytes (os.fsdecode's surrogates) as \\xNN."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def read_rows(store: str | Path | Store, entry: str | None = None) -> list[dict[str, Any]]:
    """Every row of the store as plain dicts (keys: night.COLUMN_NAMES), by night then arm (control
    first), the same from either backend."""
    return open_store(store, entry).read_rows()


def write_report(store: str | Path | Store, out_dir: str | Path, entry: str | None = None) -> dict[str, str]:
    """OUT/history.md and OUT/history.png (the trend of every night in the store), written atomically."""
    from qgate.report import trend

    backend = open_store(store, entry)
    rows = backend.read_rows()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": str(out / "history.md")}
    if rows:
        atomic_write_with(out / "history.png", lambda tmp: trend.render_png(rows, tmp), ".png")
        paths["plot"] = str(out / "history.png")
    text = trend.render_markdown(rows, backend.label, "history.png" if rows else None)
    atomic_write_text(paths["report"], text)
    return paths


def publish(
    store: str | Path | Store,
    out_dir: str | Path,
    entries: list[str] | None = None,
    contracts: Sequence[str | Path] | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """The history as a static site in OUT (index.html, one page per contract x runner; qgate.report.site),
    each file written atomically. entries: fleet entries' histories to read (default: the store's own).
    contracts: contract files or folders of them (*.yaml): their margins are drawn on the nights that ran
    under their sha256. note: a line shown on top of every page (what this history is)."""
    from qgate.contract import load_contract
    from qgate.history_view import Margin, build_series
    from qgate.report.site import GENERATOR, render_site

    margins = {}
    files = [
        f for p in contracts or [] for f in (sorted(Path(p).glob("*.yaml")) if Path(p).is_dir() else [p])
    ]
    for c in (load_contract(f) for f in files):
        gates = c.contract.speed.gates if c.contract.speed is not None else None
        margins[c.sha256] = Margin(
            c.contract.name, c.sha256, gates.max_decode_regression_pct if gates else None
        )
    series, labels = [], []
    names: list[str | None] = [*entries] if entries else [None]
    for entry in names:
        backend = open_store(store, entry)
        labels.append(backend.label)
        series += build_series(backend.read_rows(), entry, margins)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    pages = render_site(series, labels, generated, note)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        atomic_write_text(out / name, text)
    for old in out.glob("*.html"):  # an earlier publish's page of a series no longer there; nothing else
        if old.name not in pages and f'content="{GENERATOR}"' in old.read_text(
            encoding="utf-8", errors="replace"
        ):
            old.unlink()
    nights = sum(len(s.nights) for s in series)
    return {"index": str(out / "index.html"), "pages": len(pages), "series": len(series), "nights": nights}
