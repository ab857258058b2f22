"""Compare two quality results: the contract's gates on the candidate, the paired test, per-item rates.

`compare_quality(control, candidate, contract)` is what `qgate compare` calls for `kind: quality`
results. The control is the reference (the control arm's run, or a stored reference result given in
its place). The shared checks (same contract, model, versions; route attestation) are done by
qgate.compare; the checks here are the quality-specific ones: the same items, sampling and prompts.
"""

from __future__ import annotations

from typing import Any

from qgate.gate import SEV_ERROR, Gate
from qgate.quality.gates import arm_gates, make_gate, paired_gate, summarize
from qgate.quality.paired import LIKELY_REGRESSION, PairedTest, seed_of, single_seed_caveat
from qgate.quality.schema import Quality


def _quality_section(contract: Any, candidate: dict[str, Any]) -> Quality:
    """The Quality model from a Contract, a LoadedContract, or (without one) the candidate's record."""
    inner = getattr(contract, "contract", contract)
    section = getattr(inner, "quality", None)
    if isinstance(section, Quality):
        return section
    return Quality.model_validate(candidate["quality"])


def same_inputs_gate(control: dict[str, Any], candidate: dict[str, Any]) -> Gate:
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


def _frozen_run(items: list[dict[str, Any]], frozen_seed: int | None) -> list[dict[str, Any]]:
    if frozen_seed is None:
        return list(items)
    return [r for r in items if seed_of(r, frozen_seed) == frozen_seed]


def miss_table(
    control: dict[str, Any], candidate: dict[str, Any], frozen_seed: int | None = None
) -> list[dict[str, Any]]:
    """One row per item that either arm missed (raw or strict) on the frozen seed's run (all records
    when frozen_seed is None), predicted vs expected for both."""
    ctrl = {r["index"]: r for r in _frozen_run(control.get("items", []), frozen_seed)}
    rows = []
    for r in sorted(_frozen_run(candidate.get("items", []), frozen_seed), key=lambda x: x["index"]):
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


def _figures(seed: int, outputs: int) -> tuple[tuple[str, str, int | None], ...]:
    """(label, summary key, denominator or None) of the figures table."""
    return (
        (f"raw correct (frozen seed {seed})", "raw_correct", None),
        (f"strict correct (frozen seed {seed})", "strict_correct", None),
        ("correct outputs, every seed (raw and strict)", "correct_outputs", outputs),
        ("natural stops", "natural_stops", outputs),
        ("closed thinking", "closed_thinking", outputs),
        ("length caps", "length_caps", None),
        ("structurally invalid", "invalid", None),
        ("U+FFFD characters", "fffd_total", None),
        ("highest 50-char window count", "max_window_repeats", None),
        ("longest same-token run", "max_token_run", None),
        ("output tokens", "output_tokens", None),
        ("decode tok/s (token-weighted, every output)", "decode_tok_s", None),
    )


def _paired_lines(t: PairedTest, n_seeds: int) -> list[str]:
    pct = lambda x: "—" if x is None else f"{100 * x:.0f} %"  # noqa: E731
    seeds_pw = t.seeds_for_power if t.seeds_for_power is not None else "—"
    seeds_obs = t.seeds_for_observed if t.seeds_for_observed is not None else "—"
    lines = [
        "### Paired test (every item under every seed)",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| item-seed pairs | {t.pairs} |",
        f"| candidate-only misses (b) | {t.b_candidate_only_misses} |",
        f"| control-only misses (c) | {t.c_control_only_misses} |",
        f"| one-sided exact sign test p | {_fmt_p(t.p_one_sided)} |",
        f"| alpha | {t.alpha} |",
        f"| power against {t.detect_broken_items} broken items (control's rates) | {pct(t.power)} |",
        f"| seeds for {pct(t.min_power)} power | {seeds_pw} |",
        f"| seeds at which the observed discordance reaches alpha | {seeds_obs} |",
        f"| outcome | {t.verdict} |",
        "",
        f"{t.reason}.",
        "",
    ]
    if n_seeds == 1:
        lines += [f"**What one seed cannot tell.** {single_seed_caveat(t.alpha)}", ""]
    return lines


def _fmt_p(p: float | None) -> str:
    return "—" if p is None else f"{p:.4g}"


