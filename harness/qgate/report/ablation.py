"""The ablation report: markdown tables and a PNG, rendered from an ablation record alone.

Deterministic output (fixed number formats, no timestamps in the markdown), so it can be rebuilt from
DIR/ablation.json at any time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qgate.report.escape import md, md_code, plot_text
from qgate.report.markdown import counts_text, sequential_lines
from qgate.report.tables import table
from qgate.report.timeline import timeline_lines
from qgate.stats import ERROR, IMPROVED, INCONCLUSIVE, NO_CHANGE, REGRESSED


def _num(value: Any, fmt: str = ".2f") -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return format(value, fmt)


def _ci(lo: Any, hi: Any, fmt: str = ".2f") -> str:
    return f"[{_num(lo, fmt)}, {_num(hi, fmt)}]"


def _signed(est: dict[str, Any], fmt: str = "+.3f") -> str:
    if est.get("error"):
        return f"error: {est['error']}"
    return f"{_num(est['estimate'], fmt)} {_ci(est['ci_low'], est['ci_high'], fmt)}"


def _factors(record: dict[str, Any]) -> list[str]:
    rows = []
    for f in record["factors"]:
        for var, v in f["vars"].items():
            rows.append(
                {
                    "factor": f["name"],
                    "kind": f["kind"],
                    "variable": var,
                    "control": "unset" if v["control"] is None else v["control"],
                    "candidate": "unset" if v["candidate"] is None else v["candidate"],
                }
            )
    return ["## Factors", "", table(pd.DataFrame(rows)), ""]


def _tokens(t: dict[str, Any]) -> str:
    if t["identical_to_control"]:
        return "identical"
    return f"diverge at {t['first_diverging_index']}"


def _arms(record: dict[str, Any]) -> list[str]:
    level = 100 * (1 - record["stats"]["alpha"])
    rows = []
    for arm in record["arms"]:
        f = arm["figures"]
        rows.append(
            {
                "arm": arm["name"],
                "factors on": ", ".join(arm["factors_on"]) or "none",
                "decode tok/s per rep": ", ".join(_num(v) for v in f["decode_tok_s"]),
                f"mean tok/s [{level:g} % CI]": _num(f["decode_tok_s_mean"])
                + " "
                + _ci(*f["decode_tok_s_ci"]),
                "mean TPOT (ms)": _num(f["tpot_ms_mean"], ".3f"),
                "tokens vs control": _tokens(arm["tokens"]),
                "same tokens for one prompt": {True: "yes", False: "NO", None: "n/a"}[
                    arm["tokens"]["identical_across_reps"]
                ],
                "routes attested": "yes" if arm["attested"] else "ERROR",
            }
        )
    return ["## Arms", "", table(pd.DataFrame(rows)), ""]


def _effect_row(label: str, kind: str, e: dict[str, Any]) -> dict[str, str]:
    d = e["decode"]
    return {
        "factor": label,
        "effect": kind,
        "arm vs reference": f"{e['arm']} vs {e['reference']}",
        "tok/s ratio [CI]": f"{_num(d.get('ratio'), '.4f')} {_ci(d.get('ci_low'), d.get('ci_high'), '.4f')}",
        "change": "n/a" if d.get("change_pct") is None else f"{d['change_pct']:+.2f} %",
        "TPOT change ms [CI]": _signed(e["tpot_delta_ms"]),
        "verdict": d["verdict"],
    }


def _effects(record: dict[str, Any]) -> list[str]:
    eff = record["effects"]
    rows = [_effect_row("all (candidate)", "total", eff["candidate"])]
    for f in record["factors"]:
        name = f["name"]
        if name in eff["alone"]:
            rows.append(_effect_row(name, "alone", eff["alone"][name]))
        if name in eff["leave_one_out"]:
            rows.append(_effect_row(name, "leave-one-out", eff["leave_one_out"][name]))
    reasons = [f"- {md(r['factor'])} ({md(r['effect'])}): {md(_reason(eff, r))}" for r in rows]
    return ["## Effects", "", table(pd.DataFrame(rows)), "", *reasons, ""]


def _reason(eff: dict[str, Any], row: dict[str, str]) -> str:
    if row["effect"] == "total":
        return eff["candidate"]["decode"]["reason"]
    group = eff["alone"] if row["effect"] == "alone" else eff["leave_one_out"]
    return group[row["factor"]]["decode"]["reason"]


def _interaction(record: dict[str, Any]) -> list[str]:
    inter = record["effects"]["interaction"]
    if not inter:
        return ["## Interaction", "", "One factor, or no complete set of single effects: not computed.", ""]
    rows = [
        {
            "basis": v["basis"],
            "TPOT ms/token [CI]": _signed(v["tpot_ms"]),
            "decode % points [CI]": _signed(v["decode_pct"], "+.2f"),
        }
        for v in inter.values()
    ]
    return [
        "## Interaction",
        "",
        "Candidate effect minus the sum of the single effects. On the TPOT scale independent routes add "
        "up (0 = no interaction); on the % scale even independent effects leave a small remainder.",
        "",
        table(pd.DataFrame(rows)),
        "",
    ]


def _routes(record: dict[str, Any]) -> list[str]:
    rows = []
    for arm in record["arms"]:
        for r in arm["routes"]:
            if not (r["switched_on"] or r["hits"] or r["fallbacks"]):
                continue
            rows.append(
                {
                    "arm": arm["name"],
                    "route": r["route"],
                    "switched on": "yes" if r["switched_on"] else "no",
                    "hits": r["hits"],
                    "hits by role": counts_text(r["roles"]),
                    "fallbacks": counts_text(r["fallback_reasons"]),
                }
            )
            if any(x.get("captures") for a in record["arms"] for x in a["routes"]):
                # hits are executions under CUDA graphs; the calls captured into the graphs beside them
                rows[-1]["captured calls by role"] = counts_text(r.get("captures_by_role") or {})
    if not rows:
        return ["## Route attestation", "", "No route was switched on or ran in any arm.", ""]
    return ["## Route attestation", "", table(pd.DataFrame(rows)), ""]


def _quality(record: dict[str, Any]) -> list[str]:
    lines = ["## Quality", "", str(record["quality"].get("detail", "")), ""]
    rows = []
    for arm in record["arms"]:
        q = arm.get("quality")
        if q is None:
            continue
        new = ", ".join(f"{m['index']} ({m['extractor']})" for m in q["new_misses_vs_control"]) or "none"
        rows.append(
            {
                "arm": arm["name"],
                "items": q["n_done"],
                "raw correct": q["raw_correct"],
                "strict correct": q["strict_correct"],
                "new misses vs control": new,
            }
        )
    if rows:
        lines += [table(pd.DataFrame(rows)), ""]
    return lines


def _timeline(record: dict[str, Any]) -> list[str]:
    # beside the per-route effects; a record without one (no --timeline, schema 2 and 3) renders as before
    return timeline_lines(record.get("timeline"))


def render_ablation(record: dict[str, Any]) -> str:
    """The markdown report of an ablation record."""
    c = record["contract"]
    s = record["stats"]
    lines = [
        f"# Ablation: {md(c['name'])} v{md(c['version'])}: {md(record['status'])}",
        "",
        f"Design {md_code(record['design'])}, {len(record['arms'])} arms; contract sha256 "
        f"{md_code(c['sha256'][:12])}; statistics: alpha {s['alpha']:g}, practical floor "
        f"{s['min_effect_pct']:g} %, CV limit {s['max_cv_pct']:g} %, {md(s['bootstrap_resamples'])} "
        f"bootstrap resamples (seed {md(s['seed'])}).",
        "",
    ]
    if record["reasons"]:
        lines += ["**ERROR: the ablation cannot be trusted:**", ""]
        lines += [f"- {md(r)}" for r in record["reasons"]] + [""]
    lines += [f"Note: {md(n)}." for n in record.get("notes", [])] + ([""] if record.get("notes") else [])
    after = "Looks compare the candidate with the control; the effects below are estimates at that size."
    lines += sequential_lines(record.get("sequential"), after)
    for part in (_factors, _arms, _effects, _interaction, _routes, _timeline, _quality):
        lines += part(record)
    return "\n".join(lines).rstrip() + "\n"


def ablation_png(record: dict[str, Any], path: str | Path) -> None:
    """Left: per-rep decode tok/s of every arm with its mean and CI. Right: each effect's ratio and CI."""
    fig = Figure(figsize=(11.0, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = [a["name"] for a in record["arms"]]
    for i, arm in enumerate(record["arms"]):
        f = arm["figures"]
        ys = [v for v in f["decode_tok_s"] if v is not None]
        ax.plot([i] * len(ys), ys, "o", color="#4c72b0", alpha=0.6, markersize=4)
        lo, hi = f["decode_tok_s_ci"]
        if f["decode_tok_s_mean"] is not None and lo is not None:
            m = f["decode_tok_s_mean"]
            ax.errorbar([i + 0.15], [m], yerr=[[m - lo], [hi - m]], fmt="s", color="#dd8452", capsize=4)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize="small")
    ax.set_ylabel("decode tok/s (dots: reps; square: mean, CI)")
    ax.grid(True, axis="y", alpha=0.3)
    _effects_panel(bx, record)
    c = record["contract"]
    fig.suptitle(plot_text(f"ablation {c['name']} ({record['design']}): {record['status']}"))
    fig.tight_layout()
    fig.savefig(str(path), format="png")


# Each effect coloured by what its statistics decided about the arm against its reference (not by arm):
# faster, slower, no change shown, or undecided.
OUTCOME_COLOURS = {
    IMPROVED: ("#2a9d3f", "faster (improved)"),
    NO_CHANGE: ("#7f7f7f", "no significant change"),
    REGRESSED: ("#d62728", "slower (regressed)"),
    INCONCLUSIVE: ("#e08a00", "inconclusive"),
    ERROR: ("#000000", "error"),
}


def _effects_panel(ax: Any, record: dict[str, Any]) -> None:
    """Each effect's decode change in % with its CI, on an axis centred on the effects (a zero-based
    ratio axis drew +4 % and +0.4 % alike), a reference line at no change, coloured by outcome."""
    eff = record["effects"]
    rows = [("all (candidate)", eff["candidate"])]
    for f in record["factors"]:
        if f["name"] in eff["alone"]:
            rows.append((f"{f['name']} alone", eff["alone"][f["name"]]))
        if f["name"] in eff["leave_one_out"]:
            rows.append((f"{f['name']} leave-one-out", eff["leave_one_out"][f["name"]]))
    shown: dict[str, str] = {}
    ends = [0.0]
    for y, (_, e) in enumerate(reversed(rows)):
        d = e["decode"]
        if d.get("ratio") is None or d.get("ci_low") is None:
            continue
        mid, lo, hi = (100 * (d[k] - 1) for k in ("ratio", "ci_low", "ci_high"))
        colour, label = OUTCOME_COLOURS.get(d["verdict"], OUTCOME_COLOURS[ERROR])
        ax.errorbar([mid], [y], xerr=[[mid - lo], [hi - mid]], fmt="o", color=colour, capsize=4,
                    label=None if label in shown else label)  # fmt: skip
        shown[label] = colour
        left = mid < 0  # the label beside the CI's outer end, away from the no-change line
        ax.annotate(f"{mid:+.1f} %", (lo if left else hi, y), xytext=(-6 if left else 6, 0),
                    textcoords="offset points", ha="right" if left else "left", va="center",
                    fontsize="x-small", color=colour)  # fmt: skip
        ends += [lo, hi]
    ax.axvline(0.0, color="#444444", linestyle="--", linewidth=1)
    low, high = min(ends), max(ends)
    span = (high - low) or 1.0
    # room for the labels on the side that has effects (and a little on the other)
    ax.set_xlim(low - (0.3 if low < 0 else 0.08) * span, high + (0.3 if high > 0 else 0.08) * span)
    ax.annotate("no change", (0.0, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 2),
                textcoords="offset points", ha="center", va="bottom", fontsize="x-small")  # fmt: skip
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize="small")
    ax.set_xlabel("decode tok/s change of the arm vs its reference, % (CI)")
    ax.grid(True, axis="x", alpha=0.3)
    if shown:  # in OUTCOME_COLOURS' order
        handles, labels = ax.get_legend_handles_labels()
        order = [lab for _, lab in OUTCOME_COLOURS.values()]
        pairs = sorted(zip(handles, labels, strict=True), key=lambda hl: order.index(hl[1]))
        ax.legend([h for h, _ in pairs], [lab for _, lab in pairs], loc="best", fontsize="x-small")
