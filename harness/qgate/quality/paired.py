"""Per-item correct rates and the paired exact test of the quality gate. Pure functions on item records.

The unit is the item-seed pair: item i under seed s in the control and item i under seed s in the
candidate. An output is *correct* when both its raw and its strict answer are right (losing the strict
format is a regression too). A pair is *discordant* when exactly one arm is correct:

    b = pairs the control answered and the candidate missed   (evidence of a regression)
    c = pairs the candidate answered and the control missed

If the candidate is as good as the control (H0: within each pair the two outcomes are exchangeable,
which holds for a kernel that only changes rounding and so the sampled trajectory), each discordant
pair is a candidate miss with probability 1/2 whatever the item's own difficulty. The one-sided exact
sign test (exact McNemar) p = P(Binomial(b + c, 1/2) >= b) is therefore exact: a correct candidate is
called a regression with probability <= alpha, for any per-item probabilities and any number of seeds.

Decision:
    p < alpha                       -> "regressed"     (the gate FAILs)
    p >= alpha, power >= min_power  -> "no regression" (the run could have caught the regression the
                                                        contract names, and did not see it)
    p >= alpha, power <  min_power  -> "inconclusive"  (the test cannot reach alpha against that
                                                        regression with the seeds run)

Power: the probability that the test FAILs a candidate that never answers `detect_broken_items` items
(chosen at random), computed exactly (qgate.quality.calibration.power: no Monte Carlo, so the verdict
does not depend on the items' order or numbering) from the control's observed per-item rates with the
seeds run. The seeds advice (`seeds_for_power` on planning rates) is the smallest seed count whose
power reaches min_power when each item's rate is shrunk towards 1/2 by PLAN_PSEUDO_COUNT
((correct + a) / (runs + 2a)): observed rates of 1/1 or 3/3 make the plug-in power optimistic, and
advice from them is too small (followed from one seed, it decided 13 % of the time in simulation;
shrunk, >= 80 %: tests/test_stats.py). `seeds_for_observed` is the seed count at which the observed
discordance (b and c per seed, when b > c) would reach alpha.

Item findings (what the old matched-misses rule becomes): an item the candidate missed under some seed
while the control answered it under every seed is flagged "likely regression"; one the control also
missed under some seed is reported with both rates, not a FAIL by itself. With one seed, an item the
control answered once and the candidate missed is a "new miss" the run cannot judge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import binom

from qgate.quality.calibration import power as exact_power

REGRESSED, INCONCLUSIVE, NO_REGRESSION, ERROR = "regressed", "inconclusive", "no regression", "error"
LIKELY_REGRESSION, BOTH_MISS = "likely regression", "control misses too"
ONE_SEED_MISS = "new miss (one seed: cannot tell)"
MAX_SEEDS_NEEDED = 1000
MAX_SEEDS_FOR_POWER = 64
# Pseudo-count of the planning rates of the seeds advice (module docstring); chosen by the simulation
# in tests/test_stats.py (0: 13 % of followed one-seed advice decided; 0.15: >= 80 % from 1, 3, 5 seeds).
PLAN_PSEUDO_COUNT = 0.15


def seed_of(record: dict[str, Any], frozen_seed: int) -> int:
    """A record's seed; records of schema 1 (one seed, no `seed` key) ran under the frozen seed."""
    seed = record.get("seed", frozen_seed)
    return int(seed)


def is_correct(record: dict[str, Any]) -> bool:
    """Correct = the raw and the strict answer are both right."""
    return record.get("raw_correct") is True and record.get("strict_correct") is True


def item_rates(items: list[dict[str, Any]], frozen_seed: int) -> dict[int, dict[str, int]]:
    """{index: {runs, correct, raw, strict}}: per item, outputs and correct counts over the seeds."""
    out: dict[int, dict[str, int]] = {}
    for r in items:
        row = out.setdefault(int(r["index"]), {"runs": 0, "correct": 0, "raw": 0, "strict": 0})
        row["runs"] += 1
        row["correct"] += int(is_correct(r))
        row["raw"] += int(r.get("raw_correct") is True)
        row["strict"] += int(r.get("strict_correct") is True)
    return dict(sorted(out.items()))


