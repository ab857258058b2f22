"""qgate.stats: known values, independent re-computations, failure records and the honesty simulation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from qgate.stats import (
    ERROR,
    IMPROVED,
    INCONCLUSIVE,
    NO_CHANGE,
    REGRESSED,
    VERDICTS,
    StatsConfig,
    arm_variance,
    compare_samples,
    decide_batch,
    min_attainable_p,
    unit_samples,
    units_for_non_inferiority,
)

CTRL = [10.1, 10.4, 9.8, 10.0, 10.3, 10.2]
CAND = [10.9, 11.2, 10.7, 11.5, 10.8]
CFG = StatsConfig()


def test_welch_matches_known_scipy_value_and_the_formula() -> None:
    rec = compare_samples(CTRL, CAND, CFG)
    # Known value (scipy 1.17 ttest_ind(CAND, CTRL, equal_var=False)), and the textbook formula.
    assert rec.welch_t == pytest.approx(5.190799758468916, rel=1e-12)
    assert rec.welch_p == pytest.approx(0.001433287940692585, rel=1e-10)
    x, y = np.array(CTRL), np.array(CAND)
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    t = (y.mean() - x.mean()) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    assert rec.welch_t == pytest.approx(t, rel=1e-12)
    assert rec.welch_p == pytest.approx(2 * sps.t.sf(abs(t), df), rel=1e-10)
    assert compare_samples([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], CFG).welch_p == pytest.approx(
        0.34659350708733416
    )


def _brute_force_mwu_p(control: list[float], candidate: list[float]) -> tuple[float, float]:
    """Two-sided exact p by enumerating every split of the pooled sample (ties count 1/2)."""
    pooled = np.array(control + candidate)
    m = len(candidate)

    def u_of(cand: np.ndarray, ctrl: np.ndarray) -> float:
        return float((cand[:, None] > ctrl[None, :]).sum() + 0.5 * (cand[:, None] == ctrl[None, :]).sum())

    u_obs = u_of(np.array(candidate), np.array(control))
    us = []
    for idx in itertools.combinations(range(pooled.size), m):
        mask = np.zeros(pooled.size, bool)
        mask[list(idx)] = True
        us.append(u_of(pooled[mask], pooled[~mask]))
    us = np.array(us)
    p = min(1.0, 2 * min(np.mean(us >= u_obs - 1e-9), np.mean(us <= u_obs + 1e-9)))
    return u_obs, p


def test_mann_whitney_exact_matches_enumeration_and_known_value() -> None:
    rec = compare_samples(CTRL, CAND, CFG)
    assert rec.mwu_method == "exact"
    assert rec.mwu_u == 30.0
    assert rec.mwu_p == pytest.approx(0.004329004329004329)  # 2 / C(11, 5)
    ctrl, cand = [1.0, 2.0, 3.5, 4.0, 0.5], [3.0, 4.5, 5.0, 6.0, 2.5]
    u, p = _brute_force_mwu_p(ctrl, cand)
    rec = compare_samples(ctrl, cand, CFG)
    assert (rec.mwu_u, rec.mwu_p) == (pytest.approx(u), pytest.approx(p))


def test_mann_whitney_with_ties_is_exact_by_permutation() -> None:
    ctrl, cand = [1.0, 2.0, 3.0, 4.0, 0.5], [3.0, 4.0, 5.0, 6.0, 2.5]
    u, p = _brute_force_mwu_p(ctrl, cand)
    rec = compare_samples(ctrl, cand, CFG)
    assert rec.mwu_method == "exact permutation (ties)"
    assert (rec.mwu_u, rec.mwu_p) == (pytest.approx(u), pytest.approx(p))


def test_bootstrap_ci_is_seeded_and_brackets_the_ratio() -> None:
    a = compare_samples(CTRL, CAND, CFG)
    b = compare_samples(CTRL, CAND, CFG)
    c = compare_samples(CTRL, CAND, StatsConfig(seed=1))
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    assert a.ratio == pytest.approx(np.mean(CAND) / np.mean(CTRL))
    assert a.ci_low < a.ratio < a.ci_high
    # The percentile CI can never leave the range of attainable resample ratios.
    assert a.ci_low >= min(CAND) / max(CTRL) and a.ci_high <= max(CAND) / min(CTRL)
    assert a.ci_level == pytest.approx(0.95)


def test_batch_rows_equal_single_calls() -> None:
    rng = np.random.default_rng(3)
    ctrl, cand = rng.normal(100, 3, (4, 5)), rng.normal(103, 3, (4, 5))
    out = decide_batch(ctrl, cand, CFG)
    for i in range(4):
        rec = compare_samples(ctrl[i], cand[i], CFG)
        assert rec.verdict == VERDICTS[out["code"][i]]
        assert (rec.ci_low, rec.welch_p, rec.mwu_p) == (out["ci_low"][i], out["welch_p"][i], out["mwu_p"][i])


def test_clear_effects_in_both_directions() -> None:
    assert compare_samples(CTRL, CAND, CFG).verdict == IMPROVED
    assert compare_samples(CAND, CTRL, CFG).verdict == REGRESSED
    # Lower is better (TTFT): a lower candidate is an improvement.
    assert compare_samples(CAND, CTRL, CFG, "ttft_ms", higher_is_better=False).verdict == IMPROVED


def test_significant_but_below_the_practical_floor_is_no_change() -> None:
    ctrl = [100.0, 100.1, 99.9, 100.05, 99.95]
    cand = [101.0, 101.1, 100.9, 101.05, 100.95]  # +1 %, very significant
    rec = compare_samples(ctrl, cand, StatsConfig(min_effect_pct=2.0))
    assert rec.verdict == NO_CHANGE and "below the practical floor" in rec.reason
    assert compare_samples(ctrl, cand, StatsConfig(min_effect_pct=0.5)).verdict == IMPROVED


def test_noise_above_the_limit_is_inconclusive() -> None:
    ctrl, cand = [100, 130, 80, 110, 95], [150, 190, 120, 160, 140]
    rec = compare_samples(ctrl, cand, StatsConfig(max_cv_pct=10))
    assert rec.verdict == INCONCLUSIVE and "too noisy" in rec.reason
    assert compare_samples(ctrl, cand, StatsConfig(max_cv_pct=50)).verdict == IMPROVED


@pytest.mark.parametrize("n", [2, 3])
def test_too_few_units_cannot_be_significant(n: int) -> None:
    assert min_attainable_p(n, n) >= 0.05
    rec = compare_samples([100.0, 101.0, 99.0][:n], [200.0, 201.0, 199.0][:n], CFG)
    assert rec.verdict == INCONCLUSIVE and "cannot reach alpha" in rec.reason


@pytest.mark.parametrize(
    ("ctrl", "cand", "why"),
    [
        ([], [1.0, 2.0], "no samples"),
        ([1.0, 2.0], [], "no samples"),
        ([1.0, float("nan"), 2.0], [1.0, 2.0, 3.0], "non-finite"),
        ([1.0, 2.0, 3.0], [1.0, float("inf"), 3.0], "non-finite"),
        ([5.0, 5.0, 5.0], [6.0, 6.0, 6.0], "zero variance"),
        ([1.0], [1.0, 2.0], "at least 2"),
        ([1.0, -2.0, 3.0], [1.0, 2.0, 3.0], "non-positive"),
        (["a", "b"], [1.0, 2.0], "not numbers"),
    ],
)
def test_a_statistic_that_cannot_be_computed_is_an_error_record(ctrl: list, cand: list, why: str) -> None:
    rec = compare_samples(ctrl, cand, CFG)
    assert rec.verdict == ERROR
    assert rec.error is not None and why in rec.error
    assert rec.to_dict()["verdict"] == ERROR  # and the record stays JSON-safe


def test_records_are_immutable_and_json_safe() -> None:
    rec = compare_samples(CTRL, CAND, CFG)
    with pytest.raises(AttributeError):
        rec.verdict = "improved"  # type: ignore[misc]
    d = compare_samples([1.0, float("nan")], [1.0, 2.0], CFG).to_dict()
    assert d["control"] is None and d["candidate"]["samples"] == [1.0, 2.0]


def test_launch_is_the_unit_when_there_are_several() -> None:
    values = [10.0, 12.0, 20.0, 22.0, 30.0, 34.0]
    assert unit_samples(values, [0, 0, 1, 1, 2, 2], 1)[0] == "rep"
    unit, samples = unit_samples(values, [2, 2, 0, 0, 1, 1], 3)
    assert unit == "launch"
    assert samples.tolist() == [21.0, 32.0, 11.0]


def _simulate(rng: np.random.Generator, cv: float, pairs: int, effect: float = 0.0, skewed: bool = False):
    if skewed:
        # Right-skewed step times give left-skewed tok/s: tok/s = 1 / lognormal step time.
        sigma = math.sqrt(math.log(1 + cv**2))
        ctrl = 100 / rng.lognormal(0, sigma, (pairs, 5))
        cand = 100 * (1 + effect) / rng.lognormal(0, sigma, (pairs, 5))
        return ctrl, cand
    return rng.normal(100, 100 * cv, (pairs, 5)), rng.normal(
        100 * (1 + effect), 100 * (1 + effect) * cv, (pairs, 5)
    )


@pytest.mark.parametrize(
    ("cv", "skewed", "cfg"),
    [
        # max_cv raised and no practical floor: the significance rule alone is on trial (2,000
        # resamples, the contract may set as few as 100, to keep the run short).
        (0.15, True, StatsConfig(max_cv_pct=100, min_effect_pct=0.0, bootstrap_resamples=2000)),
        (0.02, False, StatsConfig(min_effect_pct=0.0)),
    ],
)
def test_aa_false_positive_rate_is_at_most_alpha(cv: float, skewed: bool, cfg: StatsConfig) -> None:
    """10,000 simulated A/A pairs of 5 v 5: 'improved' or 'regressed' at most alpha of the time."""
    ctrl, cand = _simulate(np.random.default_rng(20260828), cv, 10_000, skewed=skewed)
    out = decide_batch(ctrl, cand, cfg)
    code = out["code"]
    false_pos = np.isin(code, [VERDICTS.index(IMPROVED), VERDICTS.index(REGRESSED)]).mean()
    assert false_pos <= cfg.alpha, false_pos
    assert not np.any(code == VERDICTS.index(ERROR))
    # The simulation can tell an anti-conservative rule: the 5 v 5 percentile bootstrap alone is one.
    boot_alone = ((out["ci_low"] > 1) | (out["ci_high"] < 1)).mean()
    assert boot_alone > cfg.alpha


def test_aa_with_contract_defaults_at_high_noise_is_inconclusive_not_significant() -> None:
    ctrl, cand = _simulate(np.random.default_rng(7), 0.15, 2_000)
    out = decide_batch(ctrl, cand, StatsConfig())
    code = out["code"]
    # Noise withholds every verdict but a significant regression (which stands on a noisy machine).
    assert np.mean(code == VERDICTS.index(INCONCLUSIVE)) > 0.85
    assert np.isin(code, [0, 1]).mean() <= 0.05
    assert not np.any((code == VERDICTS.index(IMPROVED)) & out["noisy"])


def test_a_20_percent_effect_at_cv_2_percent_is_detected() -> None:
    rng = np.random.default_rng(11)
    for effect, want in ((0.20, IMPROVED), (-0.20, REGRESSED)):
        ctrl, cand = _simulate(rng, 0.02, 1_000, effect=effect)
        out = decide_batch(ctrl, cand, CFG)
        assert np.mean(out["code"] == VERDICTS.index(want)) >= 0.99
        excludes_one = (out["ci_low"] > 1) if effect > 0 else (out["ci_high"] < 1)
        assert excludes_one.all()


# ---- calibration of the non-inferiority bound and of launches as the unit (issue 16) ----------------
# Seeded simulations with qgate's own decide_batch; each prints its rates (pytest -s shows them).
# Monte-Carlo allowance: three binomial standard errors of the rate under test.

DRAWS = 10_000
SIM_CFG = StatsConfig(max_cv_pct=1000, min_effect_pct=0.0, bootstrap_resamples=1000)
CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"


def _mc(rate: float, draws: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / draws)


def _launch_sim(
    rng: np.random.Generator,
    draws: int,
    launches: int,
    reps: int,
    within: float,
    between: float,
    ratio: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Arms of `launches` engine starts x `reps` reps (launch-major): each start has its own offset."""

    def arm(mean: float) -> np.ndarray:
        offset = rng.normal(0, between, (draws, launches, 1))
        noise = rng.normal(0, within, (draws, launches, reps))
        return (mean * (1 + offset) * (1 + noise)).reshape(draws, launches * reps)

    return arm(100.0), arm(100.0 * ratio)


