"""The benchmark's verdicts: targets as ratios to the best competitor, every input kind under a
time bound, and a route that fell back to its reference never counted as the kernel's figure."""

from __future__ import annotations

import dataclasses

import torch

from qgate.ops.bench import _target_met, bench_case
from qgate.ops.cases import gemv_case, topk_case


def test_a_time_bound_holds_for_every_input_kind() -> None:
    target = {"min_vs_best": 1.0, "max_us": 13.0}
    fast_overall = {"route_us": 12.5}
    slow_kind = {"route_us": 12.5, "route_by_input_us": {"continuous": 11.9, "integers": 13.06}}
    assert _target_met(target, slow_kind, 7.0, {}) is False
    assert _target_met(target, fast_overall, 7.0, {}) is True
    assert _target_met({"min_vs_best": 1.0}, fast_overall, 0.95, {}) is False


def test_a_route_that_fell_back_is_recorded_with_its_reasons() -> None:
    half = gemv_case(16, 64)
    # float32 inputs: no kernel takes them, the route runs its reference (counted "dtype")
    case = dataclasses.replace(half, make=lambda gen, dev: tuple(a.float() for a in half.make(gen, dev)))
    cfg = {"warmup": 1, "reps": 2, "rotate_bytes": 0, "max_sets": 1}
    out = bench_case(case, torch.Generator().manual_seed(1), torch.device("cpu"), cfg, 1.0)
    assert out["route_fallbacks"] == {"dtype": 3}  # the timer's calls: one warm-up, two timed
    assert out["best_competitor"] == case.baseline_name and out["vs_best_back_to_back"] > 0
    step = out["decode_step"]  # producer -> op -> consumer, the glue's time subtracted
    assert set(step["competitors_us"]) == {case.baseline_name} and step["glue_us"] > 0


def test_topk_draws_the_production_input_kinds_and_a_short_visible_row() -> None:
    """The top-k case cycles through the production indexer's ReLU-sum scores and exp(3 N(0,1))
    beside randn, ties and integers (the 13 us bound is judged on each), and `visible` sets the
    timed row's length."""
    case = topk_case(2, 2048, 64, visible=100)
    gen = torch.Generator().manual_seed(3)
    drawn = [case.make(gen, torch.device("cpu")) for _ in range(5)]
    kinds = sorted(case.meta["input_kind"](*a) for a in drawn)
    assert kinds == ["continuous", "exp3", "integers", "relu_sum", "ties"]
    assert all(int(a[1][0]) == 100 for a in drawn) and case.label == "2x2048x64x100"
    relu = next(a[0] for a in drawn if case.meta["input_kind"](*a) == "relu_sum")
    assert bool((relu[0, :100] >= 0).all()) and bool((relu[0, :100] == 0).any())
