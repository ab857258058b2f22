"""qgate.stats: known values, independent re-computations, failure records and the honesty simulation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from qgate.sample_size import units_for_non_inferiority
from qgate.speed.sequential import simulated_launches
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


_launch_sim = simulated_launches  # arms of engine starts x reps, each start with its own offset


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
    from qgate.speed.figures import arm_figures, rep_values

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


# ---- issue 29: exact computations without overflow, the smallest count, sample sd, the floor -------


def test_no_overflow_and_no_traceback_at_10000_reps_per_arm() -> None:
    """C(2n, n) overflows a float from n = 515: the smallest p is computed in log space, and the whole
    comparison runs at 10,000 reps per arm (normal-approximation Mann-Whitney, chunked bootstrap)."""
    assert 0 <= min_attainable_p(515, 515) < 1e-300 and min_attainable_p(4, 4) == pytest.approx(2 / 70)
    assert min_attainable_p(10_000, 10_000) == 0.0
    rng = np.random.default_rng(29)
    ctrl, cand = rng.normal(100, 2, 10_000), rng.normal(100, 2, 10_000)
    rec = compare_samples(ctrl, cand, StatsConfig(bootstrap_resamples=200))
    assert rec.verdict == NO_CHANGE and rec.mwu_method.startswith("asymptotic")
    assert rec.ci_low < 1 < rec.ci_high and rec.t_ci_low < 1 < rec.t_ci_high


def test_contract_with_thousands_of_reps_validates(tmp_path: Path) -> None:
    from qgate.contract import load_contract

    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["speed"].update(repetitions=1000, launches=10)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_contract(path).contract.speed.repetitions == 1000


def test_sample_size_is_the_smallest_count_meeting_its_criterion() -> None:
    """Over a grid, n meets the criterion and n - 1 does not (the fixed-point loop returned its last value,
    above the smallest at 260 of 1,440 grid points)."""

    def meets(n: int, cv2: float, delta: float, alpha: float, power: float) -> bool:
        df = 2.0 * (n - 1)
        return n * delta**2 >= cv2 * (sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) ** 2

    checked = 0
    for cv in (0.3, 1.0, 2.0, 5.0, 15.0):
        for margin in (1.0, 2.0, 5.0, 10.0):
            for ratio in (1.0, 0.995, 1.01):
                for alpha in (0.05, 0.01):
                    n = units_for_non_inferiority(cv, cv, margin, alpha, true_ratio=ratio)
                    if n is None:
                        continue
                    cv2 = 2 * (cv / 100) ** 2
                    delta = math.log(ratio) - math.log(1 - margin / 100)
                    assert meets(n, cv2, delta, alpha, 0.8)
                    assert n == 2 or not meets(n - 1, cv2, delta, alpha, 0.8), (cv, margin, ratio, alpha, n)
                    checked += 1
    assert checked > 100


def test_cv_uses_the_sample_sd() -> None:
    ctrl, cand = [100.0, 102.0, 98.0, 101.0, 99.0], [100.5, 101.5, 99.5, 100.0, 98.5]
    rec = compare_samples(ctrl, cand, CFG)
    assert rec.control.std == pytest.approx(float(np.std(ctrl, ddof=1)))
    assert rec.control.cv_pct == pytest.approx(100 * np.std(ctrl, ddof=1) / np.mean(ctrl))
    out = decide_batch(np.array([ctrl]), np.array([cand]), CFG)
    assert out["cv_control"][0] == pytest.approx(rec.control.cv_pct)


@pytest.mark.parametrize("reps", [5, 10, 20])
def test_floor_on_the_mean_fails_at_most_alpha_over_2_one_sd_above_it(reps: int) -> None:
    """A candidate 1 sd (of a rep) above min_decode_tok_s: the floor gate (the mean's Welch-t upper bound
    below the floor) FAILs <= alpha/2 at any rep count; the old every-rep rule fails more often the more
    reps it runs. One 1 sd below the floor is caught with the printed power."""
    from qgate.stats import mean_interval

    rng = np.random.default_rng(2900 + reps)
    floor, sd, alpha = 80.0, 0.44, 0.05
    fails, power = [], []
    for mean in (floor + sd, floor - sd):
        x = rng.normal(mean, sd, (DRAWS, reps))
        v = arm_variance(x)
        _, high = mean_interval(v["mean"], v["var_of_mean"], v["df"], alpha)
        (fails if mean > floor else power).append(float(np.mean(high < floor)))
        if mean > floor:
            old = float(np.mean(np.any(x < floor, axis=1)))
    print(
        f"\nfloor, {reps} reps, 1 sd above: mean-bound FAIL {fails[0]:.4f} (every-rep rule {old:.3f}); "
        f"1 sd below: caught {power[0]:.3f}"
    )
    assert fails[0] <= alpha / 2 + _mc(alpha / 2, DRAWS)
    assert old > 0.5 if reps >= 20 else old > 0.1
    assert power[0] > {5: 0.3, 10: 0.7, 20: 0.95}[reps]


# ---- issue 29: the advice, followed, decides ----------------------------------------------------------


def _gate_verdicts(
    ctrl: np.ndarray, cand: np.ndarray, cfg: StatsConfig, launches: int, margin: float, floor: float | None
) -> tuple[np.ndarray, dict]:
    """Per row 'P' / 'F' / 'I': the speed gates that read the decode statistics (qgate.verdict: no
    significant regression, the margin's bound, the conclusive-comparison gate, the mean floor)."""
    from qgate.stats import mean_interval

    out = decide_batch(ctrl, cand, cfg, launches=launches)
    f = 1 - margin / 100
    vt = out["var_candidate"]
    low, high = mean_interval(vt["mean"], vt["var_of_mean"], vt["df"], cfg.alpha)
    fail = (out["code"] == VERDICTS.index(REGRESSED)) | (out["t_ci_high"] < f)
    undecided = (out["code"] == VERDICTS.index(INCONCLUSIVE)) | (out["t_ci_low"] < f)
    if floor is not None:
        fail |= high < floor
        undecided |= low < floor
    return np.where(fail, "F", np.where(undecided, "I", "P")), out


def _advice_for_row(out: dict, i: int, ctrl: np.ndarray, cand: np.ndarray, launches: int, speed: dict,
                    floor: float | None):  # fmt: skip
    from qgate.sample_size import advise_units

    units = launches if launches > 1 else ctrl.shape[1]
    reps_per_unit = ctrl.shape[1] // units
    vc, vt = out["var_control"], out["var_candidate"]
    cv_unit = [100 * math.sqrt(v["var_of_mean"][i] * units) / v["mean"][i] for v in (vc, vt)]
    floor_z = None
    if floor is not None:
        floor_z = (vt["mean"][i] - floor) / (cv_unit[1] / 100 * vt["mean"][i])
    return advise_units(
        ratio=float(out["ratio"][i]), cv_unit_c=cv_unit[0], cv_unit_t=cv_unit[1],
        cv_rep_c=float(out["cv_control"][i]), cv_rep_t=float(out["cv_candidate"][i]),
        reps_per_unit=reps_per_unit, margin_pct=speed["margin"], alpha=speed["alpha"],
        max_cv_pct=speed["max_cv"], units_now=units, min_units=speed["min_units"], floor_z=floor_z,
        df_c=float(vc["df"][i]), df_t=float(vt["df"][i]),
    )  # fmt: skip


PRODUCTION = {"launches": 1, "reps": 5, "margin": 2.0, "alpha": 0.05, "min_effect": 2.0, "max_cv": 5.0,
              "min_units": 5}  # fmt: skip
CPU = {"launches": 3, "reps": 4, "margin": 10.0, "alpha": 0.05, "min_effect": 5.0, "max_cv": 25.0,
       "min_units": 3}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "speed", "within", "between", "ratio", "floor"),
    [
        ("production, CV 2 %, as fast", PRODUCTION, 0.02, 0.0, 1.0, None),
        ("production, CV 0.5 %, 1 % slower", PRODUCTION, 0.005, 0.0, 0.99, None),
        ("production, CV 3 %, 1 % faster", PRODUCTION, 0.03, 0.0, 1.01, None),
        ("production, CV 1 %, floor 1.5 sd under the mean", PRODUCTION, 0.01, 0.0, 1.0, 98.5),
        ("CPU smoke, within 5 %, launches 5 %, as fast", CPU, 0.05, 0.05, 1.0, None),
        ("CPU smoke, within 5 %, launches 10 %, 5 % slower", CPU, 0.05, 0.10, 0.95, None),
    ],
)
def test_advice_followed_decides_at_least_80_percent(
    name: str, speed: dict, within: float, between: float, ratio: float, floor: float | None
) -> None:
    """A first run at the contract's size; for every INCONCLUSIVE one, the advice from its data; a fresh
    run of the advised size decides (PASS or FAIL) in >= 80 % of the followed advice. The advice is never
    fewer units than were run nor than the contract asks, and capped runs are counted and printed."""
    rng = np.random.default_rng(2929 + len(name))
    cfg = StatsConfig(alpha=speed["alpha"], min_effect_pct=speed["min_effect"], max_cv_pct=speed["max_cv"],
                      bootstrap_resamples=200)  # fmt: skip
    launches, reps, trials = speed["launches"], speed["reps"], 400
    ctrl, cand = _launch_sim(rng, trials, launches, reps, within, between, ratio)
    first, out = _gate_verdicts(ctrl, cand, cfg, launches, speed["margin"], floor)
    advised: dict[int, int] = {}
    capped = 0
    for i in np.flatnonzero(first == "I"):
        a = _advice_for_row(out, int(i), ctrl, cand, launches, speed, floor)
        if a.units is None:
            capped += 1
            assert a.text.startswith("no run of up to")
            continue
        assert a.units >= max(launches if launches > 1 else reps, speed["min_units"])
        advised[a.units] = advised.get(a.units, 0) + 1
    decided = followed = 0
    for units, count in sorted(advised.items()):
        if launches > 1:
            c2, t2 = _launch_sim(rng, count, units, reps, within, between, ratio)
        else:
            c2, t2 = _launch_sim(rng, count, 1, units, within, between, ratio)
        v, _ = _gate_verdicts(c2, t2, cfg, units if launches > 1 else 1, speed["margin"], floor)
        decided += int(np.sum(v != "I"))
        followed += count
    sizes = sorted(u for u, c in advised.items() for _ in range(c))
    median = sizes[len(sizes) // 2] if sizes else None
    rate = decided / followed if followed else float("nan")
    print(
        f"\nadvice, {name}: first run INCONCLUSIVE {np.mean(first == 'I'):.3f}; followed {followed}, "
        f"decided {rate:.3f}, median advice {median} units; capped {capped}"
    )
    assert followed >= 20
    assert rate >= 0.8


# ---- issue 29: the quality power, exact and order-invariant; its seeds advice decides -----------------


def _quality_items(outcomes: np.ndarray, seeds: list[int], numbering: list[int]) -> list[dict]:
    """Item records (qgate.quality.paired) from outcomes [seeds, items]; item j is numbered numbering[j]."""
    return [
        {
            "index": numbering[j],
            "seed": seed,
            "raw_correct": bool(ok),
            "strict_correct": bool(ok),
            "gold": "1",
        }
        for s, seed in enumerate(seeds)
        for j, ok in enumerate(outcomes[s])
    ]


def test_quality_power_is_exact_and_the_verdict_does_not_depend_on_item_order() -> None:
    """The exact power agrees with a 40,000-trial simulation of the rule; renumbering the items changes no
    verdict, power or advice (the Monte-Carlo power flipped 6 % of verdicts at 5 seeds)."""
    from qgate.quality.calibration import STRONG_MODEL_P, _broken_mask, _draw, new_rule, power
    from qgate.quality.paired import paired_test

    p = np.asarray(STRONG_MODEL_P)
    rng = np.random.default_rng(2929)
    for seeds in (3, 5):
        ctrl = _draw(rng, p, 40_000, seeds)
        cand = _draw(rng, p, 40_000, seeds) & ~_broken_mask(rng, 40_000, p.size, 2)[:, None, :]
        simulated = float(new_rule(ctrl, cand, 0.05)[0].mean())
        assert power(p, seeds, 2, 0.05) == pytest.approx(simulated, abs=_mc(simulated, 40_000) + 1e-3)
    seeds = [1, 2, 3, 4, 5]
    flips = 0
    for trial in range(60):
        c, t = _draw(rng, p, 1, 5)[0], _draw(rng, p, 1, 5)[0]
        order = list(range(p.size))
        other = list(rng.permutation(100)[: p.size])
        a = paired_test(_quality_items(c, seeds, order), _quality_items(t, seeds, order), seeds, 0.05)
        b = paired_test(_quality_items(c, seeds, other), _quality_items(t, seeds, other), seeds, 0.05)
        assert (a.verdict, a.power, a.seeds_for_power) == (b.verdict, b.power, b.seeds_for_power), trial
        flips += a.verdict != b.verdict
    assert flips == 0


@pytest.mark.parametrize("first_seeds", [1, 3, 5])
def test_quality_seeds_advice_followed_decides_at_least_80_percent(first_seeds: int) -> None:
    """A correct candidate on the strong model's spread: a first run of `first_seeds` seeds, for each
    INCONCLUSIVE one the advised seeds (from its control's rates), a fresh run of that many: it decides
    (FAIL, or PASS with the power reached) in >= 80 % of the followed advice."""
    from qgate.quality.calibration import STRONG_MODEL_P, _draw, new_rule, power
    from qgate.quality.paired import planning_rates, seeds_for_power

    p, alpha = np.asarray(STRONG_MODEL_P), 0.05
    rng = np.random.default_rng(2930 + first_seeds)
    trials = 150
    ctrl, cand = _draw(rng, p, trials, first_seeds), _draw(rng, p, trials, first_seeds)
    fail, _ = new_rule(ctrl, cand, alpha)
    decided, advised, cache = [], [], {}
    for t in range(trials):
        counts = ctrl[t].sum(axis=0)
        if fail[t] or power(counts / first_seeds, first_seeds, 2, alpha) >= 0.8:
            continue  # decided at once
        key = counts.tobytes()
        if key not in cache:
            rates = {i: {"correct": int(k), "runs": first_seeds} for i, k in enumerate(counts)}
            cache[key] = seeds_for_power(planning_rates(rates), first_seeds, 2, alpha, 0.8)
        k = cache[key]
        assert k is not None and k >= first_seeds
        advised.append(k)
        c2, t2 = _draw(rng, p, 1, k), _draw(rng, p, 1, k)
        decided.append(
            bool(new_rule(c2, t2, alpha)[0][0]) or power(c2[0].sum(axis=0) / k, k, 2, alpha) >= 0.8
        )
    rate = float(np.mean(decided))
    print(
        f"\nquality seeds advice from {first_seeds} seed(s): followed {len(decided)}, decided {rate:.3f}, "
        f"median advice {int(np.median(advised))} seeds"
    )
    assert len(decided) >= 50 and rate >= 0.8


# ---- issue 29: the group-sequential gate (qgate run speed --until-decided) -----------------------------


def _sequential_sim(rng: np.random.Generator, draws: int, ratio: float, speed: dict, within: float,
                    between: float, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(decision per draw: 1 PASS, -1 FAIL, 0 INCONCLUSIVE; launches per arm at the stop) of the
    sequential design on simulated launches (the same arms grow launch by launch)."""
    from qgate.speed.sequential import Design, simulate

    ctrl, cand = _launch_sim(rng, draws, last, speed["reps"], within, between, ratio)  # [draws, last * reps]
    design = Design.plan(speed["alpha"], first, last)
    return simulate(design, ctrl, cand, speed["reps"], speed["margin"], speed["min_effect"], speed["max_cv"])


@pytest.mark.parametrize(
    ("name", "speed", "within", "between", "first", "last"),
    [
        ("CPU smoke contract, 3..10 launches of 4 reps", CPU, 0.05, 0.10, 3, 10),
        ("production limits, 2..12 launches of 5 reps", PRODUCTION, 0.01, 0.005, 2, 12),
    ],
)
def test_sequential_error_rates_hold_across_all_looks(
    name: str, speed: dict, within: float, between: float, first: int, last: int
) -> None:
    """O'Brien-Fleming spending over the looks: an A/A FAILs <= alpha/2 and a candidate slower by exactly
    the margin PASSes <= alpha/2, over all looks; the expected launches per arm are printed against the
    fixed design of the same maximum, and a clear 3-margin slowdown and an A/A mostly stop early."""
    draws, alpha = 4000, speed["alpha"]
    floor = 1 - speed["margin"] / 100
    rng = np.random.default_rng(2931 + first)
    aa, aa_stop = _sequential_sim(rng, draws, 1.0, speed, within, between, first, last)
    at_margin, m_stop = _sequential_sim(rng, draws, floor, speed, within, between, first, last)
    slow, s_stop = _sequential_sim(
        rng, draws, 1 - 3 * speed["margin"] / 100, speed, within, between, first, last
    )
    aa_fail, margin_pass = float(np.mean(aa == -1)), float(np.mean(at_margin == 1))
    print(
        f"\nsequential, {name}, within CV {100 * within:g} %, launch sd {100 * between:g} %: "
        f"A/A FAIL {aa_fail:.4f}, PASS {np.mean(aa == 1):.3f}, mean launches {aa_stop.mean():.2f}; "
        f"slower by the margin PASS {margin_pass:.4f}, mean launches {m_stop.mean():.2f}; "
        f"3 x margin slower FAIL {np.mean(slow == -1):.3f}, mean launches {s_stop.mean():.2f} "
        f"(fixed design: {last} launches per arm)"
    )
    assert aa_fail <= alpha / 2 + _mc(alpha / 2, draws)
    assert margin_pass <= alpha / 2 + _mc(alpha / 2, draws)
    assert np.mean(slow == -1) > 0.9 and s_stop.mean() < last
    assert np.mean(aa == 1) > 0.5 and aa_stop.mean() < last


def test_verdict_odds_plans_a_device_session_from_the_contracts_own_gate(capsys) -> None:
    """tools/verdict_odds.py (docs/evidence/gpu-sessions.md "Next"): the production-shape contract's
    sequential gate on simulated launches. A candidate 10 % faster with engine starts 1 % apart PASSes
    within 6 launches nearly always and stops early; at the 12-layer spread (starts 10 % apart) it almost
    never decides; an equal candidate FAILs at most alpha/2 (+ Monte-Carlo allowance)."""
    import importlib.util
    import sys

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("verdict_odds", REPO / "tools" / "verdict_odds.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    contract = REPO / "contracts" / "qwen38-prodshape-bf16.yaml"
    speed = tool.load_contract(contract).contract.speed
    p_pass, p_fail, _, launches = tool.odds(speed, 6, 0.02, 0.01, 1.10, 2000, 1)
    assert p_pass > 0.99 and p_fail == 0 and launches < 3.5
    p_pass, _, p_inconclusive, _ = tool.odds(speed, 6, 0.02, 0.10, 1.10, 2000, 2)
    assert p_pass < 0.1 and p_inconclusive > 0.85
    _, p_fail, _, _ = tool.odds(speed, 6, 0.02, 0.03, 1.0, 4000, 3)
    assert p_fail <= speed.stats.alpha / 2 + _mc(speed.stats.alpha / 2, 4000)
    # --effects: an ablation's effect by the report's own rule; an equal arm is "improved" <= alpha/2
    assert tool.effect_odds(speed, 4, 0.02, 0.01, 1.08, 1000, 4)["improved"] > 0.95
    assert tool.effect_odds(speed, 4, 0.02, 0.02, 1.0, 2000, 5)["improved"] <= 0.025 + _mc(0.025, 2000)
    sys.argv = ["verdict_odds.py", str(contract), "--max-launches", "4", "--between", "2", "--ratio", "1.1",
                "--draws", "500"]  # fmt: skip
    tool.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{contract}: 4 reps a start, looks at 2..4 launches, margin 2 %")
    assert len(out) == 3 and out[2].split()[:3] == ["2.0", "2.0", "1.100"]
    # bad input: one line on stderr, exit 2, no traceback
    for bad, line in [
        (["/nonexistent.yaml"], "verdict_odds: /nonexistent.yaml: cannot read contract"),
        ([str(contract), "--max-launches", "1"], "verdict_odds: --max-launches 1: at least 2, the first"),
        ([str(contract), "--draws", "0"], "verdict_odds: --draws 0: at least 1"),
        ([str(contract), "--ratio", "0"], "verdict_odds: --within and --between are >= 0 %, --ratio > 0"),
    ]:
        sys.argv = ["verdict_odds.py", *bad]
        with pytest.raises(SystemExit) as exit_:
            tool.main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(line) and err.count("\n") == 1, err
