"""The speed gates (qgate.gate.Gate) of a speed comparison: each result complete and sound, the
statistics computed, non-inferiority + advice, the floor as a bound on the candidate's mean, the
improvement and prefill limits. The decision over them is qgate.gate.decide; the checks every kind
shares (refuse to compare, route attestation) are qgate.comparable's.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from qgate.comparable import canon
from qgate.contract import Contract
from qgate.gate import SEV_ERROR, SEV_FAIL, SEV_INCONCLUSIVE, Gate, GateName, gate_name
from qgate.launch_cv import MIN_NIGHTS
from qgate.results import ids_sha256
from qgate.sample_size import ADVICE_TARGET, advise_units
from qgate.speed.audit import audit_gate
from qgate.speed.dist_audit import dist_gate
from qgate.speed.repetition import repetition_gate
from qgate.stats import ERROR as STAT_ERROR
from qgate.stats import (
    IMPROVED,
    REGRESSED,
    MetricStats,
    mean_interval,
)
from qgate.stats import INCONCLUSIVE as STAT_INCONCLUSIVE


def _speed(template: str, severity: str, failure: str) -> GateName:
    return gate_name(template, __name__, severity, failure, "docs/compare.md")


PROMPTS_FRESH = _speed(
    "prompts fresh and paired",
    "ERROR",
    "a rep decoded a prompt another rep or warm-up already decoded, or the arms ran other prompt sequences",
)
REPS_INTACT = _speed(
    "{arm} reps intact",
    "ERROR",
    "a rep was measured twice, not reset, or its token hash does not match",
)
RESULT_COMPLETE = _speed("{arm} result complete", "ERROR", "the arm has fewer reps than the workload asks")
STATISTICS_COMPUTED = _speed(
    "{metric} statistics computed",
    "ERROR",
    "the decode or TTFT statistics could not be computed",
)
CONCLUSIVE = _speed(
    "decode comparison conclusive",
    "INCONCLUSIVE",
    "the reps cannot tell the arms' decode rates apart",
)
NO_REGRESSION = _speed(
    "no significant decode regression",
    "FAIL",
    "the candidate decodes significantly slower than the control (INCONCLUSIVE with one engine start "
    "per arm)",
)
TOKENS_IDENTICAL = _speed(
    "candidate tokens identical across reps",
    "FAIL",
    "the candidate decoded one prompt two ways (schema 1)",
)
ACROSS_STARTS = _speed(
    "decode ratio across engine starts",
    "INCONCLUSIVE",
    "the between-launch variance is unknown (one engine start per arm, no history): no PASS or FAIL on "
    "the decode ratio",
)
NON_INFERIOR = _speed(
    "decode regression ruled out beyond {margin} %",
    "FAIL, INCONCLUSIVE or ERROR",
    "FAIL: the whole interval of the decode ratio lies below the margin; INCONCLUSIVE: it straddles it",
)
IMPROVEMENT = _speed(
    "decode improvement >= {want} %",
    "FAIL or INCONCLUSIVE",
    "the improvement the contract asks for is ruled out (FAIL) or not shown (INCONCLUSIVE)",
)
FLOOR = _speed(
    "candidate mean decode >= {floor} tok/s",
    "FAIL, INCONCLUSIVE or ERROR",
    "the candidate's mean decode rate is shown below the contract's floor (INCONCLUSIVE: straddles it)",
)
PREFILL = _speed(
    "prefill (TTFT) regression <= {limit} %",
    "FAIL, INCONCLUSIVE or ERROR",
    "the candidate's time to first token grew beyond the contract's limit (INCONCLUSIVE: straddles it)",
)


def _same_prompt_same_tokens(result: dict[str, Any]) -> bool | None:
    """Whether the arm's reps that decoded one prompt produced one token array (greedy decoding is a
    function of the prompt): None when no prompt came twice (schema 2: every rep its own prompt), so
    there is nothing to compare. A rep without a prompt hash (schema 1) decoded the run's one prompt."""
    by_prompt: dict[Any, list[list[int]]] = {}
    for r in result.get("reps") or []:
        if isinstance(r, dict):
            by_prompt.setdefault(r.get("prompt_sha256"), []).append(list(r.get("token_ids") or []))
    groups = [arrays for arrays in by_prompt.values() if len(arrays) > 1]
    if not groups:
        return None
    return all(all(a == arrays[0] for a in arrays) for arrays in groups)