def sign_test_p(b: int, c: int) -> float:
    """One-sided exact sign test: P(Binomial(b + c, 1/2) >= b); 1.0 without discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    return float(binom.sf(b - 1, n, 0.5))


def min_discordant(alpha: float) -> int:
    """The fewest candidate-only misses (with no control-only miss) that reach p < alpha."""
    return max(1, math.floor(math.log(alpha) / math.log(0.5)) + 1)


def seeds_for_power(
    control_p: list[float], seeds_run: int, broken_items: int, alpha: float, min_power: float
) -> int | None:
    """The smallest seed count (>= seeds_run) whose power reaches min_power; None beyond the cap."""
    for k in range(max(1, seeds_run), MAX_SEEDS_FOR_POWER + 1):
        if exact_power(np.asarray(control_p), k, broken_items, alpha) >= min_power:
            return k
    return None


def planning_rates(rates: dict[int, dict[str, int]], pseudo: float = PLAN_PSEUDO_COUNT) -> list[float]:
    """Per item (correct + pseudo) / (runs + 2 pseudo): the rates the seeds advice plans with."""
    return [(r["correct"] + pseudo) / (r["runs"] + 2 * pseudo) for r in rates.values()]


def seeds_needed(b: int, c: int, seeds_run: int, alpha: float) -> int | None:
    """Seeds for which the observed discordance (b and c per seed run, rounded) reaches p < alpha.

    None when b <= c (no regression to confirm) or when more than MAX_SEEDS_NEEDED would be needed.
    """
    if b <= c or seeds_run < 1:
        return None
    for k in range(seeds_run, MAX_SEEDS_NEEDED + 1):
        bk, ck = round(b * k / seeds_run), round(c * k / seeds_run)
        if sign_test_p(bk, ck) < alpha:
            return k
    return None


@dataclass(frozen=True)
class ItemFinding:
    """One item the candidate missed under at least one seed, with both arms' rates."""

    index: int
    gold: str
    control_correct: int
    control_runs: int
    candidate_correct: int
    candidate_runs: int
    finding: str  # LIKELY_REGRESSION, BOTH_MISS or ONE_SEED_MISS


@dataclass(frozen=True)
class PairedTest:
    """The paired comparison of two arms' correctness; schema_version 1 (quality results of schema 2)."""

    verdict: str  # REGRESSED / INCONCLUSIVE / NO_REGRESSION / ERROR
    reason: str
    alpha: float
    seeds: list[int]
    pairs: int
    b_candidate_only_misses: int
    c_control_only_misses: int
    p_one_sided: float | None
    detect_broken_items: int
    min_power: float
    power: float | None  # against detect_broken_items broken items, from the control's rates
    seeds_for_power: int | None  # seeds whose power reaches min_power (None: more than the cap)
    seeds_for_observed: int | None  # seeds at which the observed discordance reaches alpha
    min_discordant_for_alpha: int
    findings: list[ItemFinding] = field(default_factory=list)
    schema_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _error_record(reason: str, alpha: float, seeds: list[int], k: int, min_power: float) -> PairedTest:
    md = min_discordant(alpha) if 0 < alpha < 1 else 0
    return PairedTest(ERROR, reason, alpha, list(seeds), 0, 0, 0, None, k, min_power, None, None, None, md)


def _findings(
    ctrl: dict[int, dict[str, int]], cand: dict[int, dict[str, int]], gold: dict[int, str]
) -> list[ItemFinding]:
    out = []
    for index, rc in cand.items():
        if rc["correct"] == rc["runs"]:
            continue
        rk = ctrl.get(index, {"runs": 0, "correct": 0})
        if rk["runs"] and rk["correct"] == rk["runs"]:
            kind = LIKELY_REGRESSION if rk["runs"] > 1 else ONE_SEED_MISS
        else:
            kind = BOTH_MISS
        g = gold.get(index, "")
        out.append(ItemFinding(index, g, rk["correct"], rk["runs"], rc["correct"], rc["runs"], kind))
    return out


Pairs = dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any]]]