@pytest.mark.parametrize(
    ("cv", "margin_pct", "skewed"),
    [(0.01, 2.0, False), (0.05, 10.0, False), (0.15, 10.0, False), (0.15, 30.0, False), (0.15, 10.0, True)],
)
def test_non_inferiority_bound_at_the_margin_passes_at_most_alpha_over_2(
    cv: float, margin_pct: float, skewed: bool
) -> None:
    """5 v 5 reps, the candidate truly `margin` slower: the Welch-t bound clears the floor <= alpha/2
    (normal reps, and left-skewed tok/s from lognormal step times)."""
    rng = np.random.default_rng(1600 + int(1000 * cv + margin_pct) + skewed)
    floor = 1 - margin_pct / 100
    if skewed:
        ctrl, cand = _simulate(rng, cv, DRAWS, effect=-margin_pct / 100, skewed=True)
    else:
        ctrl, cand = _launch_sim(rng, DRAWS, 1, 5, cv, 0.0, floor)
    out = decide_batch(ctrl, cand, SIM_CFG)
    t_rate = float(np.mean(out["t_ci_low"] >= floor))
    boot_rate = float(np.mean(out["ci_low"] >= floor))
    print(
        f"\nNI at the margin, CV {100 * cv:g} %{' skewed' if skewed else ''}, margin {margin_pct:g} %: "
        f"Welch-t bound passes {t_rate:.4f}, "
        f"percentile bootstrap would pass {boot_rate:.4f} (target <= {SIM_CFG.alpha / 2:g})"
    )
    assert t_rate <= SIM_CFG.alpha / 2 + _mc(SIM_CFG.alpha / 2, DRAWS)
    assert not np.any(out["code"] == VERDICTS.index(ERROR))


