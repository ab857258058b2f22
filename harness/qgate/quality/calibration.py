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
  INCONCLUSIVE (the power computed exactly, as the gate does).

The floors (min raw/strict correct) are left out: they judge the model, not the difference.
"""

from __future__ import annotations

import functools
import itertools
import math
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


@functools.lru_cache(maxsize=4096)
def _binom_pmf_cut(trials: int, q: float) -> tuple[int, np.ndarray]:
    """(first, pmf[first:last + 1]) of Binomial(trials, q), cut where the pmf is below 1e-17 (the mass
    left off is below 1e-15)."""
    pmf = binom.pmf(np.arange(trials + 1), trials, q)
    keep = np.flatnonzero(pmf > 1e-17)
    return int(keep[0]), pmf[keep[0] : keep[-1] + 1]


def _sum_pmf(parts: list[tuple[int, float]]) -> np.ndarray:
    """pmf of a sum of independent Binomial(trials, q) over 0..sum(trials), by convolution."""
    out, offset = np.ones(1), 0
    for trials, q in parts:
        if trials == 0 or q == 0.0:
            continue
        first, pmf = _binom_pmf_cut(trials, float(q))
        out, offset = np.convolve(out, pmf), offset + first
    return np.concatenate([np.zeros(offset), out])


def _critical_b(n: np.ndarray, alpha: float) -> np.ndarray:
    """Per n: the smallest b with the one-sided sign test p = P(Binomial(n, 1/2) >= b) < alpha (n + 1
    when none), with the same scipy call the gate makes (qgate.quality.paired.sign_test_p)."""
    b = binom.ppf(1 - alpha, n, 0.5).astype(int) + 1
    for _ in range(3):  # settle the float edge: move to the smallest b whose p is < alpha
        b = np.where((b > 0) & (binom.sf(b - 2, n, 0.5) < alpha), b - 1, b)
        b = np.where((b <= n) & ~(binom.sf(b - 1, n, 0.5) < alpha), b + 1, b)
    return b


def power(item_p: np.ndarray, seeds: int, broken_items: int, alpha: float) -> float:
    """P(the sign test FAILs a candidate that never answers `broken_items` random items), per-item
    probabilities item_p, `seeds` seeds, computed exactly (no Monte Carlo) and therefore the same for any
    order of the items: items with equal rates are exchangeable, so the random broken set is summed over
    how many broken items each rate class holds (hypergeometric weights). For each such split the
    discordant pairs of the intact items D ~ sum of Binomial(seeds * n, 2 p (1 - p)) (each goes either
    way with probability 1/2) and the broken items' candidate-only misses B ~ sum of Binomial(seeds * k,
    p); FAIL when b_intact + B reaches the critical count of the sign test over D + B pairs."""
    p = np.asarray(item_p, dtype=float)
    k = min(broken_items, p.size)
    if seeds < 1 or p.size == 0:
        return 0.0
    rates, counts = np.unique(p, return_counts=True)
    total = math.comb(int(p.size), k)
    # fail[D, B]: P(FAIL | D intact discordant pairs, B broken-item misses), for every D and B possible.
    dn, bn = np.arange(seeds * p.size + 1)[:, None], np.arange(seeds * k + 1)[None, :]  # [D, 1], [1, B]
    need = _critical_b(np.arange(dn.size + bn.size), alpha)[dn + bn] - bn  # intact misses still needed
    fail = np.where(need <= 0, 1.0, binom.sf(need - 1, dn, 0.5))  # [D, B]
    out = 0.0
    for split in itertools.combinations_with_replacement(range(rates.size), k):
        taken = np.bincount(np.asarray(split, dtype=int), minlength=rates.size)
        if np.any(taken > counts):
            continue
        weight = math.prod(math.comb(int(c), int(t)) for c, t in zip(counts, taken, strict=True)) / total
        intact = [(seeds * int(c - t), 2 * r * (1 - r)) for r, c, t in zip(rates, counts, taken, strict=True)]
        d = _sum_pmf(intact)
        bb = _sum_pmf([(seeds * int(t), r) for r, t in zip(rates, taken, strict=True)])
        out += weight * float(d @ fail[: d.size, : bb.size] @ bb)
    return min(1.0, out)


def _powered(ctrl: np.ndarray, alpha: float, broken_items: int, min_power: float, cache: dict) -> np.ndarray:
    """[trials]: the control's observed per-item rates give power >= min_power (cached by rate set)."""
    counts = np.sort(ctrl.sum(axis=1), axis=1)
    seeds = ctrl.shape[1]
    out = np.empty(counts.shape[0], dtype=bool)
    for t, row in enumerate(counts):
        key = row.tobytes()
        if key not in cache:
            cache[key] = power(row / seeds, seeds, broken_items, alpha) >= min_power
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
