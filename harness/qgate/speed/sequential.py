"""The group-sequential speed gate of `qgate run speed --until-decided`: looks, boundaries, stop rule.

Launches are added one interleaved pair (a control and a candidate engine start) at a time; after
each pair, from the contract's launches (at least 2: the launch is the unit) up to --max-launches,
the gate looks at the decode comparison. Two one-sided tests, each at alpha/2 over all looks:

* PASS (non-inferiority shown): the lower bound of the decode ratio clears the margin's floor
  (1 - max_decode_regression_pct / 100) and both arms' CV is within max_cv_pct;
* FAIL (a slowdown shown): the upper bound lies below the margin's floor, or below 1 with a change of
  at least min_effect_pct the wrong way (the fixed design's "significant regression").

The bounds are the Welch-t interval of qgate.stats (log ratio, launch-unit variance, Satterthwaite
df) with the look's critical value instead of t(1 - alpha/2): O'Brien-Fleming-type alpha spending
(Lan-DeMets, f(t) = 2 - 2 Phi(z(1 - a/2) / sqrt(t)) for a one-sided a = alpha/2) over the planned
looks, information t = launches / max launches. The z boundaries come from the exact recursion of the
Brownian motion's density on a grid (no Monte Carlo); a look's z boundary is turned into a t
quantile with the same one-sided tail at the look's df. Early looks are strict, the last one is near
the fixed design's, so the error rates hold across all looks (tests/test_stats.py simulates A/A and
a slowdown equal to the margin) while a clear case stops after few launches. At the last look without
a decision: INCONCLUSIVE.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as sps

SEQUENTIAL_SCHEMA_VERSION = 1
PASS, FAIL, CONTINUE, INCONCLUSIVE = "PASS", "FAIL", "continue", "INCONCLUSIVE"
# Grid of the Brownian motion's value (its sd at t = 1 is 1): at 0.02 the boundaries agree with a
# 0.005 grid to 3e-3 in z (a 10-look design in ~1 s instead of ~30 s).
_GRID_STEP = 0.02
_GRID_LOW = -9.0


def obf_spent(t: float, one_sided: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type alpha spent by information fraction t (one-sided level)."""
    if t <= 0:
        return 0.0
    return float(2 - 2 * sps.norm.cdf(sps.norm.ppf(1 - one_sided / 2) / math.sqrt(t)))


def z_boundaries(fractions: list[float], one_sided: float) -> list[float]:
    """z critical values c_k, one per look (information fractions increasing to 1), such that a
    standard Brownian-motion statistic Z_k = B(t_k) / sqrt(t_k) first crosses c_k at look k with
    probability f(t_k) - f(t_{k-1}) under H0 (obf_spent); the density of B on the continuation region is
    carried from look to look on a grid (trapezoid rule)."""
    out: list[float] = []
    x = np.arange(_GRID_LOW, 9.0, _GRID_STEP)  # the B grid
    dens: np.ndarray | None = None  # density of B at the previous look, on x, zero beyond its boundary
    prev_t, prev_spent = 0.0, 0.0
    for t in fractions:
        spent = obf_spent(t, one_sided)
        target = spent - prev_spent
        if dens is None:
            c = float(sps.norm.isf(target))
        else:
            dt = t - prev_t
            known: np.ndarray = dens  # bound as the default below: not None in this branch

            def crossing(b: float, dens: np.ndarray = known, dt: float = dt, target: float = target) -> float:
                return float(np.trapezoid(dens * sps.norm.sf((b - x) / math.sqrt(dt)), x)) - target

            b = optimize.brentq(crossing, -8.0, 12.0, xtol=1e-9)
            c = b / math.sqrt(t)
        out.append(c)
        b_now = c * math.sqrt(t)
        if dens is None:
            new = sps.norm.pdf(x / math.sqrt(t)) / math.sqrt(t)
        else:
            kernel = sps.norm.pdf((x[:, None] - x[None, :]) / math.sqrt(t - prev_t)) / math.sqrt(t - prev_t)
            new = kernel @ dens * _GRID_STEP  # [y] = sum_x kernel[y, x] dens[x] dx
        dens = np.where(x < b_now, new, 0.0)
        prev_t, prev_spent = t, spent
    return out