@pytest.mark.parametrize("cv", [0.01, 0.05, 0.15])
def test_aa_false_change_rate_per_cv(cv: float) -> None:
    """5 v 5 reps A/A: improved or regressed at most alpha; a candidate as fast passes a 2 x CV margin most of
    the time (the bound is not so conservative that it never passes)."""
    rng = np.random.default_rng(1700 + int(1000 * cv))
    ctrl, cand = _launch_sim(rng, DRAWS, 1, 5, cv, 0.0, 1.0)
    out = decide_batch(ctrl, cand, SIM_CFG)
    claims = float(np.isin(out["code"], [0, 1]).mean())
    print(f"\nA/A 5 v 5 reps, CV {100 * cv:g} %: false changes {claims:.4f} (alpha {SIM_CFG.alpha:g})")
    assert claims <= SIM_CFG.alpha + _mc(SIM_CFG.alpha, DRAWS)
    floor = 1 - 2 * cv
    power = float(np.mean(out["t_ci_low"] >= floor))
    print(f"  non-inferiority at a {200 * cv:g} % margin shown for a candidate as fast: {power:.3f}")
    assert power > 0.5


def _cpu_contract_speed() -> dict:
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    return data["speed"]


@pytest.mark.parametrize("between", [0.0, 0.10])
def test_aa_with_launch_offsets_at_the_cpu_contract_settings(between: float) -> None:
    """Launch offsets of sd `between` (engine starts differ), within-launch CV 5 %, the smoke contract's
    launches x reps and stats: A/A claims a change at most alpha of the time; a candidate truly slower
    by the margin passes the bound at most alpha/2. With the same reps in one launch per arm the
    offsets make the A/A claim changes far more often: the simulation can tell."""
    speed = _cpu_contract_speed()
    launches, reps = int(speed.get("launches", 1)), int(speed["repetitions"])
    assert launches >= 2, "the CPU contract runs several engine starts per arm"
    cfg = StatsConfig(**{**speed["stats"], "bootstrap_resamples": 1000})
    margin = float(speed["gates"]["max_decode_regression_pct"])
    rng = np.random.default_rng(1800 + int(100 * between))
    ctrl, cand = _launch_sim(rng, DRAWS, launches, reps, 0.05, between, 1.0)
    out = decide_batch(ctrl, cand, cfg, launches=launches)
    claims = float(np.isin(out["code"], [0, 1]).mean())
    one = decide_batch(*_launch_sim(rng, DRAWS, 1, launches * reps, 0.05, between, 1.0), cfg)
    one_claims = float(np.isin(one["code"], [0, 1]).mean())
    floor = 1 - margin / 100
    slow = decide_batch(
        *_launch_sim(rng, DRAWS, launches, reps, 0.05, between, floor), cfg, launches=launches
    )
    ni = float(np.mean(slow["t_ci_low"] >= floor))
    print(
        f"\nA/A, {launches} launches x {reps} reps, launch offset sd {100 * between:g} %, within CV 5 %: "
        f"false changes {claims:.4f} (one launch of {launches * reps} reps: {one_claims:.4f}); "
        f"slower by the margin {margin:g} %: bound passes {ni:.4f}"
    )
    assert claims <= cfg.alpha + _mc(cfg.alpha, DRAWS)
    assert ni <= cfg.alpha / 2 + _mc(cfg.alpha / 2, DRAWS)
    if between > 0:
        assert one_claims > 3 * cfg.alpha


