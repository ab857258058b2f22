"""Pure statistics for a matched control/candidate comparison of one metric.

Nothing here prints, reads files or knows about vLLM: samples in, an immutable record out.

The decision rule (per metric), with alpha, min_effect_pct and max_cv_pct from the contract:

* error: a statistic could not be computed (empty arm, fewer than 2 samples, NaN/inf or
  non-positive values, zero variance in both arms, a non-finite p or CI). The verdict layer turns
  this into ERROR, never into a pass.
* inconclusive: the coefficient of variation (population std / mean) of either arm is above
  max_cv_pct, or the sample sizes cannot reach alpha at all (the smallest attainable two-sided exact
  Mann-Whitney p, 2 / C(n+m, n), is >= alpha: e.g. 3 v 3 launches).
* significant: Welch's t-test p < alpha AND the exact Mann-Whitney U p < alpha AND the seeded
  percentile-bootstrap (1 - alpha) CI of the ratio of means (candidate / control) excludes 1. Asking
  all three to agree is conservative: the false-positive rate is at most that of the most
  conservative of them (tests/test_stats.py measures it on 10,000 simulated A/A pairs).
* improved / regressed: significant and the change of the means is at least min_effect_pct in the
  good / bad direction; otherwise "no significant change" (a significant effect below the practical
  floor is reported as such in the reason).

Multi-launch: when an arm ran over L > 1 engine starts, reps of one launch are not independent
(they share the engine start), so `unit_samples` averages the reps of each launch first and the
tests run on the L launch means.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

STATS_SCHEMA_VERSION = 1
IMPROVED = "improved"
REGRESSED = "regressed"
NO_CHANGE = "no significant change"
INCONCLUSIVE = "inconclusive"
ERROR = "error"
# Integer codes used by the vectorised decision; index into VERDICTS.
VERDICTS = (IMPROVED, REGRESSED, NO_CHANGE, INCONCLUSIVE, ERROR)
# Above this many distinct splits an exact permutation test with ties is too slow: use the normal
# approximation with tie correction and say so in the record.
_MAX_EXACT_SPLITS = 100_000
# Bootstrap work per chunk (pairs * resamples), to bound memory in batch use.
_CHUNK_CELLS = 10_000_000


@dataclass(frozen=True)
class StatsConfig:
    """The contract's statistics settings (speed.stats)."""

    alpha: float = 0.05
    min_effect_pct: float = 2.0
    max_cv_pct: float = 10.0
    bootstrap_resamples: int = 10_000
    seed: int = 20260828

    @classmethod
    def from_contract(cls, speed_stats: Any) -> StatsConfig:
        """Build from a contract's `speed.stats` model (or anything with the same attributes)."""
        return cls(
            alpha=float(speed_stats.alpha),
            min_effect_pct=float(speed_stats.min_effect_pct),
            max_cv_pct=float(speed_stats.max_cv_pct),
            bootstrap_resamples=int(speed_stats.bootstrap_resamples),
            seed=int(speed_stats.seed),
        )


@dataclass(frozen=True)
class Summary:
    """One arm's samples (reps or launch means) and their descriptive statistics."""

    n: int
    mean: float
    median: float
    std: float  # population standard deviation (ddof=0)
    cv_pct: float
    min: float
    max: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class MetricStats:
    """The comparison of one metric; `verdict` is one of VERDICTS, `error` set when it is ERROR."""

    metric: str
    higher_is_better: bool
    unit: str
    verdict: str
    reason: str
    control: Summary | None = None
    candidate: Summary | None = None
    ratio: float | None = None  # mean(candidate) / mean(control)
    change_pct: float | None = None
    welch_t: float | None = None
    welch_p: float | None = None
    mwu_u: float | None = None
    mwu_p: float | None = None
    mwu_method: str | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    alpha: float | None = None
    min_effect_pct: float | None = None
    max_cv_pct: float | None = None
    bootstrap_resamples: int | None = None
    seed: int | None = None
    error: str | None = None
    schema_version: int = STATS_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: non-finite floats become None (strict JSON has no NaN)."""
        return _json_safe(asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def summarize(samples: Any) -> Summary:
    """Descriptive statistics of one arm; the caller has checked the samples are finite and non-empty."""
    x = np.asarray(samples, dtype=float)
    mean = float(x.mean())
    std = float(x.std(ddof=0))
    cv = 100.0 * std / mean if mean != 0 else math.inf
    return Summary(
        n=int(x.size),
        mean=mean,
        median=float(np.median(x)),
        std=std,
        cv_pct=cv,
        min=float(x.min()),
        max=float(x.max()),
        samples=tuple(float(v) for v in x),
    )


def unit_samples(values: Any, launch_ids: Any, launches: int) -> tuple[str, np.ndarray]:
    """The samples the tests run on: reps when launches == 1, else the mean of each launch's reps.

    Returns (unit, samples) with unit "rep" or "launch"; launch means are ordered by launch id.
    """
    x = np.asarray(values, dtype=float)
    if launches <= 1:
        return "rep", x
    ids = np.asarray(launch_ids)
    if ids.shape != x.shape:
        raise ValueError(f"{x.size} values but {ids.size} launch ids")
    order = sorted(set(ids.tolist()))
    return "launch", np.array([x[ids == i].mean() for i in order], dtype=float)


def min_attainable_p(n: int, m: int) -> float:
    """Smallest two-sided exact Mann-Whitney p for sizes n, m (no ties)."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def _validate(control: np.ndarray, candidate: np.ndarray) -> str | None:
    for name, x in (("control", control), ("candidate", candidate)):
        if x.ndim != 1:
            return f"{name} samples must be one-dimensional, got shape {x.shape}"
        if x.size == 0:
            return f"{name} has no samples"
        if not np.all(np.isfinite(x)):
            return f"{name} has non-finite samples (NaN or inf)"
        if np.any(x <= 0):
            return f"{name} has non-positive samples; a ratio of means needs positive values"
        if x.size < 2:
            return f"{name} has {x.size} sample; Welch's t-test needs at least 2 per arm"
    if control.std() == 0 and candidate.std() == 0:
        return "zero variance in both arms: Welch's t is undefined (a broken measurement?)"
    return None


