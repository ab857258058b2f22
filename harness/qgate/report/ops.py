"""Markdown tables of the ops screen and benchmark records (strings only: the CLI prints or saves them)."""

from __future__ import annotations

from typing import Any


def _table(title: str, columns: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table under its title paragraph: the header, then one line per row of cells."""
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


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
        f"Device {dev.get('gpu', dev['device'])}, torch {dev['torch']}, seed {record['seed']}, "
        f"started {record['started_at']}.",
        "",
        "| route | shape | over bound | worst err/bound | bitwise = ref | max abs diff | max ULP "
        "| deterministic | graph replay | fallback probe | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if record.get("overrides"):  # the arm's overrides ran instead of the routes' kernels
        runs = ", ".join(f"{route}: `{spec}`" for route, spec in record["overrides"].items())
        lines[3:3] = [f"Arm `{record.get('arm')}`: overridden routes screened on the override ({runs}).", ""]
    elif record.get("arm"):
        lines[3:3] = [f"Arm `{record['arm']}`: no route overridden; the routes' kernels screened.", ""]
    for c in record["cases"]:
        probe = c.get("fallback_probe")
        probe_txt = "n/a" if probe is None else _fmt(probe["counted"] and probe["equal_to_reference"])
        verdict = "pass" if c["passed"] else "FAIL: " + "; ".join(c["failures"])
        b = c.get("bound") or {}
        judged = bool(b.get("outputs"))
        over = f"{b['over_bound']}/{b['outputs']}" if judged else "n/a"
        lines.append(
            f"| {c['route']} | {c['label']} | {over} | {_fmt(b['worst_ratio'] if judged else None, '.4g')} "
            f"| {c.get('bitwise_equal', 'n/a')}/{c['trials']} | "
            f"{_fmt(c.get('max_abs_diff'))} | {_fmt(c.get('max_ulp'))} | {_fmt(c.get('deterministic'))} | "
            f"{_fmt(c.get('graph_replay_identical'))} | {probe_txt} | {verdict} |"
        )
    if record.get("bias"):
        lines += ["", "Sign test of the deviations from the correctly rounded result (docs/ops.md):", ""]
        lines += [
            f"- {t['route']}: {t['above_rn']} above, {t['below_rn']} below, p = {t['p_value']:.3g} "
            f"(alpha {t['alpha']}): {'ok' if t['passed'] else 'FAIL'}"
            for t in record["bias"]
        ]
    return "\n".join(lines) + "\n"


def _copy_ways(record: dict[str, Any]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in record.get("copy_detail_gb_s", {}).items() if k != "best"]


def bench_markdown(record: dict[str, Any]) -> str:
    dev = record["device"]
    lines = [
        "# qgate ops benchmark",
        "",
        f"Device {dev.get('gpu', dev['device'])}, torch {dev['torch']}; timing: {record['timing']}; "
        f"device copy {record['copy_gb_s'] / 1000:.2f} TB/s (read + write; "
        + ", ".join(f"{k} {v / 1000:.2f}" for k, v in _copy_ways(record))
        + ").",
        "",
        "| route | shape | route us | route TB/s | % of copy | baseline | baseline us | baseline TB/s | "
        "speed-up | sets (MB) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in record["cases"]:
        r, b = c["route_timing"], c["baseline_timing"]
        target = ", ".join(f"{k}={v:g}" for k, v in c["target"].items()) or "-"
        lines.append(
            f"| {c['route']} | {c['label']} | {r['median_us']:.2f} | {r['gb_s'] / 1000:.2f} | "
            f"{_fmt(c['pct_of_copy'], '.0f')} | {c['baseline']} | {b['median_us']:.2f} | "
            f"{b['gb_s'] / 1000:.2f} | "
            f"{c['speedup']:.2f}x | {c['input_sets']} ({c['rotated_bytes'] / 1e6:.0f}) | {target} | "
            f"{_fmt(c['target_met'])} |"
        )
    fell = [c for c in record["cases"] if c.get("route_fallbacks")]
    if fell:
        lines += ["", "ROUTE FELL BACK (the reference was timed, not the kernel; targets not met):", ""]
        lines += [f"- {c['route']} {c['label']}: {c['route_fallbacks']}" for c in fell]
    rivals = [c for c in record["cases"] if c.get("competitors")]
    if rivals:
        lines += _table(
            "Against what vLLM itself runs (same sets, same run; vs best: the best competitor's us, "
            "baseline included, over the route's):",
            ["route", "shape", "route us", "competitor", "us or why not", "vs best"],
            [
                [c["route"], c["label"], f"{c['route_timing']['median_us']:.2f}", name]
                + [f"{r['median_us']:.2f}" if "median_us" in r else r["cannot_run"]]
                + [f"{c['vs_best']:.2f}x ({c['best_competitor']})"]
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
            "By input (the route timed on each kind of input set the case draws; the target is judged on "
            "all sets together, above):",
            ["route", "shape", "input", "sets", "route us", "min us"],
            [
                [c["route"], c["label"], kind, f"{t['sets']}", f"{t['median_us']:.2f}", f"{t['min_us']:.2f}"]
                for c in by_input
                for kind, t in c["by_input"].items()
            ],
        )
    return "\n".join(lines) + "\n"
