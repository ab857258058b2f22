"""The prefill (TTFT) gate with the decode gate's treatment (issue 45): the Welch-t interval of the TTFT
ratio, launch-aware, against the limit as a margin; INCONCLUSIVE with one engine start per arm; and the
seeded simulation of its error rates beside the bare ratio of medians it replaces (docs/compare.md,
"The prefill gate"; `pytest -s tests/test_prefill_gate.py -k simulated` prints the table)."""

from __future__ import annotations

import numpy as np
import pytest
from golden import support
from scipy import stats as sps

from qgate.compare import Pair, build_verdict
from qgate.launch_cv import ttft_levels_var
from qgate.speed.gates import PREFILL_FAIL, PREFILL_PASS, prefill_decision
from qgate.stats import arm_variance, log_ratio_se_df


def _prefill(control: dict, candidate: dict) -> dict:
    record = build_verdict([Pair("speed", control, candidate, "c", "t")], [], support.pinned_contract())
    return next(g for g in record["gates"] if g["name"].startswith("prefill (TTFT) regression"))


def test_the_gate_reads_the_interval_not_the_medians() -> None:
    control, candidate = support.load_pair()  # two launches of 5 reps per arm; the limit is 10 %
    gate = _prefill(control, candidate)
    assert gate["passed"] and "upper bound <= 1.1000" in gate["detail"], gate
    for rep in candidate["reps"]:
        rep["ttft_ms"] *= 1.3
    gate = _prefill(control, candidate)
    assert not gate["passed"] and gate["severity"] == "fail" and "whole interval lies above" in gate["detail"]
    # One engine start of the candidate 30 % slower, the other 2 % faster: the launch is the unit, so the
    # interval straddles the limit: INCONCLUSIVE, neither a PASS nor a FAIL.
    control, candidate = support.load_pair()
    for rep in candidate["reps"]:
        rep["ttft_ms"] *= 1.3 if rep["launch"] == 0 else 0.98
    gate = _prefill(control, candidate)
    assert not gate["passed"] and gate["severity"] == "inconclusive" and "straddles" in gate["detail"], gate


def test_one_engine_start_per_arm_cannot_pass_or_fail_the_prefill() -> None:
    control, candidate = (support.one_launch(arm) for arm in support.load_pair())
    for rep in candidate["reps"]:
        rep["ttft_ms"] *= 1.5  # 50 % slower in the one start: still the offset of one start
    gate = _prefill(control, candidate)
    assert not gate["passed"] and gate["severity"] == "inconclusive"
    assert "variance between engine starts is unknown" in gate["detail"]


def test_the_rule_on_arrays() -> None:
    low, high = np.array([0.9, 1.05, 1.2, 1.1]), np.array([1.09, 1.2, 1.3, 1.1])
    assert prefill_decision(low, high, 10.0).tolist() == [PREFILL_PASS, 0, PREFILL_FAIL, PREFILL_PASS]


# ---- the seeded simulation --------------------------------------------------------------------------

SIMS = 8000
WITHIN = 0.02  # rep-to-rep TTFT noise within an engine start
SPREADS = (0.02, 0.05, 0.1)  # sd of an engine start's TTFT offset (placebo pairs on the CPU: -13..+6 %)
SETTINGS = {  # name: (reps a launch, launches per arm, limit %, earlier one-launch nights in the history)
    "production (5 reps x 3 launches, limit 10 %)": (5, 3, 10.0, 0),
    "production reps, 1 launch per arm": (5, 1, 10.0, 0),
    "1 launch per arm, --history of 5 nights": (5, 1, 10.0, 5),
    "1 launch per arm, --history of 20 nights": (5, 1, 10.0, 20),
    "CPU smoke (4 reps x 3 launches, limit 50 %)": (4, 3, 50.0, 0),
}


def _ttft(rng: np.random.Generator, reps: int, launches: int, spread: float, ratio: float) -> np.ndarray:
    """[SIMS, launches * reps] TTFT ms, launch-major: 100 * ratio * exp(start offset + rep noise)."""
    b = rng.normal(0, spread, (SIMS, launches, 1))
    e = rng.normal(0, WITHIN, (SIMS, launches, reps))
    return (100 * ratio * np.exp(b + e)).reshape(SIMS, -1)


def _rates(rng: np.random.Generator, setting: str, spread: float, ratio: float) -> dict[str, float]:
    """FAIL / PASS of the old gate (the ratio of medians against the limit) and of the new one
    (prefill_decision on the Welch-t interval; one launch per arm: neither)."""
    reps, launches, limit, nights = SETTINGS[setting]
    c, t = _ttft(rng, reps, launches, spread, 1.0), _ttft(rng, reps, launches, spread, ratio)
    median_change = 100 * (np.median(t, axis=1) / np.median(c, axis=1) - 1)
    out = {
        "old FAIL": float((median_change > limit).mean()),
        "old PASS": float((median_change <= limit).mean()),
    }
    between = None
    if launches == 1 and not nights:
        out.update({"new FAIL": 0.0, "new PASS": 0.0})  # INCONCLUSIVE: the start's variance is unknown
        return out
    if nights:  # the control's earlier one-launch nights: each a TTFT median, as the history keeps it
        medians = np.median(_ttft(rng, reps, nights, spread, 1.0).reshape(SIMS, nights, reps), axis=2)
        _, upper = ttft_levels_var(np.log(medians))
        between = {"rel_var": upper, "df": np.inf}
    vc, vt = arm_variance(c, launches, between), arm_variance(t, launches, between)
    log_r, se, df = log_ratio_se_df(vc, vt)
    q = sps.t.ppf(0.975, df)
    code = prefill_decision(np.exp(log_r - q * se), np.exp(log_r + q * se), limit)
    out.update(
        {"new FAIL": float((code == PREFILL_FAIL).mean()), "new PASS": float((code == PREFILL_PASS).mean())}
    )
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_simulated_error_rates_of_the_prefill_gate(setting: str) -> None:
    rng = np.random.default_rng(20261206)
    worst_new, worst_old = 0.0, 0.0
    for spread in SPREADS:
        placebo = _rates(rng, setting, spread, 1.0)
        margin = _rates(rng, setting, spread, 1 + SETTINGS[setting][2] / 100)
        print(
            f"{setting} | start sd {100 * spread:g} % | placebo FAIL old {100 * placebo['old FAIL']:.2f} % "
            f"new {100 * placebo['new FAIL']:.2f} % | slower by the limit PASS old "
            f"{100 * margin['old PASS']:.1f} % new {100 * margin['new PASS']:.2f} % | placebo PASS (power) "
            f"new {100 * placebo['new PASS']:.1f} %"
        )
        worst_new = max(worst_new, placebo["new FAIL"], margin["new PASS"])
        worst_old = max(worst_old, margin["old PASS"])
    assert worst_new <= 0.025  # the goal: <= alpha/2 at the margin, the placebo's FAIL far below
    assert worst_old > 0.025  # the ratio of medians passed a TTFT slower by the limit about half the time
