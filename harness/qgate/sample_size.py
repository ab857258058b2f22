"""How many units per arm a speed verdict needs: sample size and the advice of an undecided verdict.

Built on qgate.stats's unit model (the rep with one engine start per arm, the launch mean with several):
`units_for_non_inferiority` turns the observed noise of the unit into a sample-size estimate, how many
units per arm a margin needs at a given power; `advise_units` is the advice an INCONCLUSIVE verdict
gives, with every gate that can stop a fresh run counted (docs/compare.md, "The advice"). Pure
scipy/numpy: figures in, a number or an immutable Advice out. tests/test_stats.py checks both by
simulation (followed advice decides at least as often as it plans).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from qgate.stats import DEFAULT_POWER, min_attainable_p


def units_for_non_inferiority(
    unit_cv_control_pct: float,
    unit_cv_candidate_pct: float,
    margin_pct: float,
    alpha: float,
    true_ratio: float = 1.0,
    power: float = DEFAULT_POWER,
) -> int | None:
    """Units per arm (reps, or launches of the same size) for the Welch-t bound to clear the margin.

    For a metric where higher is better: the smallest n >= 2 with t(1-alpha/2, df) + t(power, df) <=
    (log(true_ratio) - log(1 - margin)) / se(n), se(n)^2 = (cv_c^2 + cv_t^2) / n, df = 2 (n - 1).
    The criterion is monotone in n (the t quantiles fall as df grows), so a bisection finds the
    smallest n meeting it. None when it cannot be computed or no n up to 10^7 can do it (true_ratio at
    or below the margin's floor).
    """
    floor = 1 - margin_pct / 100
    cv2 = (unit_cv_control_pct / 100) ** 2 + (unit_cv_candidate_pct / 100) ** 2
    if not (0 < floor and true_ratio > floor and math.isfinite(cv2) and cv2 >= 0 and 0 < alpha < 1):
        return None
    delta = math.log(true_ratio) - math.log(floor)
    if cv2 == 0:
        return 2

    def meets(n: int) -> bool:
        df = 2.0 * (n - 1)
        q = float(sps.t.ppf(1 - alpha / 2, df)) + float(sps.t.ppf(power, df))
        return n * delta**2 >= cv2 * q**2

    cap = 10**7
    if not meets(cap):
        return None
    lo, hi = 1, cap  # meets(lo) is False (n = 1 is never enough: no df), meets(hi) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


# The advice (advise_units): sizes scanned up to this many units per arm; beyond it no size is "feasible".
MAX_ADVISED_UNITS = 200
ADVICE_TARGET = 0.8
# The unit CVs are planned at their upper 60 % confidence bound (chi-square on the df of each arm's
# variance): a plug-in CV from 2-4 df is too often low, and advice from it then falls short (in the
# CPU-contract simulation of tests/test_stats.py, followed plug-in advice decided 76 % of the time).
ADVICE_CV_CONFIDENCE = 0.6


@dataclass(frozen=True)
class Advice:
    """What to run next after an undecided speed verdict: units per arm (reps, or launches of the same
    size) such that a fresh run decides (PASS or FAIL) with probability >= ADVICE_TARGET under the
    observed noise, for a candidate as fast as the control and one as fast as observed. units is None
    when no size up to MAX_ADVISED_UNITS does; `text` then says what stops it."""

    units: int | None
    decide_prob: float | None  # planned probability at `units` (the least over the scenarios)
    # "power" (the smallest size reaching ADVICE_TARGET), "units run" or "contract minimum" (a floor on
    # the size that already reaches it); without a size: "CV limit", "floor" or "margin" (what stops it)
    limited_by: str
    text: str


def decide_probability(
    n: Any,
    *,
    ratio: float,
    cv_unit_c: float,
    cv_unit_t: float,
    cv_rep_c: float,
    cv_rep_t: float,
    reps_per_unit: int,
    margin_pct: float,
    alpha: float,
    max_cv_pct: float,
    floor_z: float | None = None,
) -> np.ndarray:
    """Planned probability that a fresh run of n units per arm (array) decides, for a true decode ratio
    `ratio` with the given unit and rep CVs (%). Normal-theory approximations of the gates that can stop
    a verdict: PASS needs the Welch-t bound above the margin's floor, both arms' rep CV (sample sd) under
    max_cv_pct (chi-square with n R - 1 df) and the candidate mean's bound above the speed floor
    (floor_z: (candidate mean - floor) / sd of one candidate unit); FAIL comes from the whole ratio
    interval below the margin's floor or the mean's interval below the speed floor."""
    n = np.asarray(n, dtype=float)
    df = 2.0 * (n - 1)
    q = sps.t.ppf(1 - alpha / 2, df)
    se = np.sqrt(((cv_unit_c / 100) ** 2 + (cv_unit_t / 100) ** 2) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (math.log(ratio) - math.log(1 - margin_pct / 100)) / se
    shown = sps.t.sf(q - z, df)
    inferior = sps.t.cdf(-q - z, df)
    dfr = n * reps_per_unit - 1
    cv_ok = np.ones_like(n)
    for cv in (cv_rep_c, cv_rep_t):
        if cv > 0:
            cv_ok = cv_ok * sps.chi2.cdf(dfr * (max_cv_pct / cv) ** 2, dfr)
    above = below = np.zeros_like(n)
    if floor_z is not None:
        qf = sps.t.ppf(1 - alpha / 2, n - 1)
        above = sps.t.sf(qf - floor_z * np.sqrt(n), n - 1)
        below = sps.t.cdf(-qf - floor_z * np.sqrt(n), n - 1)
    passed = shown * cv_ok * (above if floor_z is not None else 1.0)
    failed = 1 - (1 - inferior) * (1 - below)
    return np.nan_to_num(np.minimum(1.0, passed + failed))


def _cv_inflation(df: float) -> float:
    """sqrt(df / chi2(1 - ADVICE_CV_CONFIDENCE, df)): an sd estimate with df degrees of freedom raised to
    its upper ADVICE_CV_CONFIDENCE confidence bound (1 for unknown or infinite df)."""
    if not (math.isfinite(df) and df > 0):
        return 1.0
    return math.sqrt(df / float(sps.chi2.ppf(1 - ADVICE_CV_CONFIDENCE, df)))


def advise_units(
    *,
    ratio: float,
    cv_unit_c: float,
    cv_unit_t: float,
    cv_rep_c: float,
    cv_rep_t: float,
    reps_per_unit: int,
    margin_pct: float,
    alpha: float,
    max_cv_pct: float,
    units_now: int,
    min_units: int,
    floor_z: float | None = None,
    what: str = "reps",
    df_c: float = math.inf,
    df_t: float = math.inf,
) -> Advice:
    """The smallest units per arm, at least what was run and what the contract asks (and enough reps for
    the exact Mann-Whitney p to reach alpha), at which a fresh run decides with probability >=
    ADVICE_TARGET both for a candidate as fast as the control and for one as fast as observed (`ratio`,
    taken as 1 when above it). The unit CVs are raised to their upper ADVICE_CV_CONFIDENCE bound from
    df_c, df_t (the df of each arm's variance of the mean). Capped at MAX_ADVISED_UNITS with a plain
    sentence."""
    lo = max(2, units_now, min_units)
    while lo <= MAX_ADVISED_UNITS and min_attainable_p(lo * reps_per_unit, lo * reps_per_unit) >= alpha:
        lo += 1
    figures = (ratio, cv_unit_c, cv_unit_t, cv_rep_c, cv_rep_t)
    if not all(math.isfinite(x) and x >= 0 for x in figures) or ratio <= 0:
        return Advice(None, None, "error", "no advice: the observed noise or ratio is not a finite number")
    if lo > MAX_ADVISED_UNITS:
        return Advice(
            None, None, "contract minimum", f"the contract asks for more than {MAX_ADVISED_UNITS} {what}"
        )
    n = np.arange(lo, MAX_ADVISED_UNITS + 1)
    cv_unit_c *= _cv_inflation(df_c)
    cv_unit_t *= _cv_inflation(df_t)
    common: dict[str, Any] = {
        "cv_unit_c": cv_unit_c, "cv_unit_t": cv_unit_t, "cv_rep_c": cv_rep_c, "cv_rep_t": cv_rep_t,
        "reps_per_unit": reps_per_unit, "margin_pct": margin_pct, "alpha": alpha,
        "max_cv_pct": max_cv_pct, "floor_z": floor_z,
    }  # fmt: skip
    scenarios = sorted({1.0, min(ratio, 1.0)})
    prob = np.min([decide_probability(n, ratio=r, **common) for r in scenarios], axis=0)
    ok = np.flatnonzero(prob >= ADVICE_TARGET)
    if ok.size:
        units = int(n[ok[0]])
        limited = "power" if units > lo else ("units run" if lo == units_now else "contract minimum")
        return Advice(units, float(prob[ok[0]]), limited, "")
    # Nothing up to the cap decides: name the gate whose removal would let the largest run decide.
    cap = np.array([float(MAX_ADVISED_UNITS)])
    head = f"no run of up to {MAX_ADVISED_UNITS} {what} per arm decides"
    head += f" with {100 * ADVICE_TARGET:g} % probability"

    def at_cap(**change: Any) -> float:
        return float(min(decide_probability(cap, ratio=r, **{**common, **change})[0] for r in scenarios))

    dfr = MAX_ADVISED_UNITS * reps_per_unit - 1
    cv_pass = math.prod(
        float(sps.chi2.cdf(dfr * (max_cv_pct / cv) ** 2, dfr)) for cv in (cv_rep_c, cv_rep_t) if cv
    )
    if cv_pass < ADVICE_TARGET or at_cap(max_cv_pct=math.inf) >= ADVICE_TARGET:
        worst = max(cv_rep_c, cv_rep_t)
        text = (
            f"{head}: the CV limit stops it (observed rep CV up to {worst:.2f} %, max_cv_pct "
            f"{max_cv_pct:g} %; more reps do not lower a CV): reduce the machine's noise or set a limit "
            "it can meet"
        )
        return Advice(None, float(prob[-1]), "CV limit", text)
    if floor_z is not None and at_cap(floor_z=None) >= ADVICE_TARGET:
        text = f"{head}: the candidate's mean is within {max(floor_z, 0.0):.2f} unit sd of min_decode_tok_s"
        return Advice(None, float(prob[-1]), "floor", text)
    text = (
        f"{head}: the observed ratio {ratio:.4f} is too close to the margin's floor "
        f"{1 - margin_pct / 100:.4f} for this noise (unit CV {cv_unit_c:.2f} % / {cv_unit_t:.2f} %)"
    )
    return Advice(None, float(prob[-1]), "margin", text)
