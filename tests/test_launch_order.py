"""The order of engine starts (qgate.engine.order): a seeded random first order, alternated, recorded in
every arm's result and kept on --resume; and the seeded simulation of what it changes when the first
engine start of a run is slow (docs/compare.md, "Launch order"; `pytest -s tests/test_launch_order.py
-k simulated` prints the table). The engine starts are scripted (tests/scripted_engine.py): the subject
is the spine's order, not vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy import stats as sps
from scripted_engine import ScriptedSegments
from test_launch_cv import FLOOR, REPS, _decide, _launches, _looks

from qgate import models
from qgate.contract import load_contract
from qgate.engine import arms, order
from qgate.engine.order import ALTERNATE, FIXED, LaunchOrder, new_order, plan_order
from qgate.speed.run import run_speed
from qgate.speed.sequential import Design
from qgate.stats import arm_variance

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
NAMES = ("control", "candidate")
CONTROL_FIRST = next(s for s in range(100) if new_order(NAMES, s).first[0] == "control")
CANDIDATE_FIRST = next(s for s in range(100) if new_order(NAMES, s).first[0] == "candidate")


def test_a_seeded_first_order_alternated() -> None:
    o = new_order(NAMES, CANDIDATE_FIRST)
    assert o.scheme == ALTERNATE and o.seed == CANDIDATE_FIRST
    ba = ("candidate", "control")
    assert [o.arms(i) for i in range(4)] == [ba, ba, ba, ba]  # one arm's starts never side by side
    assert [o.position("control", i) for i in range(3)] == [1, 3, 5]
    assert new_order(NAMES, CANDIDATE_FIRST) == o  # the seed reproduces it
    firsts = {new_order(NAMES).first[0] for _ in range(64)}  # a run's own seed: either arm first
    assert firsts == set(NAMES)
    three = new_order(("control", "a", "b"), 7)
    assert three.arms(1) == three.arms(0) and sorted(three.first) == ["a", "b", "control"]


def test_the_order_a_result_recorded_is_kept_and_old_results_go_on_control_first() -> None:
    o = new_order(NAMES, 3)
    assert order.from_record(o.to_dict(), NAMES) == o
    assert plan_order(NAMES, [{"launches": [{}], "launch_order": o.to_dict()}, {"launches": []}]) == o
    # Results of before the order was recorded ran the control first: resumed, they go on that way.
    assert plan_order(NAMES, [{"launches": [{"launch": 0}]}, {"launches": []}]) == LaunchOrder(FIXED, NAMES)
    # A record for other arms (a one-arm run's) or of an unknown scheme is not this run's order.
    assert order.from_record({**o.to_dict(), "first": ["control"]}, NAMES) is None
    assert order.from_record({**o.to_dict(), "scheme": "zigzag"}, NAMES) is None
    assert plan_order(NAMES, [{"launches": []}, {"launches": []}]).scheme == ALTERNATE


class _Starts(ScriptedSegments):
    """Scripted engine starts that remember their order; `stop_after` starts, a Stopped run."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.labels: list[str] = []
        self.stop_after = stop_after

    def __call__(self, spec: dict, env: Any, log: Path, attest: Path, result: dict, *rest: Any) -> dict:
        if self.stop_after is not None and len(self.labels) == self.stop_after:
            raise KeyboardInterrupt  # the run stopped between two engine starts
        self.labels.append(f"{result['arm']} {spec['launch']}")
        return super().__call__(spec, env, log, attest, result, *rest)