@functools.lru_cache(maxsize=64)
def _cached_z(alpha: float, first: int, max_launches: int) -> tuple[float, ...]:
    looks = range(first, max_launches + 1)
    return tuple(z_boundaries([n / max_launches for n in looks], alpha / 2))


@dataclass(frozen=True)
class Design:
    """The planned looks: launches per arm at each look and each look's one-sided z critical value."""

    alpha: float
    first: int
    max_launches: int
    launches: tuple[int, ...]
    z: tuple[float, ...]

    @classmethod
    def plan(cls, alpha: float, first: int, max_launches: int) -> Design:
        looks = tuple(range(first, max_launches + 1))
        return cls(alpha, first, max_launches, looks, _cached_z(alpha, first, max_launches))

    def t_critical(self, look: int, df: Any) -> Any:
        """The look's critical value on the t scale: the same one-sided tail as its z boundary."""
        return sps.t.isf(sps.norm.sf(self.z[look]), df)


def look_decision(
    ratio: Any, se: Any, df: Any, cv_c: Any, cv_t: Any, q: Any, margin_pct: float, min_effect_pct: float,
    max_cv_pct: float,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(decision code: 1 PASS, -1 FAIL, 0 continue; lower; upper) for scalars or arrays of looks."""
    log_r = np.log(ratio)
    with np.errstate(over="ignore"):  # an early look at 1-2 df: a huge critical t, an unbounded interval
        lower, upper = np.exp(log_r - q * se), np.exp(log_r + q * se)
    floor = 1 - margin_pct / 100
    fail = (upper < floor) | ((upper < 1) & (100 * (np.asarray(ratio) - 1) <= -min_effect_pct))
    passed = (lower >= floor) & (cv_c <= max_cv_pct) & (cv_t <= max_cv_pct) & ~fail
    return np.where(fail, -1, np.where(passed, 1, 0)), lower, upper


def simulated_launches(
    rng: np.random.Generator,
    draws: int,
    launches: int,
    reps: int,
    within: float,
    between: float,
    ratio: float,
) -> tuple[np.ndarray, np.ndarray]:
    """A control and a candidate [draws, launches * reps] (launch-major) to run the gates on: every engine
    start offset by N(0, between), every rep by N(0, within), the candidate's mean `ratio` times the
    control's (the control's drawn first). tests/test_stats.py and tools/verdict_odds.py draw with it."""

    def arm(mean: float) -> np.ndarray:
        offset = rng.normal(0, between, (draws, launches, 1))
        noise = rng.normal(0, within, (draws, launches, reps))
        return (mean * (1 + offset) * (1 + noise)).reshape(draws, launches * reps)

    return arm(100.0), arm(100.0 * ratio)


def simulate(
    design: Design, ctrl: np.ndarray, cand: np.ndarray, reps: int, margin_pct: float, min_effect_pct: float,
    max_cv_pct: float,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The design's decisions on simulated arms: ctrl and cand [draws, max_launches * reps] (launch-major,
    the same arms grow launch by launch), looked at as `look_at` does (the launch-unit variance, the
    Welch-t bound at the look's critical value, the CV of the pooled reps). Returns (decision per draw:
    1 PASS, -1 FAIL, 0 INCONCLUSIVE; launches per arm at the stop). tests/test_stats.py checks the error
    rates with it; tools/verdict_odds.py gives a device session's odds of a decision."""
    from qgate.stats import arm_variance, log_ratio_se_df

    draws, last = ctrl.shape[0], design.max_launches
    decision, stop = np.zeros(draws, dtype=int), np.full(draws, last)
    for k, launches in enumerate(design.launches):
        c, t = ctrl[:, : launches * reps], cand[:, : launches * reps]
        log_r, se, df = log_ratio_se_df(arm_variance(c, launches), arm_variance(t, launches))
        cv_c = 100 * c.std(axis=1, ddof=1) / c.mean(axis=1)
        cv_t = 100 * t.std(axis=1, ddof=1) / t.mean(axis=1)
        q = design.t_critical(k, df)
        code, _, _ = look_decision(
            np.exp(log_r), se, df, cv_c, cv_t, q, margin_pct, min_effect_pct, max_cv_pct
        )
        new = (decision == 0) & (code != 0)
        decision[new], stop[new] = code[new], launches
    return decision, stop