def _mwu_batch(control: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Exact two-sided Mann-Whitney U per row; rows with ties use an exact permutation test."""
    # control: [P, n], candidate: [P, m]
    res = sps.mannwhitneyu(candidate, control, method="exact", axis=1)
    u, p = np.array(res.statistic, dtype=float), np.array(res.pvalue, dtype=float)
    methods = ["exact"] * control.shape[0]
    both = np.sort(np.concatenate([control, candidate], axis=1), axis=1)
    tied_rows = np.flatnonzero(np.any(np.diff(both, axis=1) == 0, axis=1))
    n, m = control.shape[1], candidate.shape[1]
    exact_ok = math.comb(n + m, n) <= _MAX_EXACT_SPLITS
    for row in tied_rows:
        # scipy's "exact" ignores ties; the permutation distribution of U handles them exactly.
        method: Any = sps.PermutationMethod(n_resamples=_MAX_EXACT_SPLITS) if exact_ok else "asymptotic"
        r = sps.mannwhitneyu(candidate[row], control[row], method=method)
        u[row], p[row] = float(r.statistic), float(r.pvalue)
        methods[row] = "exact permutation (ties)" if exact_ok else "asymptotic (ties, too many splits)"
    return u, p, methods


def _bootstrap_ratio_ci(
    control: np.ndarray, candidate: np.ndarray, cfg: StatsConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap (1 - alpha) CI of mean(candidate) / mean(control), per row.

    The resample indices come from one seeded generator and are shared by all rows, so a row's CI
    is the same whether it is computed alone or in a batch.
    """
    # control: [P, n], candidate: [P, m]
    n, m, b = control.shape[1], candidate.shape[1], cfg.bootstrap_resamples
    rng = np.random.default_rng(cfg.seed)
    # Resampling with replacement as count matrices: mean of a resample = samples @ counts / n.
    counts_c = _counts(rng.integers(0, n, size=(b, n)), n)  # [B, n]
    counts_t = _counts(rng.integers(0, m, size=(b, m)), m)  # [B, m]
    q = [cfg.alpha / 2, 1 - cfg.alpha / 2]
    lows, highs = [], []
    step = max(1, _CHUNK_CELLS // b)
    for start in range(0, control.shape[0], step):
        mc = control[start : start + step] @ counts_c.T / n  # [p, B]
        mt = candidate[start : start + step] @ counts_t.T / m  # [p, B]
        lo, hi = np.quantile(mt / mc, q, axis=1)
        lows.append(lo)
        highs.append(hi)
    return np.concatenate(lows), np.concatenate(highs)


def _counts(idx: np.ndarray, size: int) -> np.ndarray:
    counts = np.zeros((idx.shape[0], size))
    np.add.at(counts, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    return counts


def decide_batch(
    control: np.ndarray, candidate: np.ndarray, cfg: StatsConfig, higher_is_better: bool = True
) -> dict[str, np.ndarray]:
    """The decision rule on P pairs at once (rows); used by compare_samples and the honesty tests.

    control: [P, n], candidate: [P, m], all positive and finite (compare_samples checks). Returns
    arrays of length P: welch_t, welch_p, mwu_u, mwu_p, ratio, change_pct, ci_low, ci_high,
    cv_control, cv_candidate and `code` (index into VERDICTS).
    """
    control = np.asarray(control, dtype=float)
    candidate = np.asarray(candidate, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        welch = sps.ttest_ind(candidate, control, equal_var=False, axis=1)
        welch_t, welch_p = np.asarray(welch.statistic, float), np.asarray(welch.pvalue, float)
        mwu_u, mwu_p, methods = _mwu_batch(control, candidate)
        ci_low, ci_high = _bootstrap_ratio_ci(control, candidate, cfg)
        mean_c, mean_t = control.mean(axis=1), candidate.mean(axis=1)
        ratio = mean_t / mean_c
        cv_c = 100 * control.std(axis=1) / mean_c
        cv_t = 100 * candidate.std(axis=1) / mean_t
    change = 100 * (ratio - 1)
    good = change if higher_is_better else -change
    significant = (welch_p < cfg.alpha) & (mwu_p < cfg.alpha) & ((ci_low > 1) | (ci_high < 1))
    improved = significant & (good > 0) & (good >= cfg.min_effect_pct)
    regressed = significant & (good < 0) & (-good >= cfg.min_effect_pct)
    noisy = (cv_c > cfg.max_cv_pct) | (cv_t > cfg.max_cv_pct)
    underpowered = min_attainable_p(control.shape[1], candidate.shape[1]) >= cfg.alpha
    broken = ~(np.isfinite(welch_p) & np.isfinite(mwu_p) & np.isfinite(ci_low) & np.isfinite(ci_high))
    broken |= ~(np.isfinite(ratio) & np.isfinite(welch_t))
    code = np.select(
        [broken, noisy | underpowered, improved, regressed],
        [VERDICTS.index(ERROR), VERDICTS.index(INCONCLUSIVE), 0, 1],
        default=VERDICTS.index(NO_CHANGE),
    )
    return {
        "welch_t": welch_t,
        "welch_p": welch_p,
        "mwu_u": mwu_u,
        "mwu_p": mwu_p,
        "mwu_method": np.array(methods, dtype=object),
        "ratio": ratio,
        "change_pct": change,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "cv_control": cv_c,
        "cv_candidate": cv_t,
        "significant": significant,
        "code": code,
    }


def _reason(verdict: str, row: dict[str, Any], cfg: StatsConfig, n: int, m: int) -> str:
    ci = f"{100 * (1 - cfg.alpha):g} % CI of ratio [{row['ci_low']:.4f}, {row['ci_high']:.4f}]"
    tests = f"Welch p={row['welch_p']:.3g}, Mann-Whitney p={row['mwu_p']:.3g}, {ci}"
    if verdict == ERROR:
        return f"a statistic could not be computed ({tests})"
    if verdict == INCONCLUSIVE:
        if min_attainable_p(n, m) >= cfg.alpha:
            return (
                f"{n} v {m} samples cannot reach alpha {cfg.alpha:g}: the smallest exact Mann-Whitney "
                f"p is {min_attainable_p(n, m):.3g}"
            )
        return (
            f"too noisy: CV control {row['cv_control']:.2f} %, candidate {row['cv_candidate']:.2f} % "
            f"(limit {cfg.max_cv_pct:g} %)"
        )
    change = f"change {row['change_pct']:+.2f} %"
    if verdict in (IMPROVED, REGRESSED):
        return f"{change}, significant at alpha {cfg.alpha:g} ({tests})"
    if row["significant"]:
        return f"{change} is significant but below the practical floor {cfg.min_effect_pct:g} % ({tests})"
    return f"{change}, not significant at alpha {cfg.alpha:g} ({tests})"


def compare_samples(
    control: Any,
    candidate: Any,
    cfg: StatsConfig,
    metric: str = "decode_tok_s",
    higher_is_better: bool = True,
    unit: str = "rep",
) -> MetricStats:
    """Compare one metric's samples of two arms; never raises for bad data, returns an error record."""
    base = {"metric": metric, "higher_is_better": higher_is_better, "unit": unit}
    settings = {
        "alpha": cfg.alpha,
        "min_effect_pct": cfg.min_effect_pct,
        "max_cv_pct": cfg.max_cv_pct,
        "bootstrap_resamples": cfg.bootstrap_resamples,
        "seed": cfg.seed,
        "ci_level": 1 - cfg.alpha,
    }
    try:
        c = np.asarray(control, dtype=float)
        t = np.asarray(candidate, dtype=float)
    except (TypeError, ValueError) as exc:
        msg = f"samples are not numbers: {exc}"
        return MetricStats(**base, verdict=ERROR, reason=msg, error=msg, **settings)
    problem = _validate(c, t)
    if problem is not None:
        sums = {}
        if c.ndim == 1 and c.size and np.all(np.isfinite(c)):
            sums["control"] = summarize(c)
        if t.ndim == 1 and t.size and np.all(np.isfinite(t)):
            sums["candidate"] = summarize(t)
        return MetricStats(**base, verdict=ERROR, reason=problem, error=problem, **sums, **settings)
    out = decide_batch(c[None, :], t[None, :], cfg, higher_is_better)
    row = {k: v[0] for k, v in out.items()}
    verdict = VERDICTS[int(row["code"])]
    reason = _reason(verdict, row, cfg, c.size, t.size)
    return MetricStats(
        **base,
        verdict=verdict,
        reason=reason,
        control=summarize(c),
        candidate=summarize(t),
        ratio=float(row["ratio"]),
        change_pct=float(row["change_pct"]),
        welch_t=float(row["welch_t"]),
        welch_p=float(row["welch_p"]),
        mwu_u=float(row["mwu_u"]),
        mwu_p=float(row["mwu_p"]),
        mwu_method=str(row["mwu_method"]),
        ci_low=float(row["ci_low"]),
        ci_high=float(row["ci_high"]),
        error=reason if verdict == ERROR else None,
        **settings,
    )