def _by_index(result: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {r.get("index"): r for r in result.get("reps") or [] if isinstance(r, dict)}


def token_summary(control: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Where control and candidate diverge, rep by rep (rep i of both arms decoded the same prompt):
    the reps compared, those whose tokens differ, the first of them and its first diverging position;
    and whether each arm's reps of one prompt agree (None: no prompt came twice)."""
    c_reps, t_reps = _by_index(control), _by_index(candidate)
    paired = sorted((i for i in c_reps if i in t_reps), key=lambda i: (str(type(i)), i))
    diverging: list[Any] = []
    first_div: int | None = None
    for i in paired:
        a, b = list(c_reps[i].get("token_ids") or []), list(t_reps[i].get("token_ids") or [])
        if a != b:
            if not diverging:
                first_div = next(
                    (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
                )
            diverging.append(i)
    c_first = next(iter(c_reps.values()), {})
    t_first = next(iter(t_reps.values()), {})
    return {
        "control_identical_across_reps": _same_prompt_same_tokens(control),
        "candidate_identical_across_reps": _same_prompt_same_tokens(candidate),
        "control_vs_candidate_identical": bool(paired) and not diverging,
        "reps_compared": len(paired),
        "diverging_reps": diverging,
        "first_diverging_rep": diverging[0] if diverging else None,
        "first_diverging_index": first_div,
        "control_tokens": len(c_first.get("token_ids") or []),
        "candidate_tokens": len(t_first.get("token_ids") or []),
    }


def prompts_gate(control: dict[str, Any], candidate: dict[str, Any]) -> Gate:
    """Nothing repeats (MLPerf's TEST04): every timed rep and warm-up of each arm decoded a prompt of its
    own, and rep i of both arms the same one. A result where a prompt repeats (schema 1 decoded one
    prompt in every rep) lets a result cache keyed by the input answer from memory, so it is refused
    (ERROR), as are arms whose prompt sequences differ (not a paired comparison)."""
    name = PROMPTS_FRESH()
    problems: list[str] = []
    sequences = {}
    for arm, result in (("control", control), ("candidate", candidate)):
        reps = sorted(_by_index(result).items(), key=lambda kv: (str(type(kv[0])), kv[0]))
        missing = [i for i, r in reps if not isinstance(r.get("prompt_sha256"), str)]
        if missing:
            problems.append(
                f"{arm} rep {missing[0]} records no prompt hash ({len(missing)} of {len(reps)} reps; a speed "
                "result of schema 1 decoded one prompt in every rep, which a result cache answers from "
                "memory): rerun it with this qgate"
            )
            continue
        seen: dict[str, str] = {}
        warm = [w for w in result.get("warmups") or [] if isinstance(w, dict)]
        named = [(f"rep {i}", r["prompt_sha256"]) for i, r in reps]
        named += [
            (f"warm-up {w.get('index')} of launch {w.get('launch')}", w.get("prompt_sha256")) for w in warm
        ]
        for label, sha in named:
            if sha in seen:
                problems.append(f"{arm} {label} decodes the prompt of {seen[sha]} (sha256 {str(sha)[:12]})")
                break
            seen[str(sha)] = label
        sequences[arm] = {i: r["prompt_sha256"] for i, r in reps}
    if len(sequences) == 2 and sequences["control"] != sequences["candidate"]:
        c, t = sequences["control"], sequences["candidate"]
        odd = next((i for i in c if c[i] != t.get(i)), next((i for i in t if i not in c), None))
        problems.append(f"rep {odd}: the arms decoded different prompts (the pairing is by rep index)")
    if problems:
        return Gate(name, False, "refuse to compare: " + "; ".join(problems[:2]), SEV_ERROR)
    n = len(sequences.get("control") or {})
    prompt = sub if isinstance(sub := control.get("prompt"), dict) else {}
    pinned = "pinned by the contract" if prompt.get("seed_pinned") else "drawn when the run started"
    nw = len([w for w in control.get("warmups") or [] if isinstance(w, dict)])
    return Gate(
        name,
        True,
        f"{n} reps per arm, each on a prompt of its own, the same sequence in both arms; {nw} warm-ups on "
        f"their own; seed {prompt.get('seed')} ({pinned})",
        SEV_ERROR,
    )


def _sequential_launches(result: dict[str, Any]) -> int | None:
    """The launches per arm at the last look of a `--until-decided` run (its `sequential` record)."""
    seq = result.get("sequential")
    looks = seq.get("looks") if isinstance(seq, dict) else None
    if not looks or not isinstance(looks[-1], dict) or not isinstance(looks[-1].get("launches"), int):
        return None
    return int(looks[-1]["launches"])


def integrity_gate(result: dict[str, Any], name: str, contract: Contract | None = None) -> Gate:
    """A speed result whose reps cannot be what the run measured is refused (ERROR): fewer reps or
    launches than the contract asks for, a rep whose prefix-cache reset was not done, a rep recorded
    twice (its index, or the whole record under another index), a token sha256 that is not the sha256
    of the rep's token ids."""
    problems = []
    reps = [r for r in result.get("reps") or [] if isinstance(r, dict)]
    workload = sub if isinstance(sub := result.get("workload"), dict) else {}
    speed = contract.speed if contract is not None else None
    if speed is not None:
        # A run of --until-decided holds the launches of its last look, not the contract's.
        planned = _sequential_launches(result) or speed.launches
        want = speed.repetitions * planned
        launches = {r.get("launch") for r in reps}
        if len(reps) < want or len(launches) < planned:
            problems.append(
                f"{len(reps)} reps from {len(launches)} launches, the contract asks for {speed.repetitions} "
                f"reps x {planned} launches"
            )
        seq = result.get("sequential")
        design = seq.get("design") if isinstance(seq, dict) else None
        if isinstance(design, dict) and design.get("alpha") != speed.stats.alpha:
            # compare judges the stopped data at the design's boundary: it must be the contract's alpha's
            problems.append(
                f"sequential.design.alpha = {design.get('alpha')!r}, the contract says {speed.stats.alpha!r}"
            )
        for key in ("repetitions", "launches", "reset_prefix_cache"):
            expected = planned if key == "launches" else getattr(speed, key)
            if key in workload and workload[key] != expected:
                said = "its last sequential look" if planned != speed.launches else "the contract"
                problems.append(f"workload.{key} = {workload[key]!r}, {said} says {expected!r}")
    must_reset = speed.reset_prefix_cache if speed is not None else workload.get("reset_prefix_cache", True)
    seen_index: set[Any] = set()
    seen_record: dict[str, Any] = {}
    for rep in reps:
        index = rep.get("index")
        if must_reset and rep.get("prefix_cache_reset") is not True:
            problems.append(
                f"rep {index}: prefix_cache_reset = {rep.get('prefix_cache_reset')!r}: the reset was not done"
            )
        if index in seen_index:
            problems.append(f"rep index {index!r} appears twice")
        seen_index.add(index)
        body = canon({k: v for k, v in rep.items() if k != "index"})
        if body in seen_record:
            problems.append(f"rep {index} is a copy of rep {seen_record[body]} (every figure the same)")
        seen_record.setdefault(body, index)
        ids = rep.get("token_ids")
        if isinstance(ids, list) and rep.get("token_ids_sha256") != ids_sha256(ids):
            problems.append(f"rep {index}: token_ids_sha256 is not the sha256 of its token_ids")
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return Gate(
            REPS_INTACT(arm=name), False, "refuse to compare: " + "; ".join(problems[:3]) + more, SEV_ERROR
        )
    return Gate(
        REPS_INTACT(arm=name), True, f"{len(reps)} reps, each measured once, reset, hashed", SEV_ERROR
    )


def completeness_gate(result: dict[str, Any], name: str) -> Gate:
    """A result that did not finish, or holds the wrong number of reps, cannot be compared."""
    workload = result.get("workload") or {}
    want = int(workload.get("repetitions", 0)) * int(workload.get("launches", 1) or 1)
    got = len(result.get("reps") or [])
    if result.get("complete") is not True:
        return Gate(RESULT_COMPLETE(arm=name), False, f"complete = {result.get('complete')!r}", SEV_ERROR)
    if got == 0 or got != want:
        return Gate(RESULT_COMPLETE(arm=name), False, f"{got} reps, workload asks for {want}", SEV_ERROR)
    return Gate(RESULT_COMPLETE(arm=name), True, f"{got} reps", SEV_ERROR)


def statistics_gates(decode: MetricStats, ttft: MetricStats) -> list[Gate]:
    """Both statistics computed (ERROR-class), and the decode comparison decided (INCONCLUSIVE-class:
    an arm noisier than max_cv_pct, or too few samples to reach alpha, cannot pass)."""
    gates = []
    for label, st in (("decode", decode), ("prefill (TTFT)", ttft)):
        ok = st.verdict != STAT_ERROR
        detail = "Welch t, Mann-Whitney U and bootstrap CI computed" if ok else str(st.error or st.reason)
        if not ok and label != "decode" and _constant_arms(st):
            # The prefill gate compares medians; a TTFT that is the same number in every rep of both arms
            # (a coarse clock, a cached prefill) has a median and needs no test.
            assert st.control is not None and st.candidate is not None
            ok = True
            detail = (
                f"constant in both arms (control {st.control.mean:g}, candidate {st.candidate.mean:g}): "
                "no test needed, the prefill gate compares medians"
            )
        gates.append(Gate(STATISTICS_COMPUTED(metric=label), ok, detail, SEV_ERROR))
    if decode.verdict != STAT_ERROR:
        conclusive = decode.verdict != STAT_INCONCLUSIVE
        detail = f"{decode.verdict}: {decode.reason}"
        gates.append(Gate(CONCLUSIVE(), conclusive, detail, SEV_INCONCLUSIVE))
    return gates


def _constant_arms(st: MetricStats) -> bool:
    """Both arms' samples summarised (finite, positive) and each one constant."""
    return st.control is not None and st.candidate is not None and st.control.std == 0 == st.candidate.std


def speed_gates(
    contract: Contract,
    candidate: dict[str, Any],
    decode: MetricStats,
    ttft_change_pct: float | None,
    tokens: dict[str, Any],
    across: dict[str, Any] | None = None,
    ttft: MetricStats | None = None,
    control: dict[str, Any] | None = None,
) -> list[Gate]:
    """The contract's speed gates, plus 'no significant decode regression' (always on). across: where
    the between-launch variance came from (across_starts); without it ("none") the gates on the decode
    ratio cannot FAIL (their failure is INCONCLUSIVE) and the across-starts gate fails INCONCLUSIVE.
    ttft: the TTFT statistics the prefill gate judges (its own interval; one start per arm: INCONCLUSIVE)."""
    assert contract.speed is not None
    g = contract.speed.gates
    across = across or across_starts(decode, None)
    gates = [
        _across_gate(decode, across, contract.speed),
        Gate(
            NO_REGRESSION(),
            decode.verdict != REGRESSED,
            f"decode verdict {decode.verdict} (change {_pct(decode.change_pct)}, {_ci(decode)})",
        ),
    ]
    if g.min_decode_tok_s is not None:
        gates.append(_floor_gate(candidate, decode, g.min_decode_tok_s))
    if g.max_prefill_regression_pct is not None:
        gates.append(_prefill_gate(ttft, ttft_change_pct, g.max_prefill_regression_pct))
    if tokens["candidate_identical_across_reps"] is False:  # one prompt decoded twice (schema 1)
        gates.append(Gate(TOKENS_IDENTICAL(), False, "candidate reps of one prompt differ"))
    if control is not None:
        gates.append(audit_gate(control, candidate, g.identical_tokens))
        gates.append(dist_gate(control, candidate, contract.speed.audit_top_k, g.identical_tokens)[0])
        gates.append(repetition_gate(control, candidate, contract.speed.repeat_reps)[0])
    gates.append(_non_inferiority_gate(decode, g.max_decode_regression_pct, contract.speed))
    if g.min_decode_improvement_pct is not None:
        gates.append(_improvement_gate(decode, g.min_decode_improvement_pct))
    if across["source"] == "none":
        gates = [_one_start(gate) for gate in gates]
    return gates


# The gates on the decode ratio: a PASS or FAIL of theirs needs the between-launch variance.
_RATIO_GATES = tuple(g.template.split("{")[0] for g in (NO_REGRESSION, NON_INFERIOR, IMPROVEMENT))


def _one_start(gate: Gate) -> Gate:
    if gate.passed or not gate.name.startswith(_RATIO_GATES) or gate.severity == SEV_ERROR:
        return gate
    note = " [one engine start per arm: not evidence across engine starts]"
    return Gate(gate.name, False, gate.detail + note, SEV_INCONCLUSIVE)


def across_starts(decode: MetricStats, history: Any, launches: int | None = None) -> dict[str, Any]:
    """Where the decode statistics' between-launch variance comes from: "run" (launches >= 2 per arm),
    "history" (one launch, qgate.launch_cv's estimate used) or "none"; with the history's record
    (qgate.launch_cv.LaunchCV.to_dict) whenever one was looked for."""
    launches = decode.launches if launches is None else launches
    source = "run" if launches > 1 else ("history" if decode.between is not None else "none")
    record = None if history is None else history.to_dict()
    return {"source": source, "launches": launches, "history": record}


def _across_gate(decode: MetricStats, across: dict[str, Any], speed: Any) -> Gate:
    """A PASS or FAIL on the decode ratio needs the variance between engine starts: measured (launches
    >= 2 per arm) or from the history (qgate.launch_cv); without either INCONCLUSIVE, with advice."""
    name = ACROSS_STARTS()
    hist = across.get("history") or {}
    if across["source"] == "run":
        cc, tc = decode.control_components, decode.candidate_components
        cvs = " / ".join(_pct_abs(c.cv_between_pct if c else None) for c in (cc, tc))
        detail = f"measured in the run: {across['launches']} launches per arm; between-launch CV {cvs}"
        return Gate(name, True, detail, SEV_INCONCLUSIVE)
    if across["source"] == "history":
        detail = (
            f"from the history: between-launch CV of the control {hist['cv_between_pct']:.2f} % (upper "
            f"{100 * hist['confidence']:g} % bound {hist['cv_between_upper_pct']:.2f} %, used for both arms) "
            f"from {hist['reason']}: {', '.join(hist['nights'])}"
        )
        return Gate(name, True, detail, SEV_INCONCLUSIVE)
    ni = non_inferiority(decode, speed.gates.max_decode_regression_pct, speed)
    units = (ni.get("advice") or {}).get("units") or 10
    said = f"the reps say change {_pct(decode.change_pct)}"
    if decode.t_ci_low is not None and decode.t_ci_high is not None:
        said += f", Welch-t CI of the ratio [{decode.t_ci_low:.4f}, {decode.t_ci_high:.4f}]"
    advice = sample_size_text(ni) if ni["outcome"] != "shown" else ""
    advice = advice or f"at least {max(2, speed.launches)} launches of {speed.repetitions} reps per arm"
    no_history = f" (history: {hist['reason']})" if hist else ""
    detail = (
        f"one engine start per arm and no between-launch variance{no_history}: {said}, but the difference "
        f"between two engine starts is not in these statistics. To decide: speed.launches >= 2 ({advice}), "
        f"or `qgate run speed --until-decided --max-launches {max(10, units)}`, or `qgate compare --history "
        f"STORE` with >= {MIN_NIGHTS} earlier control nights of this contract on this runner"
    )
    return Gate(name, False, detail, SEV_INCONCLUSIVE)


def _pct_abs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} %"


def non_inferiority(decode: MetricStats, margin_pct: float, speed: Any = None) -> dict[str, Any]:
    """The non-inferiority figures of the decode comparison: the Welch-t bound against the margin's
    floor, the outcome ("shown", "inferior": the whole interval below the floor, "undecided" or
    "error") and, unless shown, the advice (qgate.sample_size.advise_units): the units per arm at
    which a fresh run decides, accounting for every gate that can stop it (the margin, the CV limit,
    the speed floor, the contract's reps and launches, never fewer than were run). speed: the
    contract's speed section (without it the advice assumes no CV limit, no floor and no contract
    minimum)."""
    floor = 1.0 - margin_pct / 100.0
    out: dict[str, Any] = {
        "margin_pct": margin_pct,
        "floor": floor,
        "bound": decode.t_ci_low,
        "upper": decode.t_ci_high,
        "one_sided_alpha": None if decode.alpha is None else decode.alpha / 2,
        "outcome": "error",
        "unit": decode.unit,
        "needed_units": None,
        "advice": None,
        "power": ADVICE_TARGET,
    }
    cc, tc = decode.control_components, decode.candidate_components
    if (
        decode.t_ci_low is None
        or decode.t_ci_high is None
        or cc is None
        or tc is None
        or decode.alpha is None
        or decode.ratio is None
        or decode.control is None
        or decode.candidate is None
    ):
        return out
    if decode.t_ci_low >= floor:
        out["outcome"] = "shown"
        return out
    out["outcome"] = "inferior" if decode.t_ci_high < floor else "undecided"
    out["reps_per_launch"] = cc.reps_per_launch
    out["units_now"] = min(cc.units, tc.units)
    # The advice is in launches: with one start per arm more reps do not shrink the start's offset.
    out["advice_in"] = "launch"
    cv_c, cv_t = cc.unit_cv_pct, tc.unit_cv_pct
    if decode.unit == "rep":
        out["units_now"] = 1
        rel = float((decode.between or {}).get("rel_var") or 0.0)
        out["between_known"] = decode.between is not None
        cv_c, cv_t = (
            100 * math.sqrt(rel + (arm.cv_pct / 100) ** 2 / cc.units)
            for arm in (decode.control, decode.candidate)
        )
    what = f"launches of {cc.reps_per_launch} reps"
    min_units, max_cv, floor_z = 2, math.inf, None
    if speed is not None:
        min_units = max(2, speed.launches)
        max_cv = float(speed.stats.max_cv_pct)
        tok_floor = speed.gates.min_decode_tok_s
        if tok_floor is not None and cv_t > 0:
            floor_z = (tc.mean - tok_floor) / (cv_t / 100 * tc.mean)
    advice = advise_units(
        ratio=decode.ratio, cv_unit_c=cv_c, cv_unit_t=cv_t,
        cv_rep_c=decode.control.cv_pct, cv_rep_t=decode.candidate.cv_pct,
        reps_per_unit=cc.reps_per_launch, margin_pct=margin_pct,
        alpha=decode.alpha, max_cv_pct=max_cv, units_now=out["units_now"], min_units=min_units,
        floor_z=floor_z, what=what, df_c=cc.df, df_t=tc.df,
    )  # fmt: skip
    out["advice"] = asdict(advice)
    out["needed_units"] = advice.units
    return out


def sample_size_text(ni: dict[str, Any]) -> str:
    """'a fresh run of about 12 reps per arm decides ...' from non_inferiority's figures; empty when
    there is none."""
    advice = ni.get("advice")
    if ni.get("outcome") in ("shown", "error") or not advice:
        return ""
    if advice["units"] is None:
        return str(advice["text"])
    in_launches = ni.get("unit") != "rep" or ni.get("advice_in") == "launch"
    what = f"launches of {ni.get('reps_per_launch')} reps" if in_launches else "reps"
    size = "at least " if ni.get("between_known") is False else ""
    noise = (
        "the reps' own noise (the spread between engine starts, unknown here, adds to it)"
        if ni.get("between_known") is False
        else "the observed noise"
    )
    return (
        f"a fresh run of {size}{advice['units']} {what} per arm (now {ni.get('units_now')}) decides PASS or "
        f"FAIL with a planned {100 * advice['decide_prob']:.0f} % probability at {noise}, whether "
        f"the candidate is as fast as the control or as observed (every gate counted: the margin, the CV "
        f"limit, the floor; {_SIZE_SET_BY.get(advice['limited_by'], advice['limited_by'])})"
    )


_SIZE_SET_BY = {
    "power": "the smallest size with that probability",
    "units run": "no fewer than were run",
    "contract minimum": "no fewer than the contract asks",
}


def _non_inferiority_gate(decode: MetricStats, margin_pct: float, speed: Any = None) -> Gate:
    """No significant regression is not evidence of no regression: the Welch-t bound (one-sided alpha/2)
    must exclude a slowdown larger than the margin, so a noisy or underpowered run cannot pass by failing
    to detect one. Not shown: FAIL when the whole interval lies below the floor (a slowdown beyond the
    margin), else INCONCLUSIVE with a sample-size estimate."""
    ni = non_inferiority(decode, margin_pct, speed)
    name = NON_INFERIOR(margin=f"{margin_pct:g}")
    if ni["outcome"] == "error":
        return Gate(name, False, "no Welch-t interval of the decode ratio", SEV_ERROR)
    level = f"{100 * (1 - decode.alpha):g}" if decode.alpha is not None else "?"
    interval = f"Welch-t {level} % CI of ratio [{ni['bound']:.4f}, {ni['upper']:.4f}] (df {decode.df:.1f})"
    if ni["outcome"] == "shown":
        return Gate(name, True, f"{interval}; lower bound >= {ni['floor']:.4f}", SEV_INCONCLUSIVE)
    if ni["outcome"] == "inferior":
        return Gate(name, False, f"{interval}: the whole interval lies below {ni['floor']:.4f}")
    detail = f"{interval}; lower bound < {ni['floor']:.4f}: {sample_size_text(ni)}"
    return Gate(name, False, detail, SEV_INCONCLUSIVE)


def _improvement_gate(decode: MetricStats, want: float) -> Gate:
    """A significant improvement of at least `want` %; not shown is FAIL when the interval rules it out
    (its upper bound below 1 + want %), else INCONCLUSIVE."""
    name = IMPROVEMENT(want=f"{want:g}")
    ok = decode.verdict == IMPROVED and decode.change_pct is not None and decode.change_pct >= want
    detail = f"change {_pct(decode.change_pct)} ({decode.verdict}); needs a significant >= +{want:g} %"
    if ok:
        return Gate(name, True, detail, SEV_INCONCLUSIVE)
    ruled_out = decode.t_ci_high is not None and decode.t_ci_high < 1 + want / 100
    return Gate(name, False, detail, SEV_FAIL if ruled_out else SEV_INCONCLUSIVE)


def _ci(st: MetricStats) -> str:
    if st.ci_low is None or st.ci_high is None or st.ci_level is None:
        return "no CI"
    return f"{100 * st.ci_level:g} % CI of ratio [{st.ci_low:.4f}, {st.ci_high:.4f}]"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f} %"


def floor_bound(decode: MetricStats, threshold: float) -> dict[str, Any]:
    """The candidate's mean decode tok/s against the floor: its Welch-t interval (each bound one-sided
    at alpha/2, launch-aware: the variance of the arm's mean and its df from the decode statistics) and
    the outcome "above" (lower bound >= floor), "below" (upper bound < floor), "undecided" or "error"."""
    comp = decode.candidate_components
    out: dict[str, Any] = {"floor": threshold, "mean": None, "low": None, "high": None, "outcome": "error"}
    if comp is None or decode.alpha is None or not comp.df > 0 or not comp.var_of_mean >= 0:
        return out
    low, high = mean_interval(comp.mean, comp.var_of_mean, comp.df, decode.alpha)
    out.update(mean=comp.mean, low=float(low), high=float(high), df=comp.df)
    if not (math.isfinite(out["low"]) and math.isfinite(out["high"])):
        return out
    out["outcome"] = (
        "above" if out["low"] >= threshold else "below" if out["high"] < threshold else "undecided"
    )
    return out


def _floor_gate(candidate: dict[str, Any], decode: MetricStats, threshold: float) -> Gate:
    """A floor on the candidate's mean rate, as a statistic: FAIL only when the mean is shown below it
    (the Welch-t upper bound, one-sided alpha/2, under the floor), PASS when shown above it, otherwise
    INCONCLUSIVE. A gate on every rep would fail a candidate above the floor more often the more reps it
    runs; how many reps fell below is still reported."""
    values = [r.get("decode_tok_s") for r in candidate.get("reps", [])]
    name = FLOOR(floor=f"{threshold:g}")
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return Gate(name, False, "candidate reps lack decode_tok_s", SEV_ERROR)
    below = [v for v in values if not v >= threshold]  # `not >=` also catches NaN
    fact = f"slowest rep {min(values):.2f} tok/s, {len(below)} of {len(values)} reps below {threshold:g}"
    fb = floor_bound(decode, threshold)
    if fb["outcome"] == "error":
        return Gate(name, False, f"no interval of the candidate mean; {fact}", SEV_ERROR)
    level = f"{100 * (1 - (decode.alpha or 0)):g}"
    detail = f"mean {fb['mean']:.2f} tok/s, Welch-t {level} % CI [{fb['low']:.2f}, {fb['high']:.2f}]; {fact}"
    if fb["outcome"] == "above":
        return Gate(name, True, detail)
    if fb["outcome"] == "below":
        return Gate(name, False, f"{detail}: the mean is shown below the floor")
    return Gate(name, False, f"{detail}: the interval straddles the floor", SEV_INCONCLUSIVE)


# prefill_decision's codes
PREFILL_FAIL, PREFILL_UNDECIDED, PREFILL_PASS = -1, 0, 1


def prefill_decision(t_ci_low: Any, t_ci_high: Any, limit_pct: float) -> Any:
    """The prefill gate's rule on the Welch-t interval of the TTFT ratio (candidate / control, each
    bound one-sided at alpha/2; floats or arrays, so the simulation of tests/test_prefill_gate.py runs
    this): PASS when the upper bound is at or under 1 + limit (a regression beyond the limit ruled
    out), FAIL when the lower bound is above it (shown beyond the limit), else undecided."""
    ceiling = 1.0 + limit_pct / 100.0
    return np.where(
        np.asarray(t_ci_high) <= ceiling,
        PREFILL_PASS,
        np.where(np.asarray(t_ci_low) > ceiling, PREFILL_FAIL, PREFILL_UNDECIDED),
    )


def _prefill_gate(ttft: MetricStats | None, change_pct: float | None, limit: float) -> Gate:
    """The decode gate's treatment for TTFT (docs/compare.md, "The prefill gate"): the Welch-t interval
    of the ratio of TTFT means, launch-aware (one start per arm: with the history's between-launch
    estimate of the TTFT, qgate.launch_cv metric "ttft"), against the limit as a margin
    (prefill_decision); INCONCLUSIVE when it straddles the limit or when one engine start per arm
    leaves the variance between starts unknown. A TTFT constant in both arms has no noise: its median
    change is the answer."""
    name = PREFILL(limit=f"{limit:g}")
    median = "n/a" if change_pct is None else f"{change_pct:+.2f} %"
    if ttft is None or ttft.verdict == STAT_ERROR:
        if ttft is not None and _constant_arms(ttft) and change_pct is not None:
            return Gate(name, change_pct <= limit, f"median TTFT change {median} (constant in both arms)")
        return Gate(name, False, "no interval of the TTFT ratio could be computed", SEV_ERROR)
    if ttft.t_ci_low is None or ttft.t_ci_high is None:
        return Gate(name, False, "no interval of the TTFT ratio could be computed", SEV_ERROR)
    level = f"{100 * (1 - (ttft.alpha or 0)):g}"
    interval = (
        f"TTFT ratio {ttft.ratio:.4f}, Welch-t {level} % CI [{ttft.t_ci_low:.4f}, {ttft.t_ci_high:.4f}] "
        f"(df {ttft.df:.1f}); median change {median}"
    )
    if ttft.launches <= 1 and ttft.between is None:
        return Gate(
            name, False,
            f"{interval}; one engine start per arm: the TTFT's variance between engine starts is unknown "
            f"(speed.launches >= 2 measures it, or `qgate compare --history` with >= {MIN_NIGHTS} earlier "
            "one-launch control nights of this contract on this runner)",
            SEV_INCONCLUSIVE,
        )  # fmt: skip
    if ttft.launches <= 1:
        assert ttft.between is not None  # the INCONCLUSIVE return above otherwise
        cv = 100 * ttft.between["rel_var"] ** 0.5
        interval += f"; the variance between starts from the history (CV upper bound {cv:.2f} %)"
    code = int(prefill_decision(ttft.t_ci_low, ttft.t_ci_high, limit))
    ceiling = f"{1 + limit / 100:.4f}"
    if code == PREFILL_PASS:
        return Gate(name, True, f"{interval}; upper bound <= {ceiling}")
    if code == PREFILL_FAIL:
        return Gate(name, False, f"{interval}: the whole interval lies above {ceiling}")
    return Gate(name, False, f"{interval}: the interval straddles {ceiling}", SEV_INCONCLUSIVE)
