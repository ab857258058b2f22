"""A speed verdict as Bencher Metric Format (BMF) JSON, for a benchmark dashboard.

Why BMF and not github-action-benchmark's format: a BMF measure carries its interval as numbers
(value, lower_value, upper_value), so the dashboard plots each arm's mean with its 95 % CI and
Bencher's thresholds can read the bounds; one file holds measures of both directions (decode tok/s:
higher is better, TPOT: lower is better; the direction is the measure's setting in Bencher).
github-action-benchmark takes one direction per file ("customBiggerIsBetter" / "customSmallerIsBetter"),
keeps the interval only as free text ("range"), and stores its history by pushing to a gh-pages branch
from the workflow (a job with contents: write), where Bencher is given results by `bencher run
--file`. docs/nightly.md says how to send it.

Layout: {"<prefix>/<contract>/<arm>": {"decode-tok-s": {...}, "tpot-ms": {...}}} for each arm,
each measure {"value": mean, "lower_value", "upper_value"}: the Welch-t interval of the arm's mean at
the contract's CI level, launch-aware (qgate.stats.arm_variance / mean_interval: the same interval
the speed floor reads). A measure whose interval cannot be computed (fewer than two units, a missing
rep) keeps its value without bounds. Pure: a verdict record in, a dict out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qgate.stats import arm_variance, mean_interval

MEASURES = (("decode-tok-s", "decode_tok_s"), ("tpot-ms", "tpot_ms"))
ARMS = ("control", "candidate")


def _measure(values: list[Any], launches: int, alpha: float) -> dict[str, float] | None:
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    x = np.asarray(values, dtype=float)[None, :]  # [1, L*R]
    mean = float(x.mean())
    out = {"value": mean}
    try:
        var = arm_variance(x, launches if launches > 1 and x.shape[1] % launches == 0 else 1)
    except ValueError:
        return out
    low, high = mean_interval(var["mean"], var["var_of_mean"], var["df"], alpha)
    if math.isfinite(float(low[0])) and math.isfinite(float(high[0])):
        out.update(lower_value=float(low[0]), upper_value=float(high[0]))
    return out


def bmf(record: dict[str, Any], prefix: str = "qgate") -> dict[str, Any]:
    """The BMF benchmarks of a verdict record with speed figures (empty when it has none)."""
    figures = record.get("figures") or {}
    if not all(isinstance(figures.get(arm), dict) for arm in ARMS):
        return {}
    decode = (record.get("stats") or {}).get("decode_tok_s") or {}
    alpha = 1 - float(decode.get("ci_level") or 0.95)
    contract = (record.get("contract") or {}).get("name") or "contract"
    out: dict[str, Any] = {}
    for arm in ARMS:
        arm_figs = figures[arm]
        launches = int(arm_figs.get("launches") or 1)
        measures = {}
        ids = list(arm_figs.get("launch_ids") or [])
        for name, key in MEASURES:
            values = list(arm_figs.get(key) or [])
            if len(ids) == len(values):  # launch-major, as arm_variance reads them
                values = [v for _, v in sorted(zip(ids, values, strict=True), key=lambda p: p[0])]
            m = _measure(values, launches, alpha)
            if m is not None:
                measures[name] = m
        if measures:
            out[f"{prefix}/{contract}/{arm}"] = measures
    return out
