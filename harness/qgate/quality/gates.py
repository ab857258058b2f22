"""Run-level counts of a quality result and the contract's quality gates. Pure functions on records.

A gate is a dict {name, passed, detail, severity}: severity "error" when the comparison itself cannot be
trusted (an incomplete result, arms run on different items or prompts), "fail" otherwise.

A miss is an item whose answer is not correct, counted per extractor (raw and strict). Matched misses:
every candidate miss must also be a reference miss, for both extractors; a reference miss that the
candidate answers correctly is fine.
"""

from __future__ import annotations

from typing import Any

from qgate.quality.schema import QualityGates

SEV_FAIL, SEV_ERROR = "fail", "error"


def make_gate(name: str, passed: bool, detail: str, severity: str = SEV_FAIL) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail, "severity": severity}


def weighted_decode_tok_s(items: list[dict[str, Any]]) -> float | None:
    """Pure decode tok/s over all items, weighted by tokens: sum(n - 1) / sum(decode seconds)."""
    tokens = sum(r["output_tokens"] - 1 for r in items if r["output_tokens"] >= 2 and r["decode_s"] > 0)
    seconds = sum(r["decode_s"] for r in items if r["output_tokens"] >= 2 and r["decode_s"] > 0)
    return tokens / seconds if seconds > 0 else None


def summarize(items: list[dict[str, Any]], n_items: int) -> dict[str, Any]:
    """Counts over the item records of one arm (n_items: how many the contract selects)."""

    def count(key: str) -> int:
        return sum(1 for r in items if r.get(key))

    return {
        "n_items": n_items,
        "n_done": len(items),
        "raw_correct": count("raw_correct"),
        "strict_correct": count("strict_correct"),
        "natural_stops": count("natural_stop"),
        "closed_thinking": count("closed_thinking"),
        "length_caps": count("length_cap"),
        "invalid": count("invalid"),
        "fffd_total": sum(r.get("fffd_count", 0) for r in items),
        "max_window_repeats": max((r.get("max_window_repeats", 0) for r in items), default=0),
        "max_token_run": max((r.get("longest_token_run", 0) for r in items), default=0),
        "output_tokens": sum(r.get("output_tokens", 0) for r in items),
        "decode_tok_s": weighted_decode_tok_s(items),
        "raw_misses": sorted(r["index"] for r in items if not r.get("raw_correct")),
        "strict_misses": sorted(r["index"] for r in items if not r.get("strict_correct")),
    }


def _at_least(name: str, got: int, want: int, total: int) -> dict[str, Any]:
    return make_gate(name, got >= want, f"{got}/{total}, contract asks >= {want}")


def _at_most(name: str, got: int, limit: int) -> dict[str, Any]:
    return make_gate(name, got <= limit, f"{got}, contract allows <= {limit}")


def _items_where(items: list[dict[str, Any]], pred: Any) -> str:
    idx = [str(r["index"]) for r in items if pred(r)]
    return f" (items {', '.join(idx)})" if idx else ""


def arm_gates(result: dict[str, Any], g: QualityGates, label: str = "candidate") -> list[dict[str, Any]]:
    """The contract's per-run gates on one arm's result."""
    s = result["summary"]
    n = s["n_items"]
    items = result["items"]
    gates = [
        make_gate(
            f"{label} result complete",
            result.get("complete") is True and s["n_done"] == n,
            f"{s['n_done']}/{n} items, complete = {result.get('complete')!r}",
            SEV_ERROR,
        ),
        _at_least(f"{label} raw correct", s["raw_correct"], g.min_raw_correct, n),
        _at_least(f"{label} strict correct", s["strict_correct"], g.min_strict_correct, n),
    ]
    if g.all_natural_stops:
        gates.append(_at_least(f"{label} natural stops", s["natural_stops"], n, n))
    if g.all_closed_thinking:
        detail = _items_where(items, lambda r: not r["closed_thinking"])
        gate = _at_least(f"{label} closed thinking", s["closed_thinking"], n, n)
        gates.append({**gate, "detail": gate["detail"] + detail})
    caps = _at_most(f"{label} length caps", s["length_caps"], g.max_length_caps)
    gates.append({**caps, "detail": caps["detail"] + _items_where(items, lambda r: r["length_cap"])})
    invalid = _items_where(items, lambda r: r["invalid"])
    gate = _at_most(f"{label} structurally invalid", s["invalid"], g.max_invalid)
    gates.append({**gate, "detail": gate["detail"] + invalid})
    gates.append(_at_most(f"{label} U+FFFD characters", s["fffd_total"], g.max_fffd))
    gates.append(
        make_gate(
            f"{label} repeated 50-char window",
            s["max_window_repeats"] < g.repeated_window_below,
            f"highest count {s['max_window_repeats']}, contract asks < {g.repeated_window_below}",
        )
    )
    gates.append(
        make_gate(
            f"{label} same-token run",
            s["max_token_run"] < g.token_run_below,
            f"longest run {s['max_token_run']}, contract asks < {g.token_run_below}",
        )
    )
    return gates


def new_misses(reference: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """Candidate misses (raw or strict) that the reference got right: each breaks the matched-miss gate."""
    ref = {r["index"]: r for r in reference["items"]}
    out = []
    for r in candidate["items"]:
        base = ref.get(r["index"])
        for kind in ("raw", "strict"):
            if not r[f"{kind}_correct"] and (base is None or base[f"{kind}_correct"]):
                out.append({"index": r["index"], "extractor": kind, "gold": r["gold"],
                            "predicted": r[f"{kind}_answer"]})  # fmt: skip
    return out


def matched_gate(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    found = new_misses(reference, candidate)
    if not found:
        return make_gate("matched misses", True, "every candidate miss is also a reference miss")
    by_item: dict[int, list[dict[str, Any]]] = {}
    for m in found:
        by_item.setdefault(m["index"], []).append(m)
    listed = "; ".join(
        f"item {i} (expected {ms[0]['gold']}): "
        + ", ".join(f"{m['extractor']} {m['predicted'] or 'none'}" for m in ms)
        for i, ms in sorted(by_item.items())
    )
    return make_gate(
        "matched misses", False, f"{len(by_item)} item(s) missed only by the candidate: {listed}"
    )
