"""Pure statistics for a matched control/candidate comparison of one metric.

Nothing here prints, reads files or knows about vLLM: samples in, an immutable record out.

The statistical unit. With one engine start per arm (launches L = 1) the unit is the rep. With L >= 2
starts of R reps each, reps of one start share its offset (engine starts differ: allocator state, thread
placement, JIT), so the arm is a one-way random-effects sample: y_ij = mu + b_i + e_ij with a between-
launch variance s_b^2 and a within-launch variance s_w^2, estimated from the mean squares
MSB = R * var(launch means) (df L-1) and MSW = pooled within-launch variance (df L(R-1)):
s_w^2 = MSW, s_b^2 = max(0, (MSB - MSW) / R). The variance of the arm's mean is E[MSB] / (L R); it
is estimated by max(MSB, MSW) / (L R) with the df of the mean square used (L-1 for MSB, L(R-1) for
MSW): MSB alone is unbiased but with L = 2 has one degree of freedom, MSW alone ignores the launch
offsets; their maximum never estimates below the within-launch floor and follows MSB whenever the
launches differ by more than their reps do. tests/test_stats.py checks the calibration by simulation
(A/A with launch offsets of sd 10 %, and a true slowdown equal to the margin).

With L = 1 the reps say nothing of the offset between the two arms' engine starts. A between-launch
variance known from outside the run (`between`: qgate.launch_cv's bound from the history, relative to
the mean squared) is then added to each arm's mean: var(mean) = s^2 / n + rel_var * mean^2, df by
Satterthwaite (tests/test_launch_cv.py simulates the error rates). Without it the speed gates do not
let the decode ratio PASS or FAIL (qgate.speed.gates).

The interval. The CI of the ratio of means (candidate / control) is a Welch-t interval on its log:
log(mean_t / mean_c) +- t(1 - alpha/2, df) * se, se^2 = var(mean_t)/mean_t^2 + var(mean_c)/mean_c^2
(delta method), df by Satterthwaite. Each bound is one-sided at alpha/2; the verdict layer's
non-inferiority gate needs its lower bound (for a higher-is-better metric) at or above 1 - margin.
The seeded percentile bootstrap of the reps is kept as one of the three significance tests only: at
5 reps it is too narrow to bound a margin (it passes a slowdown equal to the margin 6.0-6.6 % of the
time instead of 2.5 %; docs/compare.md, tests/test_stats.py).

The decision rule (per metric), with alpha, min_effect_pct and max_cv_pct from the contract:

* error: a statistic could not be computed (empty arm, fewer than 2 samples, NaN/inf or
  non-positive values, zero variance in both arms, unbalanced launches, a non-finite p or CI). The
  verdict layer turns this into ERROR, never into a pass.
* significant: Welch's t-test p < alpha (on the unit, with the variance and df above) AND its interval
  of the ratio (above) excludes 1 AND the exact Mann-Whitney U p < alpha (on all reps) AND the seeded
  percentile-bootstrap (1 - alpha) CI of the ratio of means (reps resampled) excludes 1. Asking all of
  them to agree is conservative: the false-positive rate is at most that of the most conservative of
  them, and Welch's is the one that knows the launch structure (tests/test_stats.py measures the rate
  on simulated A/A pairs).
* regressed: significant and the change of the means is at least min_effect_pct in the bad direction,
  whatever the noise: a significant regression beyond the practical floor is a regression even on a
  noisy machine.
* inconclusive: not regressed, and the coefficient of variation (sample sd, ddof 1, / mean of all reps)
  of either arm is above max_cv_pct, or the sample sizes cannot reach alpha at all (the smallest
  attainable two-sided exact Mann-Whitney p, 2 / C(n+m, n), is >= alpha: e.g. 3 v 3 reps).
* improved: significant and at least min_effect_pct in the good direction; otherwise "no significant
  change" (a significant effect below the practical floor is reported as such in the reason).

How many units a margin needs, and the advice an INCONCLUSIVE verdict gives: qgate.sample_size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

STATS_SCHEMA_VERSION = 3  # 3: `between` (the between-launch variance given from outside the run)
DEFAULT_POWER = 0.8
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
# scipy's exact Mann-Whitney distribution costs ~0.04 s at 50 v 50 and ~50 s at 200 v 200: above this
# many samples in the larger arm the normal approximation (tie-corrected) is used and named in the record.
_MAX_EXACT_MWU = 50
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
    std: float  # sample standard deviation (ddof=1)
    cv_pct: float
    min: float
    max: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Components:
    """One arm's variance components (one-way random effects over its launches), on the metric's scale.

    With one launch, or one rep per launch, between and within cannot be separated: they are None and
    `unit_var` is the sample variance of the units. cv_* are 100 * sqrt(var) / mean.
    """

    launches: int
    reps_per_launch: int
    unit: str  # "rep" or "launch"
    units: int
    mean: float
    var_between: float | None
    var_within: float | None
    cv_between_pct: float | None
    cv_within_pct: float | None
    ms_between: float | None
    ms_within: float | None
    var_of_mean: float  # the estimated variance of the arm's mean
    df: float  # degrees of freedom of var_of_mean
    unit_cv_pct: float  # CV of one unit: 100 * sqrt(var_of_mean * units) / mean


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
    # The Welch-t interval on log(ratio): each bound one-sided at alpha/2 (the non-inferiority bound).
    t_ci_low: float | None = None
    t_ci_high: float | None = None
    log_ratio_se: float | None = None
    df: float | None = None  # Satterthwaite df of that interval and of welch_t
    launches: int = 1
    control_components: Components | None = None
    candidate_components: Components | None = None
    # With one launch per arm: the between-launch variance added to each arm's mean from outside the
    # run (qgate.launch_cv, the history), as {"rel_var", "df"}; None when none was given.
    between: dict[str, float] | None = None
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
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
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


class LaunchDataError(ValueError):
    """Reps whose launch ids cannot be grouped; str() is one line."""


def _launch_key(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LaunchDataError(f"launch id {value!r} ({type(value).__name__}): expected an integer")
    return int(value)


def group_by_launch(values: Any, launch_ids: Any, launches: int) -> np.ndarray:
    """The reps ordered launch by launch (launch-major), as decide_batch and compare_samples want them.

    launches == 1: the values as they are. Otherwise every launch id must be an integer, there must be
    exactly `launches` distinct ids and each must hold the same number of reps; LaunchDataError otherwise.
    """
    x = np.asarray(values, dtype=float)
    if launches <= 1:
        return x
    ids = list(launch_ids)
    if len(ids) != x.size:
        raise LaunchDataError(f"{x.size} values but {len(ids)} launch ids")
    keys = [_launch_key(v) for v in ids]
    order = sorted(set(keys))
    if len(order) != launches:
        raise LaunchDataError(
            f"{len(order)} distinct launch ids {order}, the workload ran {launches} launches"
        )
    sizes = {k: keys.count(k) for k in order}
    if len(set(sizes.values())) != 1:
        raise LaunchDataError(f"unbalanced launches: reps per launch id {sizes}")
    key_arr = np.array(keys)
    return np.concatenate([x[key_arr == k] for k in order])


def unit_samples(values: Any, launch_ids: Any, launches: int) -> tuple[str, np.ndarray]:
    """The unit samples: reps when launches == 1, else the mean of each launch's reps (by launch id).

    Returns (unit, samples) with unit "rep" or "launch"; raises LaunchDataError for ids that cannot be
    grouped (None, strings, booleans, floats, a wrong count or unbalanced launches).
    """
    x = np.asarray(values, dtype=float)
    if launches <= 1:
        return "rep", x
    grouped = group_by_launch(x, launch_ids, launches)
    return "launch", grouped.reshape(launches, -1).mean(axis=1)


def log_comb(n: int, k: int) -> float:
    """log C(n, k) via lgamma: C(2n, n) overflows a float from n = 515 on."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def min_attainable_p(n: int, m: int) -> float:
    """Smallest two-sided exact Mann-Whitney p for sizes n, m (no ties); computed in log space."""
    return min(1.0, 2.0 * math.exp(-log_comb(n + m, n)))


