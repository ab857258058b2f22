"""The quality section of a verdict report, rendered from the record's quality data alone (settings,
figures, misses, the paired test: what qgate.quality.compare.compare_quality returns) and its gates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qgate.gate import Gate
from qgate.quality.paired import LIKELY_REGRESSION, single_seed_caveat
from qgate.report.escape import Md, md, md_cell


def _fmt(value: Any) -> str:
    """A table cell: a float to one place, data escaped (md_cell), the renderer's own markup (Md) as is."""
    if value is None:
        return "—"
    if isinstance(value, Md):
        return value
    if isinstance(value, float):
        return f"{value:.1f}"
    return md_cell(value)


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


def _paired_lines(t: dict[str, Any], n_seeds: int) -> list[str]:
    pct = lambda x: "—" if x is None else f"{100 * x:.0f} %"  # noqa: E731
    seeds_pw = t["seeds_for_power"] if t["seeds_for_power"] is not None else "—"
    seeds_obs = t["seeds_for_observed"] if t["seeds_for_observed"] is not None else "—"
    lines = [
        "### Paired test (every item under every seed)",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| item-seed pairs | {_fmt(t['pairs'])} |",
        f"| candidate-only misses (b) | {_fmt(t['b_candidate_only_misses'])} |",
        f"| control-only misses (c) | {_fmt(t['c_control_only_misses'])} |",
        f"| one-sided exact sign test p | {_fmt_p(t['p_one_sided'])} |",
        f"| alpha | {md_cell(t['alpha'])} |",
        f"| power against {_fmt(t['detect_broken_items'])} broken items (control's rates) "
        f"| {pct(t['power'])} |",
        f"| seeds for {pct(t['min_power'])} power | {_fmt(seeds_pw)} |",
        f"| seeds at which the observed discordance reaches alpha | {_fmt(seeds_obs)} |",
        f"| outcome | {_fmt(t['verdict'])} |",
        "",
        f"{md(t['reason'])}.",
        "",
    ]
    if n_seeds == 1:
        lines += [f"**What one seed cannot tell.** {md(single_seed_caveat(t['alpha']))}", ""]
    return lines


def _fmt_p(p: float | None) -> str:
    return "—" if p is None else f"{p:.4g}"


def _rates_lines(sums: dict[str, dict], t: dict[str, Any]) -> list[str]:
    """Per-item correct rates of both arms (raw and strict right), with the finding per item."""
    ctrl = {r["index"]: r for r in sums["control"]["item_rates"]}
    cand = {r["index"]: r for r in sums["candidate"]["item_rates"]}
    found = {f["index"]: f for f in t["findings"]}
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
            finding = Md("**likely regression**") if f["finding"] == LIKELY_REGRESSION else f["finding"]
        gold = f["gold"] if f is not None else ""
        cells = [index, gold or "", f"{a['correct']}/{a['runs']}" if a else "—",
                 f"{b['correct']}/{b['runs']}" if b else "—", finding]  # fmt: skip
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return [*lines, ""]


def render_quality(section: dict[str, Any], gates: Sequence[Mapping[str, Any] | Gate]) -> str:
    """The quality section of a verdict report from the record's quality data and the quality gates
    (gate dicts of a record, or Gate); a comparison that failed says why."""
    if "settings" not in section:  # the comparison failed (its gates say so) or a comparer gave no data
        why = md(section.get("error") or "No quality figures in the record.")
        return "\n".join([why, "", *_gate_lines(gates)]) + "\n"
    q, sums, misses, test = section["settings"], section["figures"], section["misses"], section["paired_test"]
    n, sp, seeds = q["n_items"], q["sampling"], q["run_seeds"]
    outputs = n * len(seeds)
    seed_line = (
        f"seed {md(sp['seed'])}"
        if len(seeds) == 1
        else f"{len(seeds)} seeds ({md(', '.join(map(str, seeds)))}; frozen seed {md(seeds[0])})"
    )
    lines = [
        f"**GSM8K {md(q['split'])} items {md(q['first_index'])}-{md(q['last_index'])} ({md(n)} items)**",
        "",
        f"Sampling: temperature {md(sp['temperature'])}, top_p {md(sp['top_p'])}, top_k {md(sp['top_k'])}, "
        f"{seed_line}, max_tokens {md(sp['max_tokens'])}; strict formats: "
        f"{md(', '.join(map(str, q['strict_formats'])))}.",
        "",
        "| figure | control | candidate |",
        "| --- | ---: | ---: |",
    ]
    for label, key, denom in _figures(seeds[0], outputs):
        cells = [_fmt(sums[arm][key]) + (f"/{denom}" if denom else "") for arm in ("control", "candidate")]
        lines.append(f"| {md_cell(label)} | {cells[0]} | {cells[1]} |")
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
                     Md("**yes**") if m["new_miss"] else "no"]  # fmt: skip
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    else:
        lines.append("No misses in either arm.")
    return "\n".join([*lines, "", *_gate_lines(gates)]) + "\n"


def _gate_lines(gates: Sequence[Mapping[str, Any] | Gate]) -> list[str]:
    lines = ["### Quality gates", "", "| gate | result | detail |", "| --- | --- | --- |"]
    for g in gates:
        result = (
            "pass"
            if g["passed"]
            else {"error": "ERROR", "inconclusive": "INCONCLUSIVE"}.get(g["severity"], "FAIL")
        )
        lines.append(f"| {_fmt(g['name'])} | {result} | {_fmt(g['detail'])} |")
    return lines
