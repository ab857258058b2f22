"""How likely `qgate run speed --until-decided --max-launches N` is to decide, before spending device time.

A device session has ~1,800 s; an engine start of the 48-layer production shapes is estimated at 60-70 s,
so a verdict gets about 4 launches an arm (docs/evidence/gpu-sessions.md "Next"). Whether 4 can decide
depends on the noise, which the 12-layer runs showed dominated by the engine start (up to 48 % between
two starts of one arm, while reps within a start agreed to 1-8 %). This simulates the contract's own
group- sequential gate (qgate.speed.sequential.simulate, the code tests/test_stats.py checks the error
rates with: the looks from max(contract launches, 2) to N, O'Brien-Fleming boundaries, the Welch-t bound
on the launch-unit variance, the CV limit on the pooled reps) over arms of N engine starts x the
contract's reps, each start with its own offset (sd `between`) and each rep its own noise (CV `within`),
the candidate's true decode ratio `ratio`. Seeded; prints per cell the share of PASS / FAIL /
INCONCLUSIVE and the mean launches an arm at the stop.

    python tools/verdict_odds.py contracts/qwen38-prodshape-bf16.yaml --max-launches 4 \
        --within 2 --between 1 2 3 5 10 --ratio 1.0 1.05 1.1

With --effects: an ablation's effect instead (`qgate ablate`, each arm N launches, no looks): the
share of draws in which qgate.stats.decide_batch, the rule every effect of the report is decided by,
says improved / no significant change / inconclusive / regressed for a route that alone makes decode
`ratio` times faster.

A planning figure, not evidence: the real noise comes from the engine's first launches.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from qgate.contract import load_contract
from qgate.errors import QgateError
from qgate.speed.sequential import Design, simulate, simulated_launches
from qgate.stats import VERDICTS, StatsConfig, decide_batch


def odds(speed, max_launches: int, within: float, between: float, ratio: float, draws: int, seed: int):
    """(P(PASS), P(FAIL), P(INCONCLUSIVE), mean launches an arm at the stop) of one noise cell."""
    g, st, reps = speed.gates, speed.stats, speed.repetitions
    design = Design.plan(st.alpha, max(speed.launches, 2), max_launches)
    ctrl, cand = simulated_launches(
        np.random.default_rng(seed), draws, max_launches, reps, within, between, ratio
    )
    decision, stop = simulate(
        design, ctrl, cand, reps, g.max_decode_regression_pct, st.min_effect_pct, st.max_cv_pct
    )
    return (decision == 1).mean(), (decision == -1).mean(), (decision == 0).mean(), stop.mean()


def effect_odds(
    speed, launches: int, within: float, between: float, ratio: float, draws: int, seed: int
) -> dict[str, float]:
    """The share of draws per decision of one ablation effect (an arm against the control)."""
    reps, cfg = speed.repetitions, StatsConfig.from_contract(speed.stats)
    ctrl, arm = simulated_launches(np.random.default_rng(seed), draws, launches, reps, within, between, ratio)
    code = decide_batch(ctrl, arm, cfg, launches=launches)["code"]
    return {v: float(np.mean(code == i)) for i, v in enumerate(VERDICTS)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("contract")
    p.add_argument("--max-launches", type=int, default=4)
    p.add_argument("--within", type=float, nargs="+", default=[2.0], help="CV of a rep within a start, %%")
    p.add_argument("--between", type=float, nargs="+", default=[1.0, 2.0, 5.0], help="sd of a start, %%")
    p.add_argument("--ratio", type=float, nargs="+", default=[1.0, 1.05, 1.1], help="candidate / control")
    p.add_argument("--draws", type=int, default=4000)
    p.add_argument("--seed", type=int, default=20261205)
    p.add_argument("--effects", action="store_true", help="an ablation's effect at N launches an arm")
    a = p.parse_args()
    try:
        speed = load_contract(a.contract).contract.speed
    except QgateError as exc:  # one line, as qgate's own commands say it
        p.exit(2, f"verdict_odds: {exc}\n")
    if speed is None:
        p.exit(2, f"verdict_odds: {a.contract}: no speed section\n")
    g, st = speed.gates, speed.stats
    n, first = a.max_launches, max(speed.launches, 2)
    if n < (1 if a.effects else first):
        need = "1" if a.effects else f"{first}, the first look (as qgate run speed --until-decided)"
        p.exit(2, f"verdict_odds: --max-launches {n}: at least {need}\n")
    if a.draws < 1:
        p.exit(2, f"verdict_odds: --draws {a.draws}: at least 1\n")
    if any(x < 0 for x in [*a.within, *a.between]) or any(r <= 0 for r in a.ratio):
        p.exit(2, "verdict_odds: --within and --between are >= 0 %, --ratio > 0\n")
    if a.effects:
        head = (
            f"ablation effects at {n} launches x {speed.repetitions} reps an arm, min effect "
            f"{st.min_effect_pct:g} %"
        )
        columns = "improved  regressed  no change  inconcl"

        def row(w: float, b: float, r: float) -> str:
            e = effect_odds(speed, n, w, b, r, a.draws, a.seed)
            return "  ".join(f"{e[v]:9.3f}" for v in VERDICTS[:4])
    else:
        head = (
            f"{speed.repetitions} reps a start, looks at {first}..{n} launches, margin "
            f"{g.max_decode_regression_pct:g} %"
        )
        columns = " PASS   FAIL  INCONCL  launches"

        def row(w: float, b: float, r: float) -> str:
            ps, fl, inc, stop = odds(speed, n, w, b, r, a.draws, a.seed)
            return f"{ps:5.3f}  {fl:5.3f}  {inc:7.3f}  {stop:8.2f}"

    tail = f"CV limit {st.max_cv_pct:g} %, alpha {st.alpha:g}; {a.draws} draws, seed {a.seed}"
    print(f"{a.contract}: {head}, {tail}")
    print(f"within %  between %  ratio  {columns}")
    for w, b, r in itertools.product(a.within, a.between, a.ratio):
        print(f"{w:8.1f}  {b:9.1f}  {r:5.3f}  {row(w / 100, b / 100, r)}")


if __name__ == "__main__":
    main()
