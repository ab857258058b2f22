"""Compare two quality results: the contract's gates on the candidate, matched misses, the miss table.

`compare_quality(control, candidate, contract)` is what `qgate compare` calls for `kind: quality`
results. The control is the reference (the control arm's run, or a stored reference result given in
its place). The shared checks (same contract, model, versions; route attestation) are done by
qgate.compare; the checks here are the quality-specific ones: the same items, sampling and prompts.
"""

from __future__ import annotations

from typing import Any

from qgate.quality.gates import SEV_ERROR, arm_gates, make_gate, matched_gate, summarize
from qgate.quality.schema import Quality


def _quality_section(contract: Any, candidate: dict[str, Any]) -> Quality:
    """The Quality model from a Contract, a LoadedContract, or (without one) the candidate's record."""
    inner = getattr(contract, "contract", contract)
    section = getattr(inner, "quality", None)
    if isinstance(section, Quality):
        return section
    return Quality.model_validate(candidate["quality"])


def same_inputs_gate(control: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Both arms ran the same items with the same quality settings and the same prompt token ids."""
    problems = []
    for key in ("dataset", "quality"):
        a, b = dict(control.get(key) or {}), dict(candidate.get(key) or {})
        a.pop("source", None), b.pop("source", None)  # the same items may come from another path
        if a != b:
            problems.append(f"{key} differs")
    prompts_a = {r["index"]: r.get("prompt_sha256") for r in control.get("items", [])}
    prompts_b = {r["index"]: r.get("prompt_sha256") for r in candidate.get("items", [])}
    differing = sorted(i for i in prompts_a.keys() & prompts_b.keys() if prompts_a[i] != prompts_b[i])
    if differing:
        problems.append(f"prompt token ids differ for items {differing}")
    if problems:
        return make_gate(
            "same items and prompts", False, "refuse to compare: " + "; ".join(problems), SEV_ERROR
        )
    return make_gate("same items and prompts", True, "same items, sampling and prompt token ids", SEV_ERROR)


def miss_table(control: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per item that either arm missed (raw or strict), predicted vs expected for both."""
    ctrl = {r["index"]: r for r in control.get("items", [])}
    rows = []
    for r in sorted(candidate.get("items", []), key=lambda x: x["index"]):
        c = ctrl.get(r["index"], {})
        missed = [not x.get(k, False) for x in (r, c) for k in ("raw_correct", "strict_correct")]
        if not any(missed):
            continue
        new = (not r["raw_correct"] and c.get("raw_correct", True)) or (
            not r["strict_correct"] and c.get("strict_correct", True)
        )
        rows.append(
            {
                "index": r["index"],
                "gold": r["gold"],
                "control_raw": c.get("raw_answer"),
                "control_strict": c.get("strict_answer"),
                "candidate_raw": r["raw_answer"],
                "candidate_strict": r["strict_answer"],
                "candidate_finish": r["finish_reason"],
                "candidate_tokens": r["output_tokens"],
                "new_miss": bool(new),
            }
        )
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|")


_FIGURES = (
    ("raw correct", "raw_correct"),
    ("strict correct", "strict_correct"),
    ("natural stops", "natural_stops"),
    ("closed thinking", "closed_thinking"),
    ("length caps", "length_caps"),
    ("structurally invalid", "invalid"),
    ("U+FFFD characters", "fffd_total"),
    ("highest 50-char window count", "max_window_repeats"),
    ("longest same-token run", "max_token_run"),
    ("output tokens", "output_tokens"),
    ("decode tok/s (token-weighted)", "decode_tok_s"),
)


def render_markdown(q: Quality, sums: dict[str, dict], misses: list[dict], gates: list[dict]) -> str:
    n, sp = q.n_items, q.sampling
    lines = [
        f"**GSM8K {q.split} items {q.first_index}-{q.last_index} ({n} items)**",
        "",
        f"Sampling: temperature {sp.temperature}, top_p {sp.top_p}, top_k {sp.top_k}, "
        f"seed {sp.seed}, max_tokens {sp.max_tokens}; strict formats: "
        f"{', '.join(q.strict_formats)}.",
        "",
        "| figure | control | candidate |",
        "| --- | ---: | ---: |",
    ]
    for label, key in _FIGURES:
        lines.append(f"| {label} | {_fmt(sums['control'][key])} | {_fmt(sums['candidate'][key])} |")
    lines += ["", "### Misses (predicted vs expected)", ""]
    if misses:
        lines += [
            "| item | expected | control raw | control strict | candidate raw | candidate strict "
            "| candidate finish | new miss |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for m in misses:
            cells = [m["index"], m["gold"], m["control_raw"], m["control_strict"], m["candidate_raw"],
                     m["candidate_strict"], f"{m['candidate_finish']} ({m['candidate_tokens']} tok)",
                     "**yes**" if m["new_miss"] else "no"]  # fmt: skip
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    else:
        lines.append("No misses in either arm.")
    lines += ["", "### Quality gates", "", "| gate | result | detail |", "| --- | --- | --- |"]
    for g in gates:
        lines.append(f"| {g['name']} | {'pass' if g['passed'] else 'FAIL'} | {_fmt(g['detail'])} |")
    return "\n".join(lines) + "\n"


def compare_quality(control: dict[str, Any], candidate: dict[str, Any], contract: Any) -> dict[str, Any]:
    """Gates [{name, passed, detail, severity}], the miss table, figures and a markdown section."""
    q = _quality_section(contract, candidate)
    # Recounted from the item records: the saved summary is derived data.
    sums = {
        "control": summarize(control.get("items", []), q.n_items),
        "candidate": summarize(candidate.get("items", []), q.n_items),
    }
    ctrl = {**control, "summary": sums["control"]}
    cand = {**candidate, "summary": sums["candidate"]}
    gates = [same_inputs_gate(control, candidate)]
    gates.append(arm_gates(ctrl, q.gates, "control")[0])  # the reference must be complete too
    gates += arm_gates(cand, q.gates, "candidate")
    if q.gates.matched_misses:
        gates.append(matched_gate(ctrl, cand))
    misses = miss_table(control, candidate)
    return {
        "gates": gates,
        "misses": misses,
        "figures": sums,
        "markdown": render_markdown(q, sums, misses, gates),
    }
