"""The rows a store gives back, checked before anything uses them (both backends' read_rows):
every column of the type night.COLUMNS gives it, the JSON columns parsed to the shape night.collect
writes, the figures finite and within what a decode run can measure, and each row's content_sha256
recomputed (night.content_sha256). A row that fails is one line naming the store, the night, the arm
and the column (HistoryError): never a traceback, never a trend or a between-launch CV (qgate.launch_cv)
from it. The database's rules keep rows from being changed through qgate; this catches a store edited
or damaged by other means, or a row another tool wrote.
"""

from __future__ import annotations

import json
import math
from typing import Any

from qgate.errors import cut
from qgate.gate import VERDICT_RANK
from qgate.night import COLUMNS, HistoryError, content_sha256

# A decode rate (tok/s of one sequence) or a latency (ms) outside these bounds is no measurement: the
# fastest decode of one sequence on any GPU is some thousand tok/s; a slow CPU run some tenths.
MIN_TOK_S, MAX_TOK_S = 1e-3, 1e6
MAX_MS = 1e7  # under three hours per token or first token
_RATES = ("decode_tok_s_mean", "decode_tok_s_min", "gate_min_decode_tok_s")
_LATENCIES = ("tpot_ms_mean", "ttft_ms_median")
_FRACTIONS = ("raw_accuracy", "strict_accuracy")
_NOT_NULL = {name for name, sql in COLUMNS if "NOT NULL" in sql}
_TYPES = {name: sql.split()[0] for name, sql in COLUMNS}


class _Bad(Exception):
    """One column of one row is not what qgate wrote (the message says what it is)."""


def check_rows(rows: list[dict[str, Any]], store: str) -> list[dict[str, Any]]:
    """The rows, each checked (module doc); HistoryError naming the first that fails."""
    for i, row in enumerate(rows):
        column = "?"
        try:
            for column in _TYPES:
                _check_type(column, row.get(column))
            for column in ("decode_tok_s_reps", "verdicts", "fingerprint", "quality_item_rates"):
                _check_json(column, row.get(column))
            column = "decode_launch_ids"
            _check_json(column, row.get(column))
            for column in (*_RATES, *_LATENCIES, *_FRACTIONS, "decode_tok_s_reps", "decode_reps"):
                _check_range(column, row)
            column = "verdict"
            if row.get("verdict") is not None and row["verdict"] not in VERDICT_RANK:
                raise _Bad(f"{cut(repr(row['verdict']))}: not PASS, FAIL, INCONCLUSIVE or ERROR")
            column = "content_sha256"
            if content_sha256(row) != row.get("content_sha256"):
                raise _Bad("does not match the row's content: the row was changed after it was appended")
        except _Bad as exc:
            where = f"night {cut(repr(row.get('night')))}, arm {cut(repr(row.get('arm')))} (row {i + 1})"
            raise HistoryError(f"{store}: {where}: {column} {exc}; nothing was read from the store") from None
    return rows


def _check_type(column: str, value: Any) -> None:
    if value is None:
        if column in _NOT_NULL:
            raise _Bad("is NULL")
        return
    kind = _TYPES[column]
    ok = {
        "TEXT": isinstance(value, str),
        "INTEGER": isinstance(value, int) and not isinstance(value, bool),
        "REAL": isinstance(value, (int, float)) and not isinstance(value, bool),
    }[kind]
    if not ok:
        raise _Bad(f"= {cut(repr(value))}: a {type(value).__name__} where the column holds {kind}")
    if kind == "REAL" and not math.isfinite(value):
        raise _Bad(f"= {value!r}: not a finite number")


_JSON_SHAPES: dict[str, Any] = {
    "decode_tok_s_reps": list,
    "verdicts": dict,
    "fingerprint": (dict, type(None)),
    "quality_item_rates": dict,
    "decode_launch_ids": list,
}


def _check_json(column: str, value: Any) -> None:
    if value is None:
        return
    try:
        data: Any = json.loads(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _Bad(f"= {cut(repr(value))}: not JSON ({type(exc).__name__})") from None
    if not isinstance(data, _JSON_SHAPES[column]):
        raise _Bad(f"= {cut(repr(value))}: JSON of the wrong shape (a {type(data).__name__})")
    if column == "verdicts" and not all(
        isinstance(v, dict) and v.get("verdict") in VERDICT_RANK for v in data.values()
    ):
        raise _Bad(f"= {cut(repr(value))}: expected {{kind: {{verdict, reasons, contract_sha256}}}}")
    if column == "decode_launch_ids" and not all(_is_int(x) for x in data):
        raise _Bad(f"= {cut(repr(value))}: expected a list of launch numbers")
    if column == "quality_item_rates" and not all(
        isinstance(v, list) and len(v) == 2 and all(_is_int(x) and x >= 0 for x in v) for v in data.values()
    ):
        raise _Bad(f"= {cut(repr(value))}: expected {{index: [correct, runs]}}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _rate(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and MIN_TOK_S <= x <= MAX_TOK_S


def _check_range(column: str, row: dict[str, Any]) -> None:
    value = row.get(column)
    if value is None:
        return
    if column in _RATES and not _rate(value):
        raise _Bad(f"= {value!r}: not a decode rate ({MIN_TOK_S:g} to {MAX_TOK_S:g} tok/s)")
    if column in _LATENCIES and not 0 < value <= MAX_MS:
        raise _Bad(f"= {value!r}: not a latency (0 to {MAX_MS:g} ms)")
    if column in _FRACTIONS and not 0 <= value <= 1:
        raise _Bad(f"= {value!r}: not a fraction (0 to 1)")
    if column == "decode_tok_s_reps":
        reps = json.loads(value)
        bad = next((x for x in reps if x is not None and not _rate(x)), None)
        if bad is not None:
            raise _Bad(f"holds {bad!r}: not a decode rate ({MIN_TOK_S:g} to {MAX_TOK_S:g} tok/s)")
        if row.get("decode_reps") is not None and row["decode_reps"] != len(reps):
            raise _Bad(f"holds {len(reps)} reps, decode_reps says {row['decode_reps']}")
        ids = row.get("decode_launch_ids")
        if ids is not None and len(json.loads(ids)) != len(reps):
            raise _Bad(f"holds {len(reps)} reps, decode_launch_ids {len(json.loads(ids))}")
    if column == "decode_reps" and value < 0:
        raise _Bad(f"= {value!r}: a negative count")
