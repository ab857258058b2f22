"""The distribution audit: the candidate's own next-token distributions from its timed reps, held against
the control's where both decoded the same prefix.

The token audit (qgate.speed.audit) judges the tokens a candidate picked; on a model whose next-token
distributions are flat (random weights: the production-shape checkpoint) almost any token is plausible,
and a shortcut that keeps the argmax (the seed's forbidden top1-only LM head) picks the control's tokens
everywhere: the tokens say nothing there. With `speed.audit_top_k` set, every timed rep of both arms
records its top-k next-token logprobs at every position (vLLM's sampler, from the logits the model's
last op gave: the routes' output), so what is audited is the timed output itself: a route cannot
compute one thing while timed and another while audited.

Rep i of both arms decodes the same prompt greedily, so up to and including the first position where
their tokens differ (all positions when they never do) the two arms read the same prefix: there the two
top-k lists must be the same model's. A position is discordant when one of either arm's TOP_M best
tokens is missing from the other's top k. Rounding changes reorder near-ties (the candidate's own rank
3 may be the control's 4); they do not push a top-3 token out of the other's top k, which a changed
computation (the lm_head on part of K: logits correlated ~0.7 with the model's) or a shortcut (only the
argmax computed) does at nearly every position.

The rule (`fails`): at least MIN_DISCORDANT discordant positions and a one-sided binomial tail below
ALPHA against P_HONEST, the calibrated upper bound of the per-position rate of honest rounding
changes (docs/speed-audit.md gives the measurements; `error_rates` recomputes the false FAIL and the
power from recorded positions, tests/test_dist_audit.py with a seed). Each verdict states its power
against every named corruption (qgate.speed.dist_calibration: the corruption's recorded reps on this
model, or pooled over the models measured when this one was not, drawn at this run's number of reps
and judged by the rule); below MIN_POWER against one of them the gate is INCONCLUSIVE, never a quiet
pass.

Pure: plain data in, Gate and plain data out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from qgate.gate import SEV_ERROR, SEV_FAIL, SEV_INCONCLUSIVE, Gate, gate_name
from qgate.speed.audit import _reps, first_divergence

NAME = gate_name(
    "candidate's next-token distributions are the control's", __name__, "FAIL, ERROR or INCONCLUSIVE",
    "where both arms decoded the same prefix, the candidate's top-k next-token logprobs are not the "
    "control model's (a top1-only lm_head, part of K), or the audit has too little power to vouch",
    "docs/speed-audit.md",
)()  # fmt: skip
Rep = tuple[int, int]  # one rep: (positions compared, discordant ones)
# A position is discordant when one of an arm's TOP_M best tokens is not in the other's top k.
TOP_M = 3
# The bound on honest candidates' per-position discordance the rule tests against: far above what was
# measured (0 of 8,406 positions on the demo model and the production-shape checkpoint, below 0.04 %
# at 95 %: docs/speed-audit.md), so rare honest discordance never fails a run.
P_HONEST = 0.01
MIN_DISCORDANT = 3
ALPHA = 1e-3
MIN_POWER = 0.99


def discordant(control_ids: Sequence[int], candidate_ids: Sequence[int], m: int = TOP_M) -> bool:
    """Whether one of either list's m best tokens is missing from the other list (both by rank)."""
    c, t = set(control_ids), set(candidate_ids)
    return not (set(control_ids[:m]) <= t and set(candidate_ids[:m]) <= c)


def _rows(rep: dict[str, Any]) -> list[list[int]] | None:
    rows = rep.get("top_ids")
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        return None
    return rows


