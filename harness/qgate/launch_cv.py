"""The between-launch CV of the control arm, estimated from the history's rows (plain dicts, as
qgate.history.read_rows returns them): what lets a run of one engine start per arm be judged across
engine starts (qgate.speed.compare). No store or database code here: rows in, an immutable record out.

Every night's control arm is the same code on the same runner, so its launch means spread as engine
starts do. Which nights count, for a speed result `tonight` (its control arm):

* the control rows of the same contract (speed_contract_sha256), complete, with the same runner
  (fingerprint RUNNER_KEYS: hostname, CPU model and count, host memory, GPU, driver, torch; a host name
  names no machine: containers and re-imaged runners share one, and two machines pooled under it
  mix their launch spreads) and vLLM version as tonight's result, of nights before
  tonight's (the UTC date of its first engine start: a verdict rerun later reads the same nights, the
  store being append-only);
* only the latest run of such nights: a night of this contract on another runner or vLLM ends the run
  (a fingerprint change: the nights before it are not used), at most MAX_NIGHTS of them;
* at least MIN_NIGHTS nights, else the estimate is not used (the record says why).

The estimate, on the log scale (an sd of log tok/s is a CV): every launch of those nights is a group
of R reps (the contract's repetitions; a row's `decode_launch_ids` says which rep came from which
launch, a row without them is one launch when it holds R reps, else it is skipped and counted). V = the
sample variance of the launch means around their grand mean (G - 1 df: E[V] = s_b^2 + s_w^2 / R plus
any drift between nights, which only makes the estimate larger), MSW = the pooled within-launch
variance. Between-launch variance s_b^2 = max(0, V - MSW / R); its one-sided upper CONFIDENCE bound
uses V's chi-square bound: max(0, V (G - 1) / chi2(1 - CONFIDENCE, G - 1) - MSW / R). That bound, not
the point estimate, is what the comparison adds to each arm's mean (treated as known: its uncertainty
is taken by the bound), for the candidate too (the same runner and contract; its own reps' variance is
measured tonight). tests/test_launch_cv.py simulates the error rates this gives (docs/compare.md).

The TTFT (metric "ttft", for the prefill gate): the rows keep each night's TTFT median, not its reps,
so from the same nights, one-launch ones only (a night of several launches keeps the median of all its
reps), V = the sample variance of the log medians and its upper bound V (G - 1) / chi2(1 - CONFIDENCE,
G - 1), the median's own noise not subtracted (ttft_levels_var; tests/test_prefill_gate.py simulates it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
from scipy import stats as sps

LAUNCH_CV_SCHEMA_VERSION = 1
MIN_NIGHTS = 5
MAX_NIGHTS = 30
CONFIDENCE = 0.9
RUNNER_KEYS = ("hostname", "cpu", "cpu_count", "memory_gib", "gpu", "driver", "torch")
# Keys qgate began to record later (memory_gib, 2026-12): compared only when both fingerprints hold one,
# so a night whose results were measured before keeps counting (their CPU model and count, which every
# result records, still tell machines apart). A history row appended before 2026-12 keeps no CPU at
# all (night.py did not): it does not count for a runner that records one, and such a history's
# estimate starts again (MIN_NIGHTS nights) rather than pool machines it cannot tell apart.
LATER_KEYS = ("memory_gib",)


@dataclass(frozen=True)
class LaunchCV:
    """The history's between-launch estimate for one speed result; `used` False says why in `reason`."""

    used: bool
    reason: str
    contract_sha256: str | None
    runner: dict[str, Any]
    vllm: str | None
    before_night: str | None
    nights: tuple[str, ...] = ()
    launches: int = 0
    reps_per_launch: int = 0
    cv_between_pct: float | None = None  # point estimate
    cv_between_upper_pct: float | None = None  # the one-sided upper CONFIDENCE bound: what is used
    cv_within_pct: float | None = None
    confidence: float = CONFIDENCE
    df: int | None = None  # G - 1
    skipped: tuple[str, ...] = field(default_factory=tuple)  # "night: why", rows of the run not usable
    schema_version: int = LAUNCH_CV_SCHEMA_VERSION

    @property
    def rel_var(self) -> float | None:
        """The variance added to each arm's mean relative to the mean squared (the upper bound)."""
        return None if self.cv_between_upper_pct is None else (self.cv_between_upper_pct / 100) ** 2

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nights": list(self.nights), "skipped": list(self.skipped)}