def test_variance_components_recover_the_simulated_ones() -> None:
    rng = np.random.default_rng(19)
    ctrl, _ = _launch_sim(rng, 4000, 4, 5, 0.05, 0.10, 1.0)
    v = arm_variance(ctrl, 4)
    # E[MSW] = s_w^2, E[MSB] = R s_b^2 + s_w^2 on the raw scale (mean 100): components about 5 and 10.
    within = float(np.sqrt(np.mean(v["var_within"])))
    between = float(np.sqrt(np.mean((v["msb"] - v["msw"]) / 5)))
    assert within == pytest.approx(5.0 * 1.0, rel=0.05) and between == pytest.approx(10.0, rel=0.05)
    assert set(np.unique(v["df"])) <= {3.0, 16.0}


def test_sample_size_estimate_reaches_the_margin_in_simulation() -> None:
    """The units the estimate asks for do show non-inferiority at about the promised power."""
    n = units_for_non_inferiority(5.0, 5.0, 5.0, 0.05)
    assert n is not None and 5 < n < 30
    rng = np.random.default_rng(23)
    out = decide_batch(*_launch_sim(rng, 4000, 1, n, 0.05, 0.0, 1.0), SIM_CFG)
    power = float(np.mean(out["t_ci_low"] >= 0.95))
    print(f"\nsample size for CV 5 %, margin 5 %: {n} reps per arm; non-inferiority shown {power:.3f}")
    assert 0.75 <= power <= 0.9
    assert units_for_non_inferiority(5.0, 5.0, 5.0, 0.05, true_ratio=0.94) is None  # beyond the floor
    assert units_for_non_inferiority(5.0, 5.0, 5.0, 0.05, true_ratio=0.98) > n