def pair_up(
    control_items: list[dict[str, Any]], candidate_items: list[dict[str, Any]], seeds: list[int]
) -> Pairs | str:
    """{(seed, index): (control record, candidate record)}, or why the arms cannot be paired."""
    keyed = []
    for arm, items in (("control", control_items), ("candidate", candidate_items)):
        by_key: dict[tuple[int, int], dict[str, Any]] = {}
        for r in items:
            key = (seed_of(r, seeds[0]), int(r["index"]))
            if key in by_key:
                return f"{arm}: item {key[1]} seed {key[0]} recorded twice"
            by_key[key] = r
        keyed.append(by_key)
    ctrl, cand = keyed
    if set(ctrl) != set(cand):
        return f"the arms ran different item-seed pairs (e.g. {sorted(set(ctrl) ^ set(cand))[:5]})"
    stray = sorted({s for s, _ in ctrl} - set(seeds))
    if stray:
        return f"outputs under seeds {stray} that the contract does not list"
    if not ctrl:
        return "no item-seed pairs to compare"
    return {k: (ctrl[k], cand[k]) for k in ctrl}


def paired_test(
    control_items: list[dict[str, Any]],
    candidate_items: list[dict[str, Any]],
    seeds: list[int],
    alpha: float,
    detect_broken_items: int = 2,
    min_power: float = 0.8,
) -> PairedTest:
    """The exact one-sided sign test on the discordant item-seed pairs, its power (module docstring)."""

    def _error(reason: str) -> PairedTest:
        return _error_record(reason, alpha, seeds, detect_broken_items, min_power)

    if not seeds:
        return _error("no seeds")
    if not (0 < alpha < 1) or not math.isfinite(alpha) or not (0 < min_power <= 1):
        return _error(f"alpha = {alpha!r}, min_power = {min_power!r}: out of range")
    pairs = pair_up(control_items, candidate_items, seeds)
    if isinstance(pairs, str):
        return _error(pairs)
    b = sum(1 for x, y in pairs.values() if is_correct(x) and not is_correct(y))
    c = sum(1 for x, y in pairs.values() if not is_correct(x) and is_correct(y))
    p = sign_test_p(b, c)
    run = sorted({s for s, _ in pairs}, key=seeds.index)
    rates = item_rates(control_items, seeds[0])
    control_p = [r["correct"] / r["runs"] for r in rates.values()]
    k = min(detect_broken_items, len(control_p))
    pw = exact_power(np.asarray(control_p), len(run), k, alpha)
    if not (math.isfinite(p) and math.isfinite(pw)):
        return _error(f"the sign test p ({p!r}) or its power ({pw!r}) is not a number")
    head = (
        f"{b} candidate-only and {c} control-only misses over {len(pairs)} item-seed pairs "
        f"({len(run)} seed(s)); one-sided exact sign test p = {p:.4g}"
    )
    power_txt = f"power against {k} broken items {100 * pw:.0f} % (from the control's per-item rates)"
    for_power = None
    if p < alpha:
        verdict, reason = REGRESSED, f"{head} < alpha {alpha}: a regression"
    elif pw >= min_power:
        verdict, reason = NO_REGRESSION, f"{head} >= alpha {alpha}, {power_txt}: no regression"
    else:
        for_power = seeds_for_power(planning_rates(rates), len(run), k, alpha, min_power)
        need = f"{for_power} seeds" if for_power else f"more than {MAX_SEEDS_FOR_POWER} seeds"
        verdict = INCONCLUSIVE
        reason = (
            f"{head} >= alpha {alpha}, but {power_txt} < {100 * min_power:.0f} %: "
            f"{len(run)} seed(s) cannot tell; {need} would give that power"
        )
    observed = seeds_needed(b, c, len(run), alpha)
    if b > c and p >= alpha:
        at = f"about {observed} seeds" if observed else f"more than {MAX_SEEDS_NEEDED} seeds"
        reason += f"; the observed discordance would reach alpha at {at}"
    gold = {int(r["index"]): str(r.get("gold", "")) for r in control_items}
    findings = _findings(rates, item_rates(candidate_items, seeds[0]), gold)
    return PairedTest(
        verdict, reason, alpha, run, len(pairs), b, c, p, k, min_power, pw, for_power, observed,
        min_discordant(alpha), findings,
    )  # fmt: skip


def single_seed_caveat(alpha: float) -> str:
    """What a one-seed comparison cannot tell (the report says it)."""
    k = min_discordant(alpha)
    return (
        "One seed per item: each item ran once per arm, so a miss cannot be told apart from sampling "
        f"luck on that item, and the paired test can only call a regression when at least {k} items are "
        f"missed by the candidate alone (with none the other way) at alpha {alpha}; a candidate that breaks "
        f"fewer items is INCONCLUSIVE at best. Set `quality.seeds` or `quality.repeats` (docs/quality.md)."
    )
