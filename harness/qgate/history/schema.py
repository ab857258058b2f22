"""What both history backends share: the store's format name and version, and how a table's columns
are judged against qgate.night.COLUMNS (the one definition of a row; both backends build their table
from it, so a column added there reaches SQLite and Postgres with no other edit).

Format history of the store (`qgate_history.schema_version`):
  1 (2026-11-29): first version.
  2 (2026-11-30): quality_seeds, quality_outputs, quality_item_rates (repeated seeds: per-item
                  correct rates).
  3 (2026-12-03): decode_launch_ids (the launch of every decode rep, nights of 2+ launches: the
                  between-launch estimate of qgate.launch_cv).
  4 (2026-12-04): prompt_seed, prompt_seed_pinned (the speed run's prompt seed, drawn when the run
                  started unless the contract pinned it).
A store of an older version is read as it is (the columns it lacks read as unset) and upgraded in
place, in the append's own transaction, on its next append: the columns it lacks are added at the end
(night.COLUMNS only ever grows at the end), no row is changed. A store of a newer version is refused.
"""

from __future__ import annotations

from collections.abc import Callable

from qgate.night import COLUMN_NAMES, COLUMNS, V1_COLUMN_NAMES, HistoryError
from qgate.results import utc_now

HISTORY_SCHEMA_VERSION = 4
FORMAT = "qgate-history"
# The messages the backends' database rules raise (triggers, checks); the Python side maps them to
# the user's one line. Prefixed so that a foreign error is never taken for one of them.
UNJUDGED = "qgate: a night without verdicts"
OTHER_NIGHT = "qgate: run folder already recorded as another night"
RECORDED = "qgate: night already recorded"
APPEND_ONLY = "the qgate history is append-only"


def new_meta() -> list[tuple[str, str]]:
    """The qgate_history rows of a store being created (either backend)."""
    return [("format", FORMAT), ("schema_version", str(HISTORY_SCHEMA_VERSION)), ("created_at", utc_now())]


def check_meta(meta: dict[str, str], where: str) -> int:
    """The store's schema version from its qgate_history rows; HistoryError when it is not ours."""
    if meta.get("format") != FORMAT:
        raise HistoryError(f"{where}: qgate_history.format = {meta.get('format')!r}, expected {FORMAT!r}")
    version = meta.get("schema_version")
    known = [str(v) for v in range(1, HISTORY_SCHEMA_VERSION + 1)]
    if version not in known:
        newer = version is not None and version.isdigit() and int(version) > HISTORY_SCHEMA_VERSION
        raise HistoryError(
            f"{where}: history schema_version = {version!r}; this qgate reads 1 to {HISTORY_SCHEMA_VERSION}"
            + (" (written by a newer qgate: upgrade qgate)" if newer else "")
            + "; nothing was changed"
        )
    return int(version)


def check_columns(cols: tuple[str, ...], version: int, where: str) -> tuple[str, ...]:
    """The columns a store lacks (to add on upgrade): its table must hold a prefix of COLUMN_NAMES,
    the whole of it at the current version, at least schema 1's columns at an older one."""
    ok = cols == COLUMN_NAMES[: len(cols)] and len(cols) >= len(V1_COLUMN_NAMES)
    if not ok or (version == HISTORY_SCHEMA_VERSION and cols != COLUMN_NAMES):
        raise HistoryError(f"{where}: table nights has columns {cols}, not those of schema {version}")
    return COLUMN_NAMES[len(cols) :]


def upgrade_statements(missing: tuple[str, ...], column_type: Callable[[str], str] = str) -> list[str]:
    """The statements that bring an older store's table to night.COLUMNS, the version row last (either
    backend: column_type maps a column's SQLite type to the backend's). None when nothing is missing."""
    if not missing:
        return []
    types = dict(COLUMNS)
    alters = [f"ALTER TABLE nights ADD COLUMN {name} {column_type(types[name])}" for name in missing]
    version = f"UPDATE qgate_history SET value = '{HISTORY_SCHEMA_VERSION}' WHERE key = 'schema_version'"
    return [*alters, version]


def refusal(where: str, night: str, existing: dict[str, tuple[str, str, str]], arms: list[str]) -> str:
    """The line for a night already recorded with other figures ({arm: (sha, commit, appended_at)})."""
    _, commit, at = next(iter(existing.values()))
    return (
        f"{where}: night {night} is already recorded (arms {', '.join(sorted(existing))}; commit "
        f"{commit[:12]}, appended {at}) and these results (arms {', '.join(arms)}) differ from it; the "
        "history is append-only: nothing was changed"
    )


def same_night(existing: dict[str, tuple[str, str, str]], rows: list[dict]) -> bool:
    """Whether the rows are the night already recorded: the same arms, each with the same content."""
    return set(existing) == {r["arm"] for r in rows} and all(
        existing[r["arm"]][0] == r["content_sha256"] for r in rows
    )


# Rows by night then arm (control first): what read_rows returns on either backend.
ROW_ORDER = "night, CASE arm WHEN 'control' THEN 0 WHEN 'candidate' THEN 1 ELSE 2 END, arm"