def test_arm_figures_a_broken_rep_voids_the_figures_over_it() -> None:
    """One arm-figures function (compare, ablate, history): a missing or non-finite rep is None in the
    list and makes the figures over that metric None instead of a summary of the other reps."""
    from qgate.stats import arm_figures, rep_values

    reps = [{"decode_tok_s": 50.0, "tpot_ms": 20.0, "ttft_ms": 5.0}, {"decode_tok_s": 52.0, "tpot_ms": 19.0}]
    reps.append({"decode_tok_s": 48.0, "tpot_ms": 21.0, "ttft_ms": float("inf")})
    figs = arm_figures({"reps": reps})
    assert figs["decode_tok_s"] == [50.0, 52.0, 48.0] and figs["decode_tok_s_min"] == 48.0
    assert figs["decode_tok_s_mean"] == pytest.approx(50.0) and figs["tpot_ms_mean"] == pytest.approx(20.0)
    assert figs["ttft_ms"] == [5.0, None, None] and figs["ttft_ms_median"] is None
    reps[1]["decode_tok_s"] = None
    figs = arm_figures({"reps": reps})
    assert figs["decode_tok_s"] == [50.0, None, 48.0]
    assert figs["decode_tok_s_mean"] is None and figs["decode_tok_s_min"] is None
    assert np.isnan(rep_values({"reps": reps}, "decode_tok_s")[1])