def _contract(tmp_path: Path, launches: int) -> Path:
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["speed"].update(input_tokens=64, output_tokens=8, repetitions=4, launches=launches)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_spine_starts_the_arms_in_the_recorded_order_and_resume_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_contract(_contract(tmp_path, 3))
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    monkeypatch.setattr(order, "draw_seed", lambda: CANDIDATE_FIRST)
    starts = _Starts(stop_after=3)
    monkeypatch.setattr(arms, "run_segment", starts)
    with pytest.raises(KeyboardInterrupt):
        run_speed(loaded, tmp_path / "out")
    assert starts.labels == ["candidate 0", "control 0", "candidate 1"]
    # Resumed with another seed drawn: the recorded order goes on (BA | BA | BA).
    monkeypatch.setattr(order, "draw_seed", lambda: CONTROL_FIRST)
    starts = _Starts()
    monkeypatch.setattr(arms, "run_segment", starts)
    done = run_speed(loaded, tmp_path / "out", resume=True)
    assert starts.labels == ["control 1", "candidate 2", "control 2"]
    for arm in NAMES:
        saved = json.loads((tmp_path / "out" / "speed" / f"{arm}.json").read_text())
        assert (
            saved["launch_order"] == new_order(NAMES, CANDIDATE_FIRST).to_dict() == done[arm]["launch_order"]
        )
        assert saved["complete"] is True and [x["launch"] for x in saved["launches"]] == [0, 1, 2]


# ---- the seeded simulation: the first engine start of a run 3 % slow ----------------------------------

SIMS = 8000
SLOW_FIRST = 0.03
SPREADS = (0.005, 0.01, 0.02, 0.05)


def _runs(
    rng: np.random.Generator, launches: int, spread: float, ratio: float, scheme: str
) -> tuple[Any, Any]:
    """[SIMS, launches * REPS] per arm (test_launch_cv's model), the run's first engine start slowed:
    the control's launch 0 (always first, as before), or launch 0 of the arm each run's order puts
    first (engine.order, one seed per simulated run)."""
    c = _launches(rng, SIMS, launches, spread, 1.0).reshape(SIMS, launches, REPS)
    t = _launches(rng, SIMS, launches, spread, ratio).reshape(SIMS, launches, REPS)
    if scheme == "control first":
        control_first = np.ones(SIMS, dtype=bool)
    else:
        seeds = rng.integers(0, 2**32, SIMS)
        control_first = np.array([new_order(NAMES, int(s)).first[0] == "control" for s in seeds])
    c[control_first, 0] *= 1 - SLOW_FIRST
    t[~control_first, 0] *= 1 - SLOW_FIRST
    return c.reshape(SIMS, -1), t.reshape(SIMS, -1)


def _fixed(rng: np.random.Generator, spread: float, ratio: float, scheme: str) -> tuple[float, float]:
    """(FAIL, PASS) of the production contract's 3 launches per arm (supersets, as test_launch_cv's)."""
    c, t = _runs(rng, 3, spread, ratio, scheme)
    fail, passed = _decide(arm_variance(c, 3), arm_variance(t, 3), lambda df: sps.t.ppf(0.975, df))
    return float(fail.mean()), float(passed.mean())


def _until_decided(rng: np.random.Generator, spread: float, ratio: float, scheme: str) -> tuple[float, float]:
    """(FAIL, PASS) of the nightly: looks at 3..5 launches per arm, then compare at the stopping look."""
    c, t = _runs(rng, 5, spread, ratio, scheme)
    return _looks(Design.plan(0.05, 3, 5), c, t)


@pytest.mark.parametrize("design", ["3 launches", "--until-decided 3..5"])
def test_simulated_error_rates_with_a_slow_first_engine_start(design: str) -> None:
    run = _fixed if design == "3 launches" else _until_decided
    rng = np.random.default_rng(20261205)
    worst = {}
    for scheme in ("control first", "random first"):
        cells = []
        for spread in SPREADS:
            aa_fail, _ = run(rng, spread, 1.0, scheme)
            _, margin_pass = run(rng, spread, FLOOR, scheme)
            cells.append((aa_fail, margin_pass))
        worst[scheme] = max(max(cell) for cell in cells)
        print(
            f"{design} | {scheme} | A/A FAIL / PASS at the margin, launch sd "
            + " / ".join(f"{100 * s:g}" for s in SPREADS)
            + " %: "
            + " | ".join(f"{100 * f:.2f} / {100 * p:.2f}" for f, p in cells)
        )
    # Seeded: the figures of docs/compare.md. The new order within alpha/2; the old one above it.
    assert worst["random first"] <= 0.025, worst
    assert worst["control first"] > 0.025, worst