def _validate(control: np.ndarray, candidate: np.ndarray, launches: int = 1) -> str | None:
    for name, x in (("control", control), ("candidate", candidate)):
        if launches > 1 and x.ndim == 1 and (x.size < launches or x.size % launches):
            return f"{name} has {x.size} samples: not {launches} launches of equal size"
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
    """Exact two-sided Mann-Whitney U per row; rows with ties use an exact permutation test. Above
    _MAX_EXACT_MWU samples per arm: the tie-corrected normal approximation, named as such."""
    # control: [P, n], candidate: [P, m]
    n, m = control.shape[1], candidate.shape[1]
    if max(n, m) > _MAX_EXACT_MWU:
        res = sps.mannwhitneyu(candidate, control, method="asymptotic", axis=1)
        u, p = np.array(res.statistic, dtype=float), np.array(res.pvalue, dtype=float)
        return u, p, [f"asymptotic (more than {_MAX_EXACT_MWU} samples per arm)"] * control.shape[0]
    res = sps.mannwhitneyu(candidate, control, method="exact", axis=1)
    u, p = np.array(res.statistic, dtype=float), np.array(res.pvalue, dtype=float)
    methods = ["exact"] * control.shape[0]
    both = np.sort(np.concatenate([control, candidate], axis=1), axis=1)
    tied_rows = np.flatnonzero(np.any(np.diff(both, axis=1) == 0, axis=1))
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
    q = [cfg.alpha / 2, 1 - cfg.alpha / 2]
    if b * max(n, m) > _CHUNK_CELLS:
        # Many reps (thousands): the resample means chunk by chunk of resamples, the same draws in the
        # same order as the count matrices below would use, without holding a [B, n] matrix.
        mc = _resample_means(rng, control, b)  # [P, B]
        mt = _resample_means(rng, candidate, b)  # [P, B]
        lo, hi = np.quantile(mt / mc, q, axis=1)
        return lo, hi
    # Resampling with replacement as count matrices: mean of a resample = samples @ counts / n.
    counts_c = _counts(rng.integers(0, n, size=(b, n)), n)  # [B, n]
    counts_t = _counts(rng.integers(0, m, size=(b, m)), m)  # [B, m]
    lows, highs = [], []
    step = max(1, _CHUNK_CELLS // b)
    for start in range(0, control.shape[0], step):
        mc = control[start : start + step] @ counts_c.T / n  # [p, B]
        mt = candidate[start : start + step] @ counts_t.T / m  # [p, B]
        lo, hi = np.quantile(mt / mc, q, axis=1)
        lows.append(lo)
        highs.append(hi)
    return np.concatenate(lows), np.concatenate(highs)


def _resample_means(rng: np.random.Generator, x: np.ndarray, b: int) -> np.ndarray:
    """[P, B]: the means of B resamples (with replacement) of each row of x [P, n], drawn in chunks."""
    p, n = x.shape
    step = max(1, _CHUNK_CELLS // (n * max(p, 1)))
    out = np.empty((p, b))
    for start in range(0, b, step):
        idx = rng.integers(0, n, size=(min(step, b - start), n))  # [k, n]
        out[:, start : start + idx.shape[0]] = x[:, idx].mean(axis=2)
    return out


def _counts(idx: np.ndarray, size: int) -> np.ndarray:
    counts = np.zeros((idx.shape[0], size))
    np.add.at(counts, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    return counts


def arm_variance(
    x: np.ndarray, launches: int = 1, between: Mapping[str, float] | None = None
) -> dict[str, np.ndarray]:
    """Per row of x [P, L*R] (launch-major): the variance of the row's mean, its df and the components.

    L = 1: var(x, ddof=1) / n with n - 1 df; with `between` ({"rel_var", "df"}: the between-launch
    variance relative to the mean squared, known from outside the run, qgate.launch_cv) the one start's
    offset is added: var / n + rel_var * mean^2, df by Satterthwaite (rel_var's df may be inf).
    L >= 2, R >= 2: one-way random effects (module docstring): max(MSB, MSW) / (L R) with the df of the
    mean square used. R = 1: MSB / L with L - 1 df.
    """
    x = np.asarray(x, dtype=float)
    p, n = x.shape
    nan = np.full(p, np.nan)
    out = {"mean": x.mean(axis=1), "msb": nan, "msw": nan, "var_between": nan, "var_within": nan}
    if launches <= 1:
        within = x.var(axis=1, ddof=1) / n
        if between is None:
            return {**out, "var_of_mean": within, "df": np.full(p, n - 1.0)}
        start = np.asarray(between["rel_var"], dtype=float) * out["mean"] ** 2  # a float or one per row
        df = _satterthwaite(within, start, np.full(p, n - 1.0), np.full(p, float(between["df"])))
        df = np.where(start > 0, df, n - 1.0)  # no offset: the reps' own df
        return {
            **out, "var_of_mean": within + start, "df": df, "var_between": start,
            "var_within": x.var(axis=1, ddof=1),
        }  # fmt: skip
    if n % launches:
        raise ValueError(f"{n} samples do not split into {launches} launches")
    r = n // launches
    groups = x.reshape(p, launches, r)
    msb = r * groups.mean(axis=2).var(axis=1, ddof=1)
    if r == 1:  # one rep per launch: MSB alone, no within-launch estimate
        return {**out, "var_of_mean": msb / n, "df": np.full(p, launches - 1.0), "msb": msb}
    msw = groups.var(axis=2, ddof=1).mean(axis=1)
    use_b = msb >= msw
    return {
        **out,
        "var_of_mean": np.where(use_b, msb, msw) / n,
        "df": np.where(use_b, launches - 1.0, launches * (r - 1.0)),
        "msb": msb,
        "msw": msw,
        "var_between": np.maximum(0.0, (msb - msw) / r),
        "var_within": msw,
    }


def mean_interval(mean: Any, var_of_mean: Any, df: Any, alpha: float) -> tuple[Any, Any]:
    """The Welch-t interval of an arm's mean, each bound one-sided at alpha/2 (floats or arrays, from
    arm_variance: launch-aware). The speed floor (qgate.speed.gates) reads it against min_decode_tok_s."""
    half = sps.t.ppf(1 - alpha / 2, df) * np.sqrt(var_of_mean)
    return mean - half, mean + half


def _satterthwaite(a: np.ndarray, b: np.ndarray, df_a: np.ndarray, df_b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a + b) ** 2 / (a**2 / df_a + b**2 / df_b)


def log_ratio_se_df(vc: dict[str, np.ndarray], vt: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """log(mean_t / mean_c), its delta-method se and Satterthwaite df, from two arm_variance records:
    the Welch-t interval of the ratio is exp(log ratio +- t(df) se) (decide_batch, and the looks of
    qgate.speed.sequential with their own critical value)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a_c, a_t = vc["var_of_mean"] / vc["mean"] ** 2, vt["var_of_mean"] / vt["mean"] ** 2
        df = _satterthwaite(a_t, a_c, vt["df"], vc["df"])
        return np.log(vt["mean"] / vc["mean"]), np.sqrt(a_t + a_c), df


def decide_batch(
    control: np.ndarray,
    candidate: np.ndarray,
    cfg: StatsConfig,
    higher_is_better: bool = True,
    launches: int = 1,
    between: Mapping[str, float] | None = None,
    critical_z: float | None = None,
) -> dict[str, Any]:
    """The decision rule on P pairs at once (rows); used by compare_samples and the honesty tests.

    critical_z: the interval of the ratio at this one-sided normal boundary instead of alpha/2 (the
    look a `--until-decided` run stopped at, qgate.speed.sequential: its data are judged as it judged
    them, so stopping early does not inflate the error rates); each bound keeps the tail of that z.

    control: [P, n], candidate: [P, m], all positive and finite (compare_samples checks); with
    launches L >= 2 each row holds L launches of equal size, launch-major; with one launch, `between`
    (arm_variance) adds a between-launch variance known from outside the run to both arms' means (the
    Welch statistics and interval carry it; Mann-Whitney and the bootstrap, on the reps, cannot, and
    "significant" needs all of them). Returns arrays of length P:
    welch_t, welch_p, df, mwu_u, mwu_p, ratio, change_pct, ci_low, ci_high (bootstrap), t_ci_low,
    t_ci_high, log_ratio_se, cv_control, cv_candidate and `code` (index into VERDICTS).
    """
    control = np.asarray(control, dtype=float)
    candidate = np.asarray(candidate, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        vc, vt = arm_variance(control, launches, between), arm_variance(candidate, launches, between)
        mean_c, mean_t = vc["mean"], vt["mean"]
        # Welch on the unit (raw scale): with L = 1 this is scipy's ttest_ind(equal_var=False).
        welch_df = _satterthwaite(vt["var_of_mean"], vc["var_of_mean"], vt["df"], vc["df"])
        welch_t = (mean_t - mean_c) / np.sqrt(vt["var_of_mean"] + vc["var_of_mean"])
        welch_p = 2 * sps.t.sf(np.abs(welch_t), welch_df)
        # The Welch-t interval of the ratio, on its log (delta method).
        log_ratio, se, df = log_ratio_se_df(vc, vt)
        q = sps.t.ppf(1 - cfg.alpha / 2, df) if critical_z is None else sps.t.isf(sps.norm.sf(critical_z), df)
        t_ci_low, t_ci_high = np.exp(log_ratio - q * se), np.exp(log_ratio + q * se)
        mwu_u, mwu_p, methods = _mwu_batch(control, candidate)
        ci_low, ci_high = _bootstrap_ratio_ci(control, candidate, cfg)
        ratio = mean_t / mean_c
        # The CV of the reps with the sample sd (ddof=1), the estimate the max_cv_pct limit is about.
        cv_c = 100 * control.std(axis=1, ddof=1) / mean_c
        cv_t = 100 * candidate.std(axis=1, ddof=1) / mean_t
    change = 100 * (ratio - 1)
    good = change if higher_is_better else -change
    # The Welch-t interval of the ratio must exclude 1 too, so a "regressed" never comes with an interval
    # that includes no change (raw-scale Welch and the log-ratio interval can disagree at large CVs).
    significant = (welch_p < cfg.alpha) & (mwu_p < cfg.alpha) & ((ci_low > 1) | (ci_high < 1))
    significant &= (t_ci_low > 1) | (t_ci_high < 1)
    improved = significant & (good > 0) & (good >= cfg.min_effect_pct)
    regressed = significant & (good < 0) & (-good >= cfg.min_effect_pct)
    noisy = (cv_c > cfg.max_cv_pct) | (cv_t > cfg.max_cv_pct)
    underpowered = min_attainable_p(control.shape[1], candidate.shape[1]) >= cfg.alpha
    broken = ~(np.isfinite(welch_p) & np.isfinite(mwu_p) & np.isfinite(ci_low) & np.isfinite(ci_high))
    broken |= ~(np.isfinite(ratio) & np.isfinite(welch_t) & np.isfinite(t_ci_low) & np.isfinite(t_ci_high))
    code = np.select(
        [broken, regressed, noisy | underpowered, improved],
        [VERDICTS.index(ERROR), VERDICTS.index(REGRESSED), VERDICTS.index(INCONCLUSIVE), 0],
        default=VERDICTS.index(NO_CHANGE),
    )
    return {
        "welch_t": welch_t,
        "welch_p": welch_p,
        "df": df,
        "welch_df": welch_df,
        "mwu_u": mwu_u,
        "mwu_p": mwu_p,
        "mwu_method": np.array(methods, dtype=object),
        "ratio": ratio,
        "change_pct": change,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "t_ci_low": t_ci_low,
        "t_ci_high": t_ci_high,
        "log_ratio_se": se,
        "cv_control": cv_c,
        "cv_candidate": cv_t,
        "noisy": noisy,
        "significant": significant,
        "code": code,
        "var_control": vc,
        "var_candidate": vt,
    }


def _reason(verdict: str, row: dict[str, Any], cfg: StatsConfig, n: int, m: int) -> str:
    ci = f"{100 * (1 - cfg.alpha):g} % CI of ratio [{row['ci_low']:.4f}, {row['ci_high']:.4f}]"
    tests = f"Welch p={row['welch_p']:.3g}, Mann-Whitney p={row['mwu_p']:.3g}, {ci}"
    if verdict == ERROR:
        return f"a statistic could not be computed ({tests})"
    noise = (
        f"CV control {row['cv_control']:.2f} %, candidate {row['cv_candidate']:.2f} % "
        f"(limit {cfg.max_cv_pct:g} %)"
    )
    if verdict == INCONCLUSIVE:
        if min_attainable_p(n, m) >= cfg.alpha:
            return (
                f"{n} v {m} samples cannot reach alpha {cfg.alpha:g}: the smallest exact Mann-Whitney "
                f"p is {min_attainable_p(n, m):.3g}"
            )
        return f"too noisy: {noise}"
    change = f"change {row['change_pct']:+.2f} %"
    if verdict in (IMPROVED, REGRESSED):
        extra = f"; {noise}" if row["noisy"] else ""
        return f"{change}, significant at alpha {cfg.alpha:g} ({tests}){extra}"
    if row["significant"]:
        return f"{change} is significant but below the practical floor {cfg.min_effect_pct:g} % ({tests})"
    return f"{change}, not significant at alpha {cfg.alpha:g} ({tests})"


def _components(v: dict[str, np.ndarray], launches: int, n: int) -> Components:
    mean = float(v["mean"][0])

    def opt(key: str) -> float | None:
        val = float(v[key][0])
        return val if math.isfinite(val) else None

    def cv(var: float | None) -> float | None:
        return None if var is None else 100 * math.sqrt(var) / mean

    units = launches if launches > 1 else n
    var_of_mean = float(v["var_of_mean"][0])
    return Components(
        launches=launches,
        reps_per_launch=n // launches,
        unit="launch" if launches > 1 else "rep",
        units=units,
        mean=mean,
        var_between=opt("var_between"),
        var_within=opt("var_within"),
        cv_between_pct=cv(opt("var_between")),
        cv_within_pct=cv(opt("var_within")),
        ms_between=opt("msb"),
        ms_within=opt("msw"),
        var_of_mean=var_of_mean,
        df=float(v["df"][0]),
        unit_cv_pct=100 * math.sqrt(var_of_mean * units) / mean,
    )


def error_record(metric: str, reason: str, higher_is_better: bool = True, unit: str = "rep") -> MetricStats:
    """The record of a comparison that could not be made (bad input found before the statistics)."""
    return MetricStats(
        metric=metric,
        higher_is_better=higher_is_better,
        unit=unit,
        verdict=ERROR,
        reason=reason,
        error=reason,
    )


def compare_samples(
    control: Any,
    candidate: Any,
    cfg: StatsConfig,
    metric: str = "decode_tok_s",
    higher_is_better: bool = True,
    unit: str = "rep",
    launches: int = 1,
    between: Mapping[str, float] | None = None,
    critical_z: float | None = None,
) -> MetricStats:
    """Compare one metric's samples of two arms; never raises for bad data, returns an error record.

    launches L >= 2: each arm's samples are its L * R reps, launch-major (`group_by_launch`), and the
    unit is the launch (one-way random effects). launches = 1: the samples are the units as given;
    `between` ({"rel_var", "df"}, arm_variance) adds a between-launch variance known from outside;
    critical_z (decide_batch): the ratio's interval at a sequential look's boundary.
    """
    between = None if launches > 1 or between is None else {k: float(between[k]) for k in ("rel_var", "df")}
    unit = "launch" if launches > 1 else unit
    base: dict[str, Any] = {
        "metric": metric,
        "higher_is_better": higher_is_better,
        "unit": unit,
        "launches": launches,
    }
    settings: dict[str, Any] = {
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
    problem = _validate(c, t, launches)
    if problem is not None:
        sums: dict[str, Any] = {}  # control / candidate: Summary
        if c.ndim == 1 and c.size and np.all(np.isfinite(c)):
            sums["control"] = summarize(c)
        if t.ndim == 1 and t.size and np.all(np.isfinite(t)):
            sums["candidate"] = summarize(t)
        return MetricStats(**base, verdict=ERROR, reason=problem, error=problem, **sums, **settings)
    out = decide_batch(c[None, :], t[None, :], cfg, higher_is_better, launches, between, critical_z)
    row = {k: (v[0] if isinstance(v, np.ndarray) else v) for k, v in out.items()}
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
        t_ci_low=float(row["t_ci_low"]),
        t_ci_high=float(row["t_ci_high"]),
        log_ratio_se=float(row["log_ratio_se"]),
        df=float(row["df"]),
        control_components=_components(out["var_control"], launches, c.size),
        candidate_components=_components(out["var_candidate"], launches, t.size),
        between=between,
        **settings,
    )


MeansFn = Callable[[Mapping[str, Any]], Any]


def bootstrap_estimate(data: Mapping[str, np.ndarray], fn: MeansFn, cfg: StatsConfig) -> dict[str, Any]:
    """A function of arm means, with its seeded percentile bootstrap (1 - alpha) CI.

    Each arm is resampled independently (arms are separate engine starts). fn receives a mapping of arm
    name -> mean (a float for the estimate, an array of B resampled means for the CI) and must be
    written with array arithmetic. An arm with fewer than 2 finite samples gives an error record.
    (_bootstrap_ratio_ci is the batched special case fn = candidate / control, shared indices per row.)
    """
    for name, x in data.items():
        if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
            finite = int(np.isfinite(x).sum())
            msg = f"arm {name}: {finite} finite of {x.size} sample(s), a bootstrap CI needs at least 2"
            return {"estimate": None, "ci_low": None, "ci_high": None, "error": msg}
    rng = np.random.default_rng(cfg.seed)
    resampled = {}
    for name in sorted(data):  # fixed order: the same seed gives the same CI
        x = data[name]
        resampled[name] = x[rng.integers(0, x.size, size=(cfg.bootstrap_resamples, x.size))].mean(axis=1)
    estimate = float(fn({k: float(v.mean()) for k, v in data.items()}))
    dist = np.asarray(fn(resampled), dtype=float)
    lo, hi = np.quantile(dist, [cfg.alpha / 2, 1 - cfg.alpha / 2])
    if not (np.isfinite(estimate) and np.isfinite(lo) and np.isfinite(hi)):
        return {"estimate": None, "ci_low": None, "ci_high": None, "error": "non-finite bootstrap"}
    return {"estimate": estimate, "ci_low": float(lo), "ci_high": float(hi), "error": None}
