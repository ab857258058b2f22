"""Calibration of the quality gate, shown: a seeded simulation at 16 items (a few seconds).

Prints the false-FAIL rate of the old single-seed matched-misses gate and of the new paired rule, and
their power against a candidate that breaks 2 items; docs/quality.md quotes these figures
(the test run prints the table).
"""

from __future__ import annotations

import numpy as np
import pytest

from qgate.quality.calibration import STRONG_MODEL_P, power, simulate, table
from qgate.quality.paired import min_discordant, seeds_for_power, seeds_needed, sign_test_p

ALPHA = 0.05


@pytest.fixture(scope="module")
def results() -> dict[int, object]:
    return {seeds: simulate(seeds=seeds, trials=10000, alpha=ALPHA) for seeds in (1, 3, 5, 8)}


def test_the_figures_are_printed(results: dict, capsys: pytest.CaptureFixture[str]) -> None:
    text = table(list(results.values()))
    with capsys.disabled():  # shown in every run, as docs/quality.md quotes them
        print("\nquality gate calibration, 16 items, alpha 0.05, 10,000 trials per row:\n" + text)
    assert text.count("\n") == 5 and "| 8 |" in text


def test_old_single_seed_gate_fails_a_correct_candidate_often(results: dict) -> None:
    old = results[1].old_correct.fail
    # 1 - prod over items of (1 - p(1 - p)): the chance of at least one candidate-only miss
    p = np.asarray(STRONG_MODEL_P)
    expected = 1 - np.prod(1 - p * (1 - p))
    assert abs(old - expected) < 0.02, (old, expected)
    assert old > 0.5


def test_new_rule_false_fail_rate_is_at_most_alpha(results: dict) -> None:
    for seeds, r in results.items():
        # 10,000 trials: a binomial standard error of 0.22 % at 5 %; allow 3 of them
        assert r.new_correct.fail <= ALPHA + 0.0066, (seeds, r.new_correct)


def test_new_rule_power_grows_with_seeds(results: dict) -> None:
    powers = [results[s].new_broken.fail for s in (1, 3, 5, 8)]
    assert powers == sorted(powers) and powers[0] < 0.05 and powers[-1] > 0.85, powers
    # With the power to see 2 broken items (8 seeds), a correct candidate is rarely INCONCLUSIVE
    assert results[8].new_correct.inconclusive < 0.05 and results[1].new_correct.passed == 0.0
    assert results[1].old_broken.fail > 0.95  # the old gate catches breaks, at its false-FAIL price


def test_sign_test_and_seed_counts() -> None:
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(5, 0) == 0.5**5 and sign_test_p(0, 3) == 1.0
    assert abs(sign_test_p(2, 1) - 0.5) < 1e-12
    assert min_discordant(0.05) == 5 and min_discordant(0.01) == 7
    assert seeds_needed(1, 0, 1, 0.05) == 5 and seeds_needed(0, 2, 3, 0.05) is None
    assert seeds_needed(2, 0, 1, 0.05) == 3  # 6 candidate-only misses at 3 seeds: p = 0.0156
    # all items always answered: 2 broken items give 2 candidate-only misses per seed
    ones = [1.0] * 16
    assert power(ones, 2, 2, ALPHA) == 0.0 and power(ones, 3, 2, ALPHA) == 1.0
    assert seeds_for_power(ones, 1, 2, ALPHA, 0.8) == 3
    assert seeds_for_power(list(STRONG_MODEL_P), 3, 2, ALPHA, 0.8) in (6, 7)