@dataclass(frozen=True)
class Look:
    """One look at the data: launches per arm, the decode ratio, its bounds at the look's critical value."""

    look: int
    launches: int
    ratio: float | None
    lower: float | None
    upper: float | None
    critical_t: float | None
    df: float | None
    cv_control_pct: float | None
    cv_candidate_pct: float | None
    decision: str  # PASS / FAIL / continue / INCONCLUSIVE (the last look undecided) / ERROR
    reason: str


def look_at(design: Design, index: int, decode: Any, speed: Any) -> Look:
    """The look `index` of the design on a decode MetricStats (qgate.stats.compare_samples with the
    launches run so far); speed: the contract's speed section."""
    launches = design.launches[index]
    g, st = speed.gates, speed.stats
    last = index == len(design.launches) - 1
    if decode.error is not None or decode.ratio is None or decode.log_ratio_se is None:
        why = f"the decode statistics could not be computed: {decode.error or decode.reason}"
        return Look(index + 1, launches, None, None, None, None, None, None, None, "ERROR", why)
    cv_c, cv_t = decode.control.cv_pct, decode.candidate.cv_pct
    q = float(design.t_critical(index, decode.df))
    code, lower, upper = look_decision(
        decode.ratio, decode.log_ratio_se, decode.df, cv_c, cv_t, q, g.max_decode_regression_pct,
        st.min_effect_pct, st.max_cv_pct,
    )  # fmt: skip
    floor = 1 - g.max_decode_regression_pct / 100
    bounds = f"ratio {decode.ratio:.4f}, bounds [{float(lower):.4f}, {float(upper):.4f}] at t {q:.3f}"
    if int(code) == 1:
        decision, reason = PASS, f"{bounds}: lower bound >= {floor:.4f}, CV within {st.max_cv_pct:g} %"
    elif int(code) == -1:
        decision = FAIL
        reason = f"{bounds}: a slowdown shown (upper bound below {floor:.4f}, or below 1 beyond the floor)"
    else:
        decision = INCONCLUSIVE if last else CONTINUE
        reason = f"{bounds}: neither bound decides" + (" at the last planned look" if last else "")
        if float(lower) >= floor:
            reason = f"{bounds}: the bound clears {floor:.4f} but a CV is above {st.max_cv_pct:g} %"
    return Look(index + 1, launches, decode.ratio, float(lower), float(upper), q, decode.df, cv_c, cv_t,
                decision, reason)  # fmt: skip


def record(design: Design, looks: list[Look]) -> dict[str, Any]:
    """The `sequential` record kept beside the arm results (DIR/speed/sequential.json)."""
    stopped = looks[-1] if looks else None
    done = stopped is not None and stopped.decision != CONTINUE
    return {
        "kind": "sequential",
        "schema_version": SEQUENTIAL_SCHEMA_VERSION,
        "design": {
            "spending": "O'Brien-Fleming-type (Lan-DeMets), two one-sided tests at alpha/2",
            "alpha": design.alpha,
            "first_launches": design.first,
            "max_launches": design.max_launches,
            "planned_launches": list(design.launches),
            "z_boundaries": list(design.z),
        },
        "looks": [asdict(x) for x in looks],
        "decision": stopped.decision if done and stopped is not None else None,
        "stopped_at_launches": stopped.launches if done and stopped is not None else None,
        "reason": stopped.reason if done and stopped is not None else None,
    }
