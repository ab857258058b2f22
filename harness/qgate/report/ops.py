"""Markdown tables of the ops screen and benchmark records (strings only: the CLI prints or saves them)."""

from __future__ import annotations

from typing import Any

from qgate.report.escape import md, md_cell, md_code


def _table(title: str, columns: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table under its title paragraph: the header, then one line per row of cells."""
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]


def _conditions_row(c: dict[str, Any]) -> list[str]:
    plain = c.get("plain_timing", {}).get("median_us")
    ap = c.get("after_producer", {})
    gb = ap.get("route_gb_s")
    return [c["route"], c["label"], f"{c['route_timing']['median_us']:.2f}", _fmt(plain, ".2f")] + [
        _fmt(v, ".2f")
        for v in (ap.get("route_us"), gb / 1000 if gb else None, ap.get("baseline_us"), ap.get("producer_us"))
    ]


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def screen_markdown(record: dict[str, Any]) -> str:
    dev = record["device"]
    lines = [
        f"# qgate ops screen: {'PASS' if record['passed'] else 'FAIL'}",
        "",
        f"Device {md(dev.get('gpu', dev['device']))}, torch {md(dev['torch'])}, seed {md(record['seed'])}, "
        f"started {md(record['started_at'])}.",
        "",
        "| route | shape | over bound | worst err/bound | bitwise = ref | max abs diff | max ULP "
        "| deterministic | graph replay | fallback probe | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if record.get("overrides"):  # the arm's overrides ran instead of the routes' kernels
        runs = ", ".join(f"{md(route)}: {md_code(spec)}" for route, spec in record["overrides"].items())
        arm = md_code(record.get("arm"))
        lines[3:3] = [f"Arm {arm}: overridden routes screened on the override ({runs}).", ""]
    elif record.get("arm"):
        lines[3:3] = [f"Arm {md_code(record['arm'])}: no route overridden; the routes' kernels screened.", ""]
    if record.get("unseen"):  # qgate.ops.seen: what of the arm's code the screen did not run
        blind = [f"- {md(u)}" for u in record["unseen"]]
        arm = md_code(record.get("arm"))
        lines[3:3] = [f"Not seen by this screen (it cannot vouch for arm {arm}):", *blind, ""]
    for c in record["cases"]:
        probe = c.get("fallback_probe")
        probe_txt = "n/a" if probe is None else _fmt(probe["counted"] and probe["equal_to_reference"])
        verdict = "pass" if c["passed"] else "FAIL: " + "; ".join(c["failures"])
        b = c.get("bound") or {}
        judged = bool(b.get("outputs"))
        over = f"{b['over_bound']}/{b['outputs']}" if judged else "n/a"
        cells = [
            c["route"], c["label"], over, _fmt(b["worst_ratio"] if judged else None, ".4g"),
            f"{c.get('bitwise_equal', 'n/a')}/{c['trials']}", _fmt(c.get("max_abs_diff")),
            _fmt(c.get("max_ulp")), _fmt(c.get("deterministic")), _fmt(c.get("graph_replay_identical")),
            probe_txt, verdict,
        ]  # fmt: skip
        lines.append("| " + " | ".join(md_cell(x) for x in cells) + " |")
    if record.get("bias"):
        lines += ["", "Sign test of the deviations from the correctly rounded result (docs/ops.md):", ""]
        lines += [
            f"- {md(t['route'])}: {t['above_rn']} above, {t['below_rn']} below, p = {t['p_value']:.3g} "
            f"(alpha {t['alpha']}): {'ok' if t['passed'] else 'FAIL'}"
            for t in record["bias"]
        ]
    return "\n".join(lines) + "\n"


def _copy_ways(record: dict[str, Any]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in record.get("copy_detail_gb_s", {}).items() if k != "best"]


def _step_rows(c: dict[str, Any]) -> list[str]:
    step = c.get("decode_step", {})
    comp = step.get("competitors_us", {})
    best = c["best_competitor"]
    return [
        c["route"],
        c["label"],
        _fmt(step.get("route_us"), ".2f"),
        best,
        _fmt(comp.get(best), ".2f"),
        f"{c['vs_best']:.2f}x",
        f"{c['route_timing']['median_us']:.2f}",
        f"{c['vs_best_back_to_back']:.2f}x",
        ", ".join(f"{k}={v:g}" for k, v in c["target"].items()) or "-",
        _fmt(c["target_met"]),
    ]


def _chain_rows(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, r in record.get("chains", {}).items():
        vllm = _fmt(r.get("vllm_us"), ".2f") if "vllm_us" in r else r.get("vllm_cannot_run", "n/a")
        ratio = f"{r['vs_vllm']:.2f}x" if "vs_vllm" in r else "n/a"
        rows.append(
            [name, f"{r['sets']}", f"{r['route_us']:.2f}", vllm, ratio, f"{r['glue_us']:.2f}"]
            + [_fmt(r.get("target_met"))]
        )
    return rows


def bench_markdown(record: dict[str, Any]) -> str:
    dev = record["device"]
    lines = [
        "# qgate ops benchmark",
        "",
        f"Device {md(dev.get('gpu', dev['device']))}, torch {md(dev['torch'])}; "
        f"timing: {md(record['timing'])}; "
        f"device copy {record['copy_gb_s'] / 1000:.2f} TB/s (read + write; "
        + ", ".join(f"{k} {v / 1000:.2f}" for k, v in _copy_ways(record))
        + ").",
    ]
    lines += _table(
        "Decode step (the headline: each call between a producer and a consumer of other kinds, the same "
        "for every side, inputs rotated past L2; us = [producer, op, consumer] minus [producer, consumer]). "
        "vs best: the best competitor's us (vLLM's paths and the baseline) over the route's; back to back: "
        "calls of one kind in one graph, a second condition, not judged:",
        ["route", "shape", "route us", "best competitor", "its us", "vs best"]
        + ["back to back: route us", "vs best", "target", "met"],
        [_step_rows(c) for c in record["cases"]],
    )
    chain_rows = _chain_rows(record)
    if chain_rows:
        lines += _table(
            "Layer chains (one GDN and one attention layer's routed ops in model order, bf16, TP=4 shapes; "
            "us = the chain minus its stand-ins (glue); vs vLLM: vLLM's ops over the routes', target 1.2x):",
            ["chain", "sets", "routes us", "vLLM us", "vs vLLM", "glue us", "met"],
            chain_rows,
        )
    lines += _table(
        "Back to back against the baseline:",
        ["route", "shape", "route us", "route TB/s", "% of copy", "baseline", "baseline us", "baseline TB/s"]
        + ["speed-up", "sets (MB)"],
        [
            [
                c["route"],
                c["label"],
                f"{c['route_timing']['median_us']:.2f}",
                f"{c['route_timing']['gb_s'] / 1000:.2f}",
            ]
            + [_fmt(c["pct_of_copy"], ".0f"), c["baseline"], f"{c['baseline_timing']['median_us']:.2f}"]
            + [f"{c['baseline_timing']['gb_s'] / 1000:.2f}", f"{c['speedup']:.2f}x"]
            + [f"{c['input_sets']} ({c['rotated_bytes'] / 1e6:.0f})"]
            for c in record["cases"]
        ],
    )
    fell = [c for c in record["cases"] if c.get("route_fallbacks")]
    if fell:
        lines += ["", "ROUTE FELL BACK (the reference was timed, not the kernel; targets not met):", ""]
        lines += [f"- {md(c['route'])} {md(c['label'])}: {md(c['route_fallbacks'])}" for c in fell]
    rivals = [c for c in record["cases"] if c.get("competitors")]
    if rivals:
        lines += _table(
            "Against what vLLM itself runs (same sets, same run; decode step and back to back):",
            ["route", "shape", "competitor", "decode step us or why not", "back to back us"],
            [
                [c["route"], c["label"], name]
                + [
                    _fmt(c.get("decode_step", {}).get("competitors_us", {}).get(name), ".2f")
                    if "median_us" in r
                    else r["cannot_run"]
                ]
                + [f"{r['median_us']:.2f}" if "median_us" in r else "-"]
                for c in rivals
                for name, r in c["competitors"].items()
            ],
        )
    conditions = [c for c in record["cases"] if "plain_timing" in c or "after_producer" in c]
    if conditions:
        lines += _table(
            "Launch conditions (route us above: calls back to back, launched as the vLLM plugin launches "
            "them; plain: without the static-weight (PDL) launch; after producer: each call right after "
            "a kernel that writes its input, that kernel's time subtracted):",
            ["route", "shape", "back to back us", "plain us", "after producer: route us", "TB/s"]
            + ["baseline us", "producer us"],
            [_conditions_row(c) for c in conditions],
        )
    by_input = [c for c in record["cases"] if c.get("by_input")]
    if by_input:
        lines += _table(
            "By input (the route on each kind of input set the case draws: decode step, and back to back):",
            ["route", "shape", "input", "sets", "decode step us", "back to back us", "min us"],
            [
                [c["route"], c["label"], kind, f"{t['sets']}"]
                + [_fmt(c.get("decode_step", {}).get("route_by_input_us", {}).get(kind), ".2f")]
                + [f"{t['median_us']:.2f}", f"{t['min_us']:.2f}"]
                for c in by_input
                for kind, t in c["by_input"].items()
            ],
        )
    return "\n".join(lines) + "\n"
