"""Run-level counts of a quality result and the contract's quality gates. Pure functions on records.

A gate is a qgate.gate.Gate: severity "error" when the comparison itself cannot be
trusted (an incomplete result, arms run on different items or prompts, a statistic that could not be
computed), "inconclusive" when the data cannot decide (the paired test without the power to see the
regression the contract names), "fail" otherwise.

With several seeds (schema 2 results: every item record carries its `seed`), the floors (min raw /
strict correct) count the frozen seed's run (the contract's sampling.seed, the first seed), while the
health checks (natural stops, closed thinking, caps, invalid, U+FFFD, repeated windows, token runs)
hold for every output of every seed, and the decode rate is token-weighted over every output.
Correctness against the control is the paired test of qgate.quality.paired.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qgate.contract.quality import QualityGates
from qgate.gate import SEV_ERROR, SEV_FAIL, SEV_INCONCLUSIVE, Gate, GateName, gate_name
from qgate.quality.paired import (
    ERROR,
    INCONCLUSIVE,
    NO_REGRESSION,
    PairedTest,
    item_rates,
    paired_test,
    seed_of,
)

LIST_AT_MOST = 8  # items named in a gate's detail; the report's tables list them all

# The quality gates' names; `qgate compare` shows them after "quality: " (qgate.compare.comparers).
_DOC, _Q = "docs/quality.md", "quality: "


def _health(template: str, failure: str, severity: str = "FAIL") -> GateName:
    return gate_name(template, __name__, severity, failure, _DOC, shown_as=_Q)


RESULT_COMPLETE = _health(
    "{arm} result complete",
    "the arm did not answer every item under every seed: nothing can be counted",
    "ERROR",
)
RAW_CORRECT = _health(
    "{arm} raw correct{seed}",
    "fewer items answered right (the last number) than the contract's floor "
    "(on the frozen seed; {seed}: ' (seed N)' when several seeds ran)",
)
STRICT_CORRECT = _health(
    "{arm} strict correct{seed}",
    "fewer items answered right in the '#### N' form than the contract's floor",
)
NATURAL_STOPS = _health("{arm} natural stops", "an output did not end with the end-of-turn token")
CLOSED_THINKING = _health("{arm} closed thinking", "an output left its <think> block open")
LENGTH_CAPS = _health("{arm} length caps", "more outputs hit max_tokens than the contract allows")
INVALID = _health("{arm} structurally invalid", "more outputs broke the chat format than the contract allows")
FFFD = _health("{arm} U+FFFD characters", "the outputs hold more broken characters (U+FFFD) than allowed")
REPEATED_WINDOW = _health("{arm} repeated 50-char window", "an output repeats a 50-char window: it loops")
TOKEN_RUN = _health("{arm} same-token run", "an output repeats one token too long: it is stuck")
PAIRED = _health(
    "paired test",
    "the exact paired sign test shows the candidate answers fewer items than the control "
    "(INCONCLUSIVE: not the power to see the contract's regression; ERROR: not computed)",
    "FAIL, INCONCLUSIVE or ERROR",
)


def weighted_decode_tok_s(items: list[dict[str, Any]]) -> float | None:
    """Pure decode tok/s over all items, weighted by tokens: sum(n - 1) / sum(decode seconds)."""
    tokens = sum(r["output_tokens"] - 1 for r in items if r["output_tokens"] >= 2 and r["decode_s"] > 0)
    seconds = sum(r["decode_s"] for r in items if r["output_tokens"] >= 2 and r["decode_s"] > 0)
    return tokens / seconds if seconds > 0 else None


def summarize(items: list[dict[str, Any]], n_items: int, seeds: list[int] | None = None) -> dict[str, Any]:
    """Counts over the item records of one arm (n_items: how many the contract selects; seeds: the
    contract's run seeds, frozen seed first; default: the seeds the records carry, in order seen)."""
    if not seeds:
        seeds = list(dict.fromkeys(int(r["seed"]) for r in items if "seed" in r)) or [0]
    frozen = seeds[0]
    first = [r for r in items if seed_of(r, frozen) == frozen]

    def count(key: str, rows: list[dict[str, Any]] = items) -> int:
        return sum(1 for r in rows if r.get(key))

    return {
        "n_items": n_items,
        "seeds": list(seeds),
        "n_seeds": len(seeds),
        "n_outputs": n_items * len(seeds),
        "n_done": len(items),
        "frozen_seed": frozen,
        "frozen_done": len(first),
        "raw_correct": count("raw_correct", first),
        "strict_correct": count("strict_correct", first),
        "correct_outputs": sum(1 for r in items if r.get("raw_correct") and r.get("strict_correct")),
        "natural_stops": count("natural_stop"),
        "closed_thinking": count("closed_thinking"),
        "length_caps": count("length_cap"),
        "invalid": count("invalid"),
        "fffd_total": sum(r.get("fffd_count", 0) for r in items),
        "max_window_repeats": max((r.get("max_window_repeats", 0) for r in items), default=0),
        "max_token_run": max((r.get("longest_token_run", 0) for r in items), default=0),
        "output_tokens": sum(r.get("output_tokens", 0) for r in items),
        "decode_tok_s": weighted_decode_tok_s(items),
        "raw_misses": sorted(r["index"] for r in first if not r.get("raw_correct")),
        "strict_misses": sorted(r["index"] for r in first if not r.get("strict_correct")),
        "item_rates": [{"index": i, **v} for i, v in item_rates(items, frozen).items()],
    }


def _at_least(name: str, got: int, want: int, total: int) -> Gate:
    return Gate(name, got >= want, f"{got}/{total}, contract asks >= {want}")


def _at_most(name: str, got: int, limit: int) -> Gate:
    return Gate(name, got <= limit, f"{got}, contract allows <= {limit}")


def _items_where(items: list[dict[str, Any]], pred: Any) -> str:
    """The items (with their seed when it is not the only one) where pred holds."""
    several = len({r.get("seed") for r in items}) > 1
    idx = [f"{r['index']}" + (f"/seed {r['seed']}" if several else "") for r in items if pred(r)]
    more = f" and {len(idx) - LIST_AT_MOST} more" if len(idx) > LIST_AT_MOST else ""
    return f" (items {', '.join(idx[:LIST_AT_MOST])}{more})" if idx else ""


def arm_gates(result: dict[str, Any], g: QualityGates, label: str = "candidate") -> list[Gate]:
    """The contract's per-run gates on one arm's result."""
    s = result["summary"]
    n, outputs = s["n_items"], s.get("n_outputs", s["n_items"])
    items = result["items"]
    seed_txt = f" (seed {s['frozen_seed']})" if s.get("n_seeds", 1) > 1 else ""
    gates = [
        Gate(
            RESULT_COMPLETE(arm=label),
            result.get("complete") is True and s["n_done"] == outputs,
            f"{s['n_done']}/{outputs} outputs ({n} items x {s.get('n_seeds', 1)} seed(s)), "
            f"complete = {result.get('complete')!r}",
            SEV_ERROR,
        ),
        _at_least(RAW_CORRECT(arm=label, seed=seed_txt), s["raw_correct"], g.min_raw_correct, n),
        _at_least(STRICT_CORRECT(arm=label, seed=seed_txt), s["strict_correct"], g.min_strict_correct, n),
    ]
    if g.all_natural_stops:
        detail = _items_where(items, lambda r: not r["natural_stop"])
        gate = _at_least(NATURAL_STOPS(arm=label), s["natural_stops"], outputs, outputs)
        gates.append(replace(gate, detail=gate.detail + detail))
    if g.all_closed_thinking:
        detail = _items_where(items, lambda r: not r["closed_thinking"])
        gate = _at_least(CLOSED_THINKING(arm=label), s["closed_thinking"], outputs, outputs)
        gates.append(replace(gate, detail=gate.detail + detail))
    caps = _at_most(LENGTH_CAPS(arm=label), s["length_caps"], g.max_length_caps)
    gates.append(replace(caps, detail=caps.detail + _items_where(items, lambda r: r["length_cap"])))
    invalid = _items_where(items, lambda r: r["invalid"])
    gate = _at_most(INVALID(arm=label), s["invalid"], g.max_invalid)
    gates.append(replace(gate, detail=gate.detail + invalid))
    gates.append(_at_most(FFFD(arm=label), s["fffd_total"], g.max_fffd))
    gates.append(
        Gate(
            REPEATED_WINDOW(arm=label),
            s["max_window_repeats"] < g.repeated_window_below,
            f"highest count {s['max_window_repeats']}, contract asks < {g.repeated_window_below}",
        )
    )
    gates.append(
        Gate(
            TOKEN_RUN(arm=label),
            s["max_token_run"] < g.token_run_below,
            f"longest run {s['max_token_run']}, contract asks < {g.token_run_below}",
        )
    )
    return gates


def new_misses(reference: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """Candidate misses (raw or strict) on item-seed pairs the reference answered (a description, not a
    gate: `qgate ablate` lists them per derived arm). Records without `seed` ran under one seed."""
    ref = {(r.get("seed"), r["index"]): r for r in reference["items"]}
    out = []
    for r in candidate["items"]:
        base = ref.get((r.get("seed"), r["index"]))
        for kind in ("raw", "strict"):
            if not r[f"{kind}_correct"] and (base is None or base[f"{kind}_correct"]):
                out.append({"index": r["index"], "seed": r.get("seed"), "extractor": kind, "gold": r["gold"],
                            "predicted": r[f"{kind}_answer"]})  # fmt: skip
    return out


def paired_gate(
    control: dict[str, Any], candidate: dict[str, Any], seeds: list[int], g: QualityGates
) -> tuple[Gate, PairedTest]:
    """The paired exact test as a gate: FAIL on a regression, INCONCLUSIVE without the power, ERROR
    when it cannot be computed; and the test record."""
    test = paired_test(
        control.get("items", []), candidate.get("items", []), seeds, g.alpha, g.detect_broken_items,
        g.min_power,
    )  # fmt: skip
    flagged = [f for f in test.findings if f.finding == "likely regression"]
    detail = test.reason
    if flagged:
        listed = ", ".join(
            f"{f.index} (control {f.control_correct}/{f.control_runs}, candidate "
            f"{f.candidate_correct}/{f.candidate_runs})"
            for f in flagged[:LIST_AT_MOST]
        )
        more = f" and {len(flagged) - LIST_AT_MOST} more" if len(flagged) > LIST_AT_MOST else ""
        detail += f"; likely real regressions (the control answered every seed): items {listed}{more}"
    severity = {ERROR: SEV_ERROR, INCONCLUSIVE: SEV_INCONCLUSIVE}.get(test.verdict, SEV_FAIL)
    return Gate(PAIRED(), test.verdict == NO_REGRESSION, detail, severity), test