def compared(control: dict[str, Any], candidate: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Per paired rep: {rep, positions, discordant: [positions]} over the positions both arms decoded from
    the same prefix (0 .. the first divergence, inclusive); and the reps that record no top-k."""
    c_reps, t_reps = _reps(control), _reps(candidate)
    out, missing = [], []
    for index in sorted(set(c_reps) & set(t_reps), key=lambda i: str(i).zfill(12)):
        c_rows, t_rows = _rows(c_reps[index]), _rows(t_reps[index])
        c_tok = c_reps[index].get("token_ids") or []
        t_tok = t_reps[index].get("token_ids") or []
        if c_rows is None or t_rows is None or len(c_rows) != len(c_tok) or len(t_rows) != len(t_tok):
            missing.append(index)
            continue
        d = first_divergence(c_tok, t_tok)
        last = min(len(c_rows), len(t_rows)) - 1 if d is None else min(d, len(c_rows) - 1, len(t_rows) - 1)
        bad = [j for j in range(last + 1) if discordant(c_rows[j], t_rows[j])]
        out.append({"rep": index, "positions": last + 1, "discordant": bad})
    return out, missing


def tail(x: int, n: int, p: float = P_HONEST) -> float:
    """One-sided binomial P(X >= x) for X ~ Binomial(n, p)."""
    from scipy.stats import binom

    return float(binom.sf(x - 1, n, p)) if x > 0 else 1.0


@lru_cache(maxsize=4096)
def critical(n: int) -> int | None:
    """The fewest discordant positions of n that the rule FAILs; None when no count can."""
    for x in range(MIN_DISCORDANT, n + 1):
        if tail(x, n) < ALPHA:
            return x
    return None


def fails(x: int, n: int) -> bool:
    """The rule: at least MIN_DISCORDANT of n positions discordant, the binomial tail below ALPHA."""
    c = critical(n)
    return c is not None and x >= c


POWER_RUNS, POWER_SEED = 2000, 59


def calibration(model_spec: Any) -> tuple[str, dict[str, list[Rep]]]:
    """The corruptions' recorded reps a verdict on this model is judged against: its own model's entry,
    else every entry's pooled; and the words naming which."""
    from qgate.speed.dist_calibration import MODELS

    own = [k for k, m in MODELS.items() if m["model_spec"] == model_spec]
    keys = own or sorted(MODELS)
    pooled: dict[str, list[Rep]] = {}
    for key in keys:
        for kind, reps in MODELS[key]["corrupt"].items():
            pooled.setdefault(kind, []).extend((int(n), int(x)) for n, x in reps)
    where = (
        f"measured on this model ({own[0]})"
        if own
        else f"not measured on this model: {', '.join(keys)} pooled"
    )
    return where, pooled


def power(reps: int, pool: list[Rep]) -> float:
    """The rule's power at `reps` paired reps against a corruption whose recorded reps are `pool`: runs
    of that many reps drawn with replacement (seeded), the share the rule FAILs."""
    return error_rates([], pool, reps, POWER_RUNS, POWER_SEED)["power"] if reps else 0.0


def summary(control: dict[str, Any], candidate: dict[str, Any], top_k: int | None) -> dict[str, Any]:
    """The audit's figures as data (the verdict's `tokens.distributions`)."""
    reps, missing = compared(control, candidate)
    n = sum(r["positions"] for r in reps)
    x = sum(len(r["discordant"]) for r in reps)
    first = next(({"rep": r["rep"], "position": r["discordant"][0]} for r in reps if r["discordant"]), None)
    where, pools = calibration((control.get("model") or {}).get("spec"))
    pw = {kind: power(len(reps), pool) for kind, pool in sorted(pools.items())}
    return {
        "top_k": top_k,
        "top_m": TOP_M,
        "reps": len(reps),
        "reps_without_top_k": missing,
        "positions": n,
        "discordant": x,
        "first_discordant": first,
        "p_value": tail(x, n) if n else None,
        "critical": critical(n) if n else None,
        "power": pw,
        "power_calibration": where,
        "p_honest": P_HONEST,
        "alpha": ALPHA,
    }


def dist_gate(
    control: dict[str, Any], candidate: dict[str, Any], top_k: int | None, gated: bool = True
) -> tuple[Gate, dict[str, Any] | None]:
    """The distribution audit's gate and figures. Not asked (no top_k): a passed gate that says the
    distributions were not audited. ERROR: the contract asks and a rep records no top-k. INCONCLUSIVE:
    the run's reps give the rule less than MIN_POWER against a named corruption. FAIL (gated: the
    contract's speed.gates.identical_tokens): `fails` on the discordant positions, naming the first."""
    if not top_k:
        why = "the timed output's distributions were not recorded (a top1-only lm_head passes tokens)"
        return Gate(NAME, True, f"not run: speed.audit_top_k is unset, {why}"), None
    s = summary(control, candidate, top_k)
    if s["reps_without_top_k"]:
        rep = s["reps_without_top_k"][0]
        return Gate(NAME, False, f"rep {rep} records no top-{top_k} logprobs for every token "
                    f"({len(s['reps_without_top_k'])} reps): run with this qgate", SEV_ERROR), s  # fmt: skip
    n, x, reps = s["positions"], s["discordant"], s["reps"]
    weakest = min(s["power"], key=s["power"].get) if s["power"] else None
    if not reps or weakest is None or not math.isfinite(s["power"][weakest]):
        return Gate(NAME, False, "no paired reps to audit", SEV_ERROR), s
    fact = (
        f"{x} of {n} positions decoded from the same prefix in {reps} reps discordant (a top-{TOP_M} token "
        f"missing from the other arm's top {top_k}; one-sided binomial p {s['p_value']:.2g} against an "
        f"honest rate of {P_HONEST:g}; fails at >= {MIN_DISCORDANT} and p < {ALPHA:g}); power "
        f"{100 * s['power'][weakest]:.1f} % against the weakest named corruption ({weakest}; "
        f"{s['power_calibration']})"
    )
    if fails(x, n):
        f = s["first_discordant"]
        first = f"first: rep {f['rep']} position {f['position']}"
        if not gated:
            return Gate(NAME, True, f"{fact}; {first} (not gated: speed.gates.identical_tokens is false)"), s
        return Gate(NAME, False, f"{fact}: the candidate's distributions are not the control model's; "
                    f"{first}", SEV_FAIL), s  # fmt: skip
    if s["power"][weakest] < MIN_POWER:
        return Gate(NAME, False, f"{fact}: under {100 * MIN_POWER:g} % power, the audit cannot vouch for "
                    "the output: more reps", SEV_INCONCLUSIVE), s  # fmt: skip
    return Gate(NAME, True, fact), s


def error_rates(
    honest: list[Rep], corrupt: list[Rep], reps_per_run: int, runs: int, seed: int
) -> dict[str, Any]:
    """The rule's error rates from recorded reps: runs of `reps_per_run` reps drawn with replacement
    (seeded) from honest rounding changes' reps (false FAIL) and from a corruption's (power)."""
    rng = random.Random(seed)

    def fail_rate(pool: list[Rep]) -> float:
        if not pool:
            return math.nan
        failed = 0
        for _ in range(runs):
            drawn = [pool[rng.randrange(len(pool))] for _ in range(reps_per_run)]
            failed += fails(sum(d for _, d in drawn), sum(p for p, _ in drawn))
        return failed / runs

    return {
        "false_fail": fail_rate(honest),
        "power": fail_rate(corrupt),
        "runs": runs,
        "reps_per_run": reps_per_run,
    }
