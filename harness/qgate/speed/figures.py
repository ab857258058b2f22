"""An arm's samples and figures, read from a speed result record (a dict with `reps` and `workload`).

The readers the speed comparison, the ablation and the nightly rows share; the statistics over what
they return are qgate.stats's (pure: arrays in, records out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from qgate.stats import LaunchDataError, unit_samples


def rep_values(result: Mapping[str, Any], field: str) -> np.ndarray:
    """One field of every rep, in rep order. Missing or non-numeric values become NaN so the statistics
    report an error instead of guessing."""
    out = []
    for rep in result.get("reps") or []:
        v = rep.get(field) if isinstance(rep, Mapping) else None
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan"))
    return np.array(out, dtype=float)


def result_launches(result: Mapping[str, Any]) -> int:
    """The engine starts the result's workload ran (1 unless it says a positive integer)."""
    value = (result.get("workload") or {}).get("launches", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _grouped(result: Mapping[str, Any], field: str) -> tuple[str, np.ndarray] | str:
    """The arm's (unit, samples) of one field, or the one line why its launch ids cannot be grouped."""
    ids = [rep.get("launch", 0) if isinstance(rep, Mapping) else None for rep in result.get("reps") or []]
    try:
        return unit_samples(rep_values(result, field), ids, result_launches(result))
    except LaunchDataError as exc:
        return str(exc)


def arm_units(result: Mapping[str, Any], field: str) -> tuple[str, np.ndarray]:
    """The statistical unit of an arm (reps, or launch means when it ran over several launches).
    Launch ids that cannot be grouped give NaN units, so whatever uses them is an ERROR."""
    got = _grouped(result, field)
    return ("launch", np.full(max(result_launches(result), 2), np.nan)) if isinstance(got, str) else got


def launch_problem(result: Mapping[str, Any], field: str = "decode_tok_s") -> str | None:
    """Why an arm's reps do not group into the launches its workload ran (the line arm_units' NaN units
    stand for: a run cut between launches, unbalanced launches), or None."""
    got = _grouped(result, field)
    return got if isinstance(got, str) else None


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def arm_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    """Descriptive figures of one speed arm: every rep's decode tok/s, TPOT and TTFT, and their mean /
    std / CV / min / median. A rep that is missing or not finite is None in the lists and makes every
    figure over that metric None: a summary over the reps that happen to be numbers would hide a broken
    rep (the statistics, from the same reps, say ERROR)."""
    tok, tpot, ttft = (rep_values(result, f) for f in ("decode_tok_s", "tpot_ms", "ttft_ms"))
    ok_tok = bool(tok.size) and bool(np.all(np.isfinite(tok)))
    with np.errstate(invalid="ignore", over="ignore"):
        mean = _finite_or_none(tok.mean()) if ok_tok else None
        std = _finite_or_none(tok.std(ddof=1)) if ok_tok and tok.size > 1 else None
        low = float(tok.min()) if ok_tok else None
        tpot_mean = _finite_or_none(tpot.mean()) if tpot.size and np.all(np.isfinite(tpot)) else None
        ttft_median = float(np.median(ttft)) if ttft.size and np.all(np.isfinite(ttft)) else None
    return {
        "reps": int(tok.size),
        "launches": result_launches(result),
        "decode_tok_s": [_finite_or_none(v) for v in tok],
        "tpot_ms": [_finite_or_none(v) for v in tpot],
        "ttft_ms": [_finite_or_none(v) for v in ttft],
        "launch_ids": [rep.get("launch", 0) for rep in result.get("reps") or []],
        "decode_tok_s_mean": mean,
        "decode_tok_s_std": std,
        "decode_tok_s_cv_pct": _finite_or_none(100 * std / mean) if mean and std is not None else None,
        "decode_tok_s_min": low,
        "tpot_ms_mean": tpot_mean,
        "ttft_ms_median": ttft_median,
    }
