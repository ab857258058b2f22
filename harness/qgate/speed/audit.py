"""Accuracy in performance mode (MLPerf's TEST01): the candidate's own timed output, judged by the
control's model.

Rep i of both arms decodes the same prompt greedily (qgate.speed.workload). Where the candidate's tokens
leave the control's, the control's model reads prompt + the candidate's output in one prefill (teacher
forcing, vLLM prompt logprobs; an engine start of the control's env after the timed launches, on no
clock: qgate.speed.run.run_audit) and gives, at every position from the first divergence on, the
margin = logprob(its top token) - logprob(the candidate's token) >= 0, on the candidate's own prefix.
A candidate that only rounds differently picks, at every step, a token the control's model ranks top or
within rounding of it (a near-tie: margin ~ 0); a candidate that does other math picks tokens that
model does not. The top is the best token decoding could pick (with ignore_eos the stop tokens are
banned: VllmEngine.score leaves the special tokens out), and the control's own decode tokens of the rep
are scored the same way from the same position: the baseline. A token is implausible where its margin
exceeds IMPLAUSIBLE_NATS; the speed gate FAILs (`fails`) when more than MAX_IMPLAUSIBLE of the
candidate's are, their rate exceeds the baseline's by MIN_RATE_GAP and a one-sided Fisher exact test
says so at AUDIT_ALPHA, naming the first (rep, position, both tokens, margin). docs/speed-audit.md
gives the calibration on the demo's model; `error_rates` recomputes the rates from recorded margins
(tests/fixtures/audit_margins.json), tests/test_speed_audit.py with a seed.

Pure: plain data in, Gate and plain data out; the engine start lives in qgate.speed.run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from qgate.gate import SEV_ERROR, SEV_FAIL, Gate, gate_name
from qgate.results import ids_sha256

# Calibrated on the demo model (docs/speed-audit.md): the largest margin of a legitimate rounding change
# was 0.008 nats (1,341 tokens scored); the broken candidates put 36-58 % of their tokens above 2, most
# near 10.
IMPLAUSIBLE_NATS = 2.0
# Tokens above the margin a run may hold before it can FAIL (a few rare ones alone never fail).
MAX_IMPLAUSIBLE = 3
# The candidate's rate of implausible tokens must exceed the baseline's (the control's own decode
# tokens from the same positions, scored the same way) by this much, at this one-sided Fisher level.
MIN_RATE_GAP = 0.10
AUDIT_ALPHA = 1e-3

NAME = gate_name(
    "candidate's timed output plausible to the control", __name__, "FAIL or ERROR",
    "the candidate's timed tokens are ones the control's model finds implausible: its speed was bought "
    "with wrong output (MLPerf TEST01)", "docs/speed-audit.md",
)()  # fmt: skip


def _reps(result: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {r.get("index"): r for r in result.get("reps") or [] if isinstance(r, dict)}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token arrays differ (a shorter one ends there), None if equal."""
    if list(a) == list(b):
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def audit_items(control: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """What the control's model must score: every candidate rep whose tokens differ from the control's
    rep of the same index (the same prompt), from the first diverging position, and the control's own
    tokens of that rep from the same position (the baseline: how its teacher-forced prefill judges what
    its own decode picked); unless the control's audit already scored exactly those tokens (a resumed
    run)."""
    done = {
        (a.get("arm", "candidate"), a.get("index"), a.get("token_ids_sha256"))
        for a in (control.get("audit") or {}).get("reps") or []
        if isinstance(a, dict)
    }
    c_reps, items = _reps(control), []
    for index, rep in sorted(_reps(candidate).items(), key=lambda kv: str(kv[0]).zfill(12)):
        ctrl = c_reps.get(index)
        if ctrl is None or not isinstance(rep.get("prompt_sha256"), str):
            continue
        start = first_divergence(ctrl.get("token_ids") or [], rep.get("token_ids") or [])
        if start is None:
            continue
        for arm, tokens in (
            ("candidate", rep.get("token_ids") or []),
            ("control", ctrl.get("token_ids") or []),
        ):
            if (arm, index, ids_sha256(tokens)) not in done:
                item = {
                    "index": index,
                    "prompt_sha256": rep["prompt_sha256"],
                    "token_ids": tokens,
                    "from": start,
                }
                items.append({**item, "arm": arm})
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
    routes = sub if isinstance(sub := audit.get("routes"), dict) else {}
    return sum((int(r.get("hits", 0)) for r in routes.values() if isinstance(r, dict)), start=0)


def _entries(audit: dict[str, Any], arm: str) -> dict[Any, dict[str, Any]]:
    return {
        a.get("index"): a
        for a in audit.get("reps") or []
        if isinstance(a, dict) and a.get("arm", "candidate") == arm
    }


def excess(k_t: int, n_t: int, k_c: int, n_c: int) -> tuple[float, float]:
    """(one-sided Fisher exact p that the candidate's rate of implausible tokens is above the control's
    own, the gap of the two rates)."""
    from scipy.stats import fisher_exact

    if n_t == 0:
        return 1.0, 0.0
    gap = k_t / n_t - (k_c / n_c if n_c else 0.0)
    _, p = fisher_exact([[k_t, n_t - k_t], [k_c, n_c - k_c]], alternative="greater")
    return float(p), gap


def audit_gate(control: dict[str, Any], candidate: dict[str, Any], gated: bool = True) -> Gate:
    """The audit's verdict on the candidate's timed output. PASS: its tokens are the control's in every
    rep, or the control's model finds the differing ones no less plausible than its own decode's tokens
    from the same positions (the baseline). FAIL (gated: the contract's speed.gates.identical_tokens)
    when more than MAX_IMPLAUSIBLE of the candidate's tokens are implausible AND their rate exceeds the
    baseline's by more than MIN_RATE_GAP AND a one-sided Fisher exact test says so at AUDIT_ALPHA;
    naming the first. ERROR: tokens that differ with no audit of exactly them (or no baseline), an audit
    whose margins are not finite, or one scored by an engine in which a route ran (not the control's
    math). Not gated: reported, never failing."""
    c_reps, t_reps = _reps(control), _reps(candidate)
    paired = [i for i in t_reps if i in c_reps]
    diverging = {
        i: first_divergence(c_reps[i].get("token_ids") or [], t_reps[i].get("token_ids") or [])
        for i in paired
    }
    diverging = {i: d for i, d in diverging.items() if d is not None}
    if not diverging:
        return Gate(NAME, True, f"the candidate's tokens are the control's in all {len(paired)} reps")
    audit = sub if isinstance(sub := control.get("audit"), dict) else {}
    cand, base = _entries(audit, "candidate"), _entries(audit, "control")
    missing = [
        i
        for i in diverging
        if cand.get(i, {}).get("token_ids_sha256") != ids_sha256(t_reps[i].get("token_ids") or [])
        or base.get(i, {}).get("token_ids_sha256") != ids_sha256(c_reps[i].get("token_ids") or [])
    ]
    if missing:
        return Gate(
            NAME,
            False,
            f"the candidate's tokens differ from the control's in {len(diverging)} reps and no audit scored "
            f"rep {missing[0]}'s and the control's own ({len(missing)} unscored): run `qgate run speed` with "
            "this qgate (it scores them in an engine start of the control)",
            SEV_ERROR,
        )
    if _route_hits(audit):
        return Gate(
            NAME,
            False,
            f"the audit's engine ran {_route_hits(audit)} route calls: not the control's math",
            SEV_ERROR,
        )
    scored, own = [cand[i] for i in diverging], [base[i] for i in diverging]
    margins = [m for a in scored for m in a.get("margins") or []]
    baseline = [m for a in own for m in a.get("margins") or []]
    if not all(isinstance(m, (int, float)) and math.isfinite(m) for m in margins + baseline):
        return Gate(NAME, False, "an audit margin is not a finite number", SEV_ERROR)
    tokens = {i: list(t_reps[i].get("token_ids") or []) for i in diverging}
    bad = implausible(scored, tokens)
    k_c = sum(m > IMPLAUSIBLE_NATS for m in baseline)
    p, gap = excess(len(bad), len(margins), k_c, len(baseline))
    fact = (
        f"{len(diverging)} of {len(paired)} reps differ from the control's tokens; from each first "
        f"divergence the control's model finds {len(bad)} of the candidate's {len(margins)} tokens above "
        f"{IMPLAUSIBLE_NATS:g} nats, {k_c} of its own decode's {len(baseline)} (rate gap {100 * gap:+.1f} "
        f"points, one-sided Fisher p {p:.2g}; fails above {MAX_IMPLAUSIBLE} tokens, "
        f"{100 * MIN_RATE_GAP:g} points and p < {AUDIT_ALPHA:g})"
    )
    if not fails(len(bad), len(margins), k_c, len(baseline)):
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


def fails(k_t: int, n_t: int, k_c: int, n_c: int) -> bool:
    """The gate's rule on the counts: the candidate's implausible tokens (k_t of n_t) against the
    control's own (k_c of n_c)."""
    p, gap = excess(k_t, n_t, k_c, n_c)
    return k_t > MAX_IMPLAUSIBLE and gap > MIN_RATE_GAP and p < AUDIT_ALPHA


Pair = tuple[list[float], list[float]]  # one rep: the candidate's margins, the control's own


def error_rates(
    legit: list[Pair], broken: list[Pair], reps_per_run: int, runs: int, seed: int
) -> dict[str, float]:
    """The audit's error rates from recorded margins: runs of `reps_per_run` reps drawn with replacement
    (seeded) from the legitimate candidates' reps (false FAIL: the gate's rule says FAIL) and from the
    broken candidate's (power: the same, wanted); each rep is its candidate's margins and the control's
    own from the same positions."""
    rng = random.Random(seed)

    def counts(pair: Pair) -> tuple[int, int, int, int]:
        cand, own = pair
        return (
            sum(m > IMPLAUSIBLE_NATS for m in cand),
            len(cand),
            sum(m > IMPLAUSIBLE_NATS for m in own),
            len(own),
        )

    def fail_rate(pool: list[Pair]) -> float:
        if not pool:
            return math.nan
        reps = [counts(pair) for pair in pool]
        failed = 0
        for _ in range(runs):
            drawn = [reps[rng.randrange(len(reps))] for _ in range(reps_per_run)]
            failed += fails(*(sum(c[j] for c in drawn) for j in range(4)))
        return failed / runs

    return {
        "false_fail": fail_rate(legit),
        "power": fail_rate(broken),
        "runs": runs,
        "reps_per_run": reps_per_run,
    }