def _rates_lines(sums: dict[str, dict], t: PairedTest) -> list[str]:
    """Per-item correct rates of both arms (raw and strict right), with the finding per item."""
    ctrl = {r["index"]: r for r in sums["control"]["item_rates"]}
    cand = {r["index"]: r for r in sums["candidate"]["item_rates"]}
    found = {f.index: f for f in t.findings}
    lines = [
        "### Per-item correct rates (raw and strict right, over the seeds)",
        "",
        "| item | expected | control | candidate | finding |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for index in sorted(set(ctrl) | set(cand)):
        a, b = ctrl.get(index), cand.get(index)
        f = found.get(index)
        finding = ""
        if f is not None:
            finding = "**likely regression**" if f.finding == LIKELY_REGRESSION else f.finding
        gold = f.gold if f is not None else ""
        cells = [index, gold or "", f"{a['correct']}/{a['runs']}" if a else "—",
                 f"{b['correct']}/{b['runs']}" if b else "—", finding]  # fmt: skip
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return [*lines, ""]


def render_markdown(
    q: Quality, sums: dict[str, dict], misses: list[dict], gates: list[dict], test: PairedTest | None
) -> str:
    n, sp, seeds = q.n_items, q.sampling, q.run_seeds
    outputs = n * len(seeds)
    seed_line = (
        f"seed {sp.seed}"
        if len(seeds) == 1
        else f"{len(seeds)} seeds ({', '.join(map(str, seeds))}; frozen seed {seeds[0]})"
    )
    lines = [
        f"**GSM8K {q.split} items {q.first_index}-{q.last_index} ({n} items)**",
        "",
        f"Sampling: temperature {sp.temperature}, top_p {sp.top_p}, top_k {sp.top_k}, "
        f"{seed_line}, max_tokens {sp.max_tokens}; strict formats: "
        f"{', '.join(q.strict_formats)}.",
        "",
        "| figure | control | candidate |",
        "| --- | ---: | ---: |",
    ]
    for label, key, denom in _figures(seeds[0], outputs):
        cells = [_fmt(sums[arm][key]) + (f"/{denom}" if denom else "") for arm in ("control", "candidate")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    lines.append("")
    if test is not None:
        lines += _paired_lines(test, len(seeds))
        if len(seeds) > 1:
            lines += _rates_lines(sums, test)
    frozen = f" on the frozen seed's run ({seeds[0]})" if len(seeds) > 1 else ""
    lines += [f"### Misses{frozen} (predicted vs expected)", ""]
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
        result = (
            "pass"
            if g["passed"]
            else {"error": "ERROR", "inconclusive": "INCONCLUSIVE"}.get(g["severity"], "FAIL")
        )
        lines.append(f"| {g['name']} | {result} | {_fmt(g['detail'])} |")
    return "\n".join(lines) + "\n"


def compare_quality(control: dict[str, Any], candidate: dict[str, Any], contract: Any) -> dict[str, Any]:
    """Gates (qgate.gate.Gate), the miss table, figures and a markdown section."""
    q = _quality_section(contract, candidate)
    seeds = q.run_seeds
    # Recounted from the item records: the saved summary is derived data.
    sums = {
        "control": summarize(control.get("items", []), q.n_items, seeds),
        "candidate": summarize(candidate.get("items", []), q.n_items, seeds),
    }
    ctrl = {**control, "summary": sums["control"]}
    cand = {**candidate, "summary": sums["candidate"]}
    gates = [same_inputs_gate(control, candidate)]
    gates.append(arm_gates(ctrl, q.gates, "control")[0])  # the reference must be complete too
    gates += arm_gates(cand, q.gates, "candidate")
    test = None
    if q.gates.matched_misses:
        gate, test = paired_gate(ctrl, cand, seeds, q.gates)
        gates.append(gate)
    misses = miss_table(control, candidate, seeds[0])
    return {
        "gates": gates,
        "misses": misses,
        "figures": sums,
        "seeds": seeds,
        "paired_test": test.to_dict() if test is not None else None,
        "caveat": single_seed_caveat(q.gates.alpha) if len(seeds) == 1 else None,
        "markdown": render_markdown(q, sums, misses, gates, test),
    }
