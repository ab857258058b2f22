"""Accuracy in performance mode (MLPerf's TEST01): the candidate's own timed output, judged by the
control's model.

Rep i of both arms decodes the same prompt greedily (qgate.speed.workload). Where the candidate's tokens
leave the control's, the control's model reads prompt + the candidate's output in one prefill (teacher
forcing, vLLM prompt logprobs; an engine start of the control's env after the timed launches, on no
clock: qgate.speed.run.run_audit) and gives, at every position from the first divergence on, the
margin = logprob(its top token) - logprob(the candidate's token) >= 0, on the candidate's own prefix.
A candidate that only rounds differently picks, at every step, a token the control's model ranks top or
within rounding of it (a near-tie: margin ~ 0); a candidate that does other math picks tokens that
model does not. A token is implausible where its margin exceeds IMPLAUSIBLE_NATS; more than
MAX_IMPLAUSIBLE of them in a run FAIL the speed gate, naming the first (rep, position, both tokens,
margin). The two numbers are calibrated in docs/speed-audit.md (legitimate rounding changes against a
candidate doing half the work, on the demo's model); `error_rates` recomputes them from recorded
margins, and tests/test_speed_audit.py reproduces them with a seed.

Pure: plain data in, Gate and plain data out; the engine start lives in qgate.speed.run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from qgate.gate import SEV_ERROR, SEV_FAIL, Gate
from qgate.results import ids_sha256

# Calibrated on the demo model (docs/speed-audit.md): the largest margin of a legitimate rounding change
# was below 1 nat; a candidate doing half the work put most of its tokens far above 2.
IMPLAUSIBLE_NATS = 2.0
# Tokens above the margin a run may hold before it FAILs: a near-tie the control resolves one way in
# its prefill (batched GEMM) and the other in decode (GEMV) is a legitimate token with a small margin,
# never one above IMPLAUSIBLE_NATS in the calibration; a few are allowed so that one rare one alone
# cannot fail a good candidate.
MAX_IMPLAUSIBLE = 3

NAME = "candidate's timed output plausible to the control"


def _reps(result: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {r.get("index"): r for r in result.get("reps") or [] if isinstance(r, dict)}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token arrays differ (a shorter one ends there), None if equal."""
    if list(a) == list(b):
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def audit_items(control: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """What the control's model must score: every candidate rep whose tokens differ from the control's
    rep of the same index (the same prompt), from the first diverging position, unless the control's
    audit already scored exactly those tokens (a resumed run)."""
    done = {
        (a.get("index"), a.get("token_ids_sha256"))
        for a in (control.get("audit") or {}).get("reps") or []
        if isinstance(a, dict)
    }
    c_reps, items = _reps(control), []
    for index, rep in sorted(_reps(candidate).items(), key=lambda kv: str(kv[0]).zfill(12)):
        ctrl = c_reps.get(index)
        if ctrl is None or not isinstance(rep.get("prompt_sha256"), str):
            continue
        start = first_divergence(ctrl.get("token_ids") or [], rep.get("token_ids") or [])
        if start is None or (index, ids_sha256(rep.get("token_ids") or [])) in done:
            continue
        items.append(
            {
                "index": index,
                "prompt_sha256": rep["prompt_sha256"],
                "token_ids": rep["token_ids"],
                "from": start,
            }
        )
    return items


def implausible(
    audited: list[dict[str, Any]], tokens: dict[Any, list[int]], margin: float = IMPLAUSIBLE_NATS
) -> list[dict[str, Any]]:
    """Every scored token above the margin, in rep then position order: {rep, position, candidate,
    control, margin}; `tokens` are the candidate's token arrays by rep index."""
    out = []
    for a in sorted(audited, key=lambda a: str(a.get("index")).zfill(12)):
        ids = tokens.get(a.get("index")) or []
        for k, (top, m) in enumerate(zip(a.get("top_ids") or [], a.get("margins") or [], strict=False)):
            if m > margin:
                pos = int(a.get("from", 0)) + k
                cand = ids[pos] if pos < len(ids) else None
                out.append(
                    {"rep": a.get("index"), "position": pos, "candidate": cand, "control": top, "margin": m}
                )
    return out


def _route_hits(audit: dict[str, Any]) -> int:
    routes = audit.get("routes") if isinstance(audit.get("routes"), dict) else {}
    return sum(int(r.get("hits", 0)) for r in routes.values() if isinstance(r, dict))


def audit_gate(control: dict[str, Any], candidate: dict[str, Any], gated: bool = True) -> Gate:
    """The audit's verdict on the candidate's timed output. PASS: its tokens are the control's in every
    rep, or the control's model finds at most MAX_IMPLAUSIBLE of the differing ones implausible. FAIL
    (gated: the contract's speed.gates.identical_tokens) beyond that, naming the first. ERROR: tokens
    that differ with no audit of exactly them, an audit whose margins are not finite, or one scored by
    an engine in which a route ran (not the control's math). Not gated: reported, never failing."""
    c_reps, t_reps = _reps(control), _reps(candidate)
    paired = [i for i in t_reps if i in c_reps]
    diverging = {
        i: first_divergence(c_reps[i].get("token_ids") or [], t_reps[i].get("token_ids") or [])
        for i in paired
    }
    diverging = {i: d for i, d in diverging.items() if d is not None}
    if not diverging:
        return Gate(NAME, True, f"the candidate's tokens are the control's in all {len(paired)} reps")
    audit = control.get("audit") if isinstance(control.get("audit"), dict) else {}
    by_rep = {a.get("index"): a for a in audit.get("reps") or [] if isinstance(a, dict)}
    missing = [
        i
        for i in diverging
        if i not in by_rep
        or by_rep[i].get("token_ids_sha256") != ids_sha256(t_reps[i].get("token_ids") or [])
    ]
    if missing:
        return Gate(
            NAME,
            False,
            f"the candidate's tokens differ from the control's in {len(diverging)} reps and no audit scored "
            f"rep {missing[0]}'s ({len(missing)} unscored): run `qgate run speed` with this qgate (it scores "
            "them in an engine start of the control)",
            SEV_ERROR,
        )
    if _route_hits(audit):
        return Gate(
            NAME,
            False,
            f"the audit's engine ran {_route_hits(audit)} route calls: not the control's math",
            SEV_ERROR,
        )
    scored = [by_rep[i] for i in diverging]
    margins = [m for a in scored for m in a.get("margins") or []]
    if not all(isinstance(m, (int, float)) and math.isfinite(m) for m in margins):
        return Gate(NAME, False, "an audit margin is not a finite number", SEV_ERROR)
    tokens = {i: list(t_reps[i].get("token_ids") or []) for i in diverging}
    bad = implausible(scored, tokens)
    fact = (
        f"{len(diverging)} of {len(paired)} reps differ from the control's tokens; the control's model "
        f"scored {len(margins)} tokens from each first divergence: {len(bad)} above "
        f"{IMPLAUSIBLE_NATS:g} nats (largest margin {max(margins, default=0.0):.3f}; "
        f"at most {MAX_IMPLAUSIBLE} allowed)"
    )
    if len(bad) <= MAX_IMPLAUSIBLE:
        return Gate(NAME, True, fact)
    b = bad[0]
    first = (
        f"first: rep {b['rep']} position {b['position']}, candidate token {b['candidate']} where the "
        f"control's top is {b['control']}, margin {b['margin']:.2f} nats"
    )
    if not gated:
        return Gate(NAME, True, f"{fact}; {first} (not gated: speed.gates.identical_tokens is false)")
    return Gate(
        NAME,
        False,
        f"{fact}: the candidate's timed output is not what the control's model decodes; {first}",
        SEV_FAIL,
    )


def error_rates(
    legit: list[list[float]], broken: list[list[float]], reps_per_run: int, runs: int, seed: int,
    margin: float = IMPLAUSIBLE_NATS, allowed: int = MAX_IMPLAUSIBLE,
) -> dict[str, float]:  # fmt: skip
    """The audit's error rates from recorded margins (each inner list: one rep's margins): runs of
    `reps_per_run` reps drawn with replacement (seeded) from the legitimate reps (false FAIL: more than
    `allowed` tokens above `margin`) and from the broken candidate's (power: the same, wanted)."""
    rng = random.Random(seed)

    def fail_rate(pool: list[list[float]]) -> float:
        if not pool:
            return math.nan
        counts = [sum(m > margin for m in pool[rng.randrange(len(pool))]) for _ in range(runs * reps_per_run)]
        runs_failed = sum(
            sum(counts[r * reps_per_run : (r + 1) * reps_per_run]) > allowed for r in range(runs)
        )
        return runs_failed / runs

    return {
        "false_fail": fail_rate(legit),
        "power": fail_rate(broken),
        "runs": runs,
        "reps_per_run": reps_per_run,
    }
