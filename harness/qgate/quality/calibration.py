"""How often the quality gate FAILs a correct candidate, and how often it catches a broken one.

A seeded simulation over synthetic per-item probabilities (the figures in docs/quality.md come from
`simulate()` with its defaults; tests/test_quality_calibration.py prints them). Each trial draws, for
every item and seed, a control outcome and a candidate outcome as independent Bernoulli draws with the
item's probability (a correct kernel that rounds differently follows another random trajectory, so its
outcome is a fresh draw of the same coin). A broken candidate answers `broken_items` randomly chosen
items never. Rules compared:

- old: one seed, matched misses: FAIL when any candidate miss is on an item the control answered;
- new: the paired exact sign test of qgate.quality.paired at alpha, on `seeds` seeds: FAIL when
  p < alpha; otherwise PASS when the run had the power (`min_power`, from the control's observed
  per-item rates, see `power()`) to catch a candidate that breaks `broken_items` items, else
  INCONCLUSIVE.

The floors (min raw/strict correct) are left out: they judge the model, not the difference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import binom

# A strong model's spread over 16 items: most items near 1, a few between 0.6 and 0.8.
STRONG_MODEL_P = (
    1.0, 1.0, 1.0, 1.0, 1.0, 0.99, 0.99, 0.99, 0.98, 0.98, 0.97, 0.95, 0.9, 0.8, 0.7, 0.6,
)  # fmt: skip


@dataclass(frozen=True)
class RuleRates:
    """Verdict rates of one rule over the trials (fractions that sum to 1)."""

    fail: float
    inconclusive: float
    passed: float


@dataclass(frozen=True)
class Calibration:
    """Simulated false-FAIL and power figures; schema_version 1."""

    items: int
    seeds: int
    alpha: float
    trials: int
    rng_seed: int
    broken_items: int
    item_p: list[float]
    old_correct: RuleRates  # old rule, correct candidate: .fail is the false-FAIL rate
    old_broken: RuleRates  # old rule, broken candidate: .fail is the power
    new_correct: RuleRates
    new_broken: RuleRates
    schema_version: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def _draw(rng: np.random.Generator, p: np.ndarray, trials: int, seeds: int) -> np.ndarray:
    # [trials, seeds, items] booleans: the output is correct
    return rng.random((trials, seeds, p.size)) < p


def _broken_mask(rng: np.random.Generator, trials: int, items: int, k: int) -> np.ndarray:
    # [trials, items]: True on the k items the broken candidate never answers
    order = np.argsort(rng.random((trials, items)), axis=1)
    mask = np.zeros((trials, items), dtype=bool)
    np.put_along_axis(mask, order[:, :k], True, axis=1)
    return mask


def old_rule_fails(ctrl: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """[trials]: the single-seed matched-misses gate fails (first seed only)."""
    return np.any(ctrl[:, 0, :] & ~cand[:, 0, :], axis=1)


def new_rule(ctrl: np.ndarray, cand: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """([trials] FAIL, [trials] INCONCLUSIVE) of the paired exact sign test over all seeds."""
    b = np.sum(ctrl & ~cand, axis=(1, 2))
    c = np.sum(~ctrl & cand, axis=(1, 2))
    n = b + c
    p = np.where(n > 0, binom.sf(b - 1, np.maximum(n, 1), 0.5), 1.0)
    fail = p < alpha
    return fail, ~fail & (b > c)  # (the second: the candidate missed more; the caller decides)


def power(
    item_p: np.ndarray, seeds: int, broken_items: int, alpha: float, trials: int = 2000, rng_seed: int = 0
) -> float:
    """P(the sign test FAILs a candidate that never answers `broken_items` random items), per-item
    probabilities item_p, `seeds` seeds; seeded Monte Carlo (standard error <= 1.2 % at 2,000 trials)."""
    p = np.asarray(item_p, dtype=float)
    k = min(broken_items, p.size)
    rng = np.random.default_rng(rng_seed)
    ctrl = _draw(rng, p, trials, seeds)
    cand = _draw(rng, p, trials, seeds) & ~_broken_mask(rng, trials, p.size, k)[:, None, :]
    return float(new_rule(ctrl, cand, alpha)[0].mean())


def _powered(ctrl: np.ndarray, alpha: float, broken_items: int, min_power: float, cache: dict) -> np.ndarray:
    """[trials]: the control's observed per-item rates give power >= min_power (cached by rate set)."""
    counts = np.sort(ctrl.sum(axis=1), axis=1)
    seeds = ctrl.shape[1]
    out = np.empty(counts.shape[0], dtype=bool)
    for t, row in enumerate(counts):
        key = row.tobytes()
        if key not in cache:
            cache[key] = power(row / seeds, seeds, broken_items, alpha, trials=500) >= min_power
        out[t] = cache[key]
    return out


def _rates(fail: np.ndarray, inconclusive: np.ndarray) -> RuleRates:
    f, i = float(fail.mean()), float(inconclusive.mean())
    return RuleRates(fail=f, inconclusive=i, passed=1.0 - f - i)


def simulate(
    seeds: int = 3,
    alpha: float = 0.05,
    trials: int = 20000,
    rng_seed: int = 20260828,
    broken_items: int = 2,
    item_p: tuple[float, ...] = STRONG_MODEL_P,
    min_power: float = 0.8,
) -> Calibration:
    """False-FAIL rates (correct candidate) and power (broken candidate) of the old and the new rule."""
    if seeds < 1 or trials < 1 or not 0 <= broken_items <= len(item_p):
        raise ValueError(f"seeds {seeds}, trials {trials}, broken_items {broken_items}: out of range")
    rng = np.random.default_rng(rng_seed)
    p = np.asarray(item_p, dtype=float)
    ctrl = _draw(rng, p, trials, seeds)
    cand = _draw(rng, p, trials, seeds)
    broken = cand & ~_broken_mask(rng, trials, p.size, broken_items)[:, None, :]
    no_incon = np.zeros(trials, dtype=bool)
    fail_ok, _ = new_rule(ctrl, cand, alpha)
    fail_broken, _ = new_rule(ctrl, broken, alpha)
    # INCONCLUSIVE: not FAIL and the control's rates give too little power (the same control both times)
    cache: dict = {}
    weak = ~_powered(ctrl, alpha, broken_items, min_power, cache)
    return Calibration(
        items=p.size,
        seeds=seeds,
        alpha=alpha,
        trials=trials,
        rng_seed=rng_seed,
        broken_items=broken_items,
        item_p=[float(x) for x in p],
        old_correct=_rates(old_rule_fails(ctrl, cand), no_incon),
        old_broken=_rates(old_rule_fails(ctrl, broken), no_incon),
        new_correct=_rates(fail_ok, ~fail_ok & weak),
        new_broken=_rates(fail_broken, ~fail_broken & weak),
    )


def table(results: list[Calibration]) -> str:
    """A markdown table of simulate() results (one row per seed count)."""
    lines = [
        "| seeds | old rule false-FAIL | new rule false-FAIL | new rule INCONCLUSIVE (correct) "
        "| old rule power | new rule power (FAIL) | new rule INCONCLUSIVE (broken) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        cells = [r.old_correct.fail, r.new_correct.fail, r.new_correct.inconclusive, r.old_broken.fail,
                 r.new_broken.fail, r.new_broken.inconclusive]  # fmt: skip
        lines.append(f"| {r.seeds} | " + " | ".join(f"{100 * x:.1f} %" for x in cells) + " |")
    return "\n".join(lines)