def _fingerprint(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _key(fp: Mapping[str, Any], keys: tuple[str, ...] = RUNNER_KEYS) -> tuple[dict[str, Any], Any]:
    return {k: fp.get(k) for k in keys}, fp.get("vllm")


def same_runner(
    row: tuple[dict[str, Any], Any], tonight: tuple[dict[str, Any], Any], later: tuple[str, ...] = LATER_KEYS
) -> bool:
    """Two runner keys (_key) name the same runner and vLLM: every key equal, a LATER_KEYS key only
    when both hold it."""
    (a, va), (b, vb) = row, tonight
    return va == vb and all(
        a.get(k) == b.get(k) or (k in later and (a.get(k) is None or b.get(k) is None))
        for k in a.keys() | b.keys()
    )


def night_of(result: Mapping[str, Any]) -> str | None:
    """The UTC date of a result's first engine start (qgate.night's night of a run), or None."""
    stamps = sorted(
        str(x["started_at"])
        for x in result.get("launches") or []
        if isinstance(x, dict) and x.get("started_at")
    )
    for stamp in stamps:
        try:
            return datetime.fromisoformat(stamp).astimezone(timezone.utc).date().isoformat()
        except ValueError:
            continue
    return None


def _launch_groups(row: Mapping[str, Any], reps: int) -> tuple[list[list[float]] | None, str]:
    """A row's reps grouped by launch, each of `reps` positive numbers; or None and why not."""
    try:
        values = json.loads(row.get("decode_tok_s_reps") or "null")
        ids = json.loads(row["decode_launch_ids"]) if row.get("decode_launch_ids") else None
    except (TypeError, ValueError):
        return None, "decode reps or launch ids are not JSON"
    if not isinstance(values, list) or not values:
        return None, "no decode reps"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        return None, "a decode rep is not a positive number"
    if ids is None:
        if len(values) != reps:
            return None, f"{len(values)} reps without launch ids (the contract runs {reps} a launch)"
        return [values], ""
    if not isinstance(ids, list) or len(ids) != len(values):
        return None, "launch ids do not match the reps"
    groups: dict[Any, list[float]] = {}
    for launch, v in zip(ids, values, strict=True):
        groups.setdefault(launch, []).append(float(v))
    if any(len(g) != reps for g in groups.values()):
        return None, f"launches of other than {reps} reps"
    return [groups[k] for k in sorted(groups, key=str)], ""


def between_var(logs: np.ndarray, confidence: float = CONFIDENCE) -> tuple[Any, Any, Any]:
    """(point, upper bound, MSW) of the between-launch variance from log reps [..., G launches, R reps]
    (module docstring; arrays in, arrays out, so the simulation of tests/test_launch_cv.py runs this)."""
    g, r = logs.shape[-2], logs.shape[-1]
    v = logs.mean(axis=-1).var(axis=-1, ddof=1)  # [...]
    msw = logs.var(axis=-1, ddof=1).mean(axis=-1)  # [...]
    upper_v = v * (g - 1) / float(sps.chi2.ppf(1 - confidence, g - 1))
    return np.maximum(0.0, v - msw / r), np.maximum(0.0, upper_v - msw / r), msw


def _ttft_level(row: Mapping[str, Any], groups: list[list[float]]) -> tuple[list[list[float]] | None, str]:
    """A one-launch night's TTFT median as its engine start's level; None and why for a night of
    several launches (its median pools their reps: less spread than one start's) or without one."""
    if len(groups) != 1:
        return None, f"{len(groups)} launches: its TTFT median is not one engine start's"
    median = row.get("ttft_ms_median")
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not 0 < median < math.inf:
        return None, "no positive TTFT median"
    return [[float(median)]], ""


def ttft_levels_var(log_levels: np.ndarray, confidence: float = CONFIDENCE) -> tuple[Any, Any]:
    """(point, upper bound) of the between-launch variance of the log TTFT from one-launch nights' log
    TTFT medians [..., G]: their sample variance (G - 1 df) and its one-sided upper chi-square bound.
    The rows keep no TTFT reps, so the median's own noise is not subtracted: it stays in the estimate,
    which can only make it larger (arrays in, arrays out: tests/test_prefill_gate.py simulates it)."""
    g = log_levels.shape[-1]
    v = log_levels.var(axis=-1, ddof=1)
    return v, v * (g - 1) / float(sps.chi2.ppf(1 - confidence, g - 1))


def estimate(
    rows: Iterable[Mapping[str, Any]],
    tonight: Mapping[str, Any],
    *,
    min_nights: int = MIN_NIGHTS,
    max_nights: int = MAX_NIGHTS,
    confidence: float = CONFIDENCE,
    runner_keys: tuple[str, ...] = RUNNER_KEYS,
    metric: str = "decode",
) -> LaunchCV:
    """The between-launch CV of the control arm for the speed result `tonight` (module docstring).
    runner_keys: the fingerprint keys that name a runner (the simulation of tests/test_launch_cv.py
    passes the keys before the CPU and memory were among them, to measure what they changed).
    metric "ttft": the warm-prefill TTFT's, from the nights' TTFT medians (ttft_levels)."""
    fp = _fingerprint(tonight.get("fingerprint"))
    runner, vllm = _key(fp, runner_keys)
    sha = (tonight.get("contract") or {}).get("sha256")
    reps = (tonight.get("workload") or {}).get("repetitions")
    before = night_of(tonight)
    base = {"contract_sha256": sha, "runner": runner, "vllm": vllm, "before_night": before}
    if not isinstance(reps, int) or reps < 2 or before is None or sha is None:
        why = "the result names no contract sha256, repetitions >= 2 or engine start time"
        return LaunchCV(False, why, **base)
    same_contract = sorted(
        (r for r in rows if r.get("arm") == "control" and r.get("speed_contract_sha256") == sha),
        key=lambda r: str(r.get("night")),
    )
    earlier = [r for r in same_contract if str(r.get("night")) < before]
    streak: list[Mapping[str, Any]] = []
    changed = None
    for row in reversed(earlier):
        if not same_runner(_key(_fingerprint(row.get("fingerprint")), runner_keys), (runner, vllm)):
            changed = str(row.get("night"))
            break
        streak.append(row)
    streak = streak[:max_nights]
    groups: list[list[float]] = []
    nights: list[str] = []
    skipped: list[str] = []
    for row in reversed(streak):
        got, why = _launch_groups(row, reps) if row.get("speed_complete") == 1 else (None, "incomplete")
        if got is not None and metric == "ttft":
            got, why = _ttft_level(row, got)
        if got is None:
            skipped.append(f"{row.get('night')}: {why}")
            continue
        groups += got
        nights.append(str(row.get("night")))
    where = f"control nights of contract {str(sha)[:12]} on this runner and vLLM {vllm} before {before}"
    if changed is not None:
        where += f" (since {changed}, a night on another runner or vLLM)"
    if len(nights) < min_nights:
        why = f"{len(nights)} usable {where}; at least {min_nights} are needed"
        return LaunchCV(False, why, **base, nights=tuple(nights), skipped=tuple(skipped))
    if metric == "ttft":
        point, upper = (float(x) for x in ttft_levels_var(np.log([g[0] for g in groups]), confidence))
        return LaunchCV(
            True, f"the TTFT medians of {len(nights)} {where}", **base, nights=tuple(nights),
            launches=len(groups), reps_per_launch=reps, cv_between_pct=100 * math.sqrt(point),
            cv_between_upper_pct=100 * math.sqrt(upper), confidence=confidence, df=len(groups) - 1,
            skipped=tuple(skipped),
        )  # fmt: skip
    logs = np.log(np.array(groups, dtype=float))  # [G, R]
    g = logs.shape[0]
    point, upper, msw = (float(x) for x in between_var(logs, confidence))
    return LaunchCV(
        True,
        f"{g} launches of {len(nights)} {where}",
        **base,
        nights=tuple(nights),
        launches=g,
        reps_per_launch=reps,
        cv_between_pct=100 * math.sqrt(point),
        cv_between_upper_pct=100 * math.sqrt(upper),
        cv_within_pct=100 * math.sqrt(msw),
        confidence=confidence,
        df=g - 1,
        skipped=tuple(skipped),
    )
