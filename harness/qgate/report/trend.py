"""The trend report of the nightly history: markdown + PNG of decode tok/s and quality over the nights.

Input: the rows of qgate.history (one per arm per night). The nights, their events and the regression
nights are decided in qgate.trend; here they are drawn: the night table, the event list, and in the
PNG, FAIL/ERROR nights shaded and each regression night marked with its date.
Rendering only: no statistics or decisions here, and nothing is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qgate.report.escape import Md, md, md_cell, md_code
from qgate.trend import arm_value as _get
from qgate.trend import events, nights, regression_nights
from qgate.trend import pct_change as _pct
from qgate.trend import short_commit as _short

_COLORS = {"control": "#4c72b0", "candidate": "#dd8452", "gate": "#c44e52", "strict": "#8172b3"}


# ---------------------------------------------------------------- markdown


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f} %"


def _acc(row: dict[str, Any] | None, key: str) -> str:
    if not row or row.get("quality_selected") is None:
        return "n/a"
    return f"{row[key]}/{row['quality_selected']}"


def _health(row: dict[str, Any] | None) -> str:
    if not row or row.get("quality_selected") is None:
        return "n/a"
    n = row.get("quality_outputs") or row["quality_selected"]  # health: every output of every seed
    return (
        f"stops {row['natural_stops']}/{n}, closed {row['closed_thinking']}/{n}, caps {row['length_caps']}, "
        f"invalid {row['invalid_outputs']}, U+FFFD {row['fffd_chars']}, run {_f(row['max_token_run'], 'd')}, "
        f"window {_f(row['max_window_repeats'], 'd')}"
    )


def _night_line(entry: dict[str, Any], prev: dict[str, Any] | None) -> str:
    cand, ctrl = entry.get("candidate"), entry.get("control")
    c_mean, t_mean = (
        _get(entry, "control", "decode_tok_s_mean"),
        _get(entry, "candidate", "decode_tok_s_mean"),
    )
    cells = [
        entry["night"],
        md_code(_short(entry["commit"])),
        Md(f"**{md(entry['verdict'])}**") if entry["verdict"] else "none",
        _f(c_mean),
        _f(t_mean),
        _f(_get(entry, "candidate", "decode_tok_s_min")),
        _f(_get(entry, "candidate", "gate_min_decode_tok_s"), "g"),
        _signed(_pct(t_mean, c_mean)),
        _signed(_pct(t_mean, _get(prev, "candidate", "decode_tok_s_mean"))) if prev else "n/a",
        f"{_acc(cand, 'raw_correct')} / {_acc(ctrl, 'raw_correct')}",
        f"{_acc(cand, 'strict_correct')} / {_acc(ctrl, 'strict_correct')}",
        _health(cand),
    ]
    return _row(cells)


def _row(cells: list[Any]) -> str:
    """A table row: every cell data (md_cell) but the renderer's own markup (Md)."""
    return "| " + " | ".join(c.replace("|", "\\|") if isinstance(c, Md) else md_cell(c) for c in cells) + " |"


def _contracts_line(entries: list[dict[str, Any]]) -> str:
    last = entries[-1]
    parts = []
    for kind in ("speed", "quality"):
        name = _get(last, "candidate", f"{kind}_contract") or _get(last, "control", f"{kind}_contract")
        sha = _get(last, "candidate", f"{kind}_contract_sha256") or _get(
            last, "control", f"{kind}_contract_sha256"
        )
        if name:
            parts.append(f"{kind} {md_code(name)} (sha256 {md_code(str(sha)[:12])})")
    return ", ".join(parts) or "none recorded"


def render_markdown(rows: list[dict[str, Any]], store: str, png_name: str | None) -> str:
    """The trend report: summary, events (the night each change came in), one line per night."""
    entries = nights(rows)
    lines = ["# qgate nightly history", ""]
    if not entries:
        return "\n".join([*lines, f"Store {md_code(store)} holds no nights yet.", ""])
    last = entries[-1]
    lines += [
        f"Store {md_code(store)}: {len(entries)} nights ({md(entries[0]['night'])} to {md(last['night'])}), "
        f"{len(rows)} rows.",
        f"Latest contracts: {_contracts_line(entries)}.",
        f"Latest night {md(last['night'])} (commit {md_code(_short(last['commit']))}): "
        f"verdict **{md(last['verdict'] or 'none')}**.",
        "",
    ]
    if png_name:
        lines += [f"![decode tok/s and quality per night]({png_name})", ""]
    lines += ["## Events", ""]
    evs = events(entries)
    if evs:
        lines += ["| night | commit | event |", "|---|---|---|"]
        lines += [_row([e["night"], md_code(e["commit"]), e["event"]]) for e in evs]
    else:
        lines.append("No change of verdict, gate, contract or environment over these nights.")
    lines += ["", "## Nights", ""]
    lines.append(
        "| night | commit | verdict | control tok/s | candidate tok/s | candidate slowest rep | gate | "
        "candidate vs control | candidate vs previous night | raw correct (cand / ctrl) | "
        "strict correct (cand / ctrl) | candidate health |"
    )
    lines.append("|" + "---|" * 12)
    lines += [_night_line(e, entries[i - 1] if i else None) for i, e in enumerate(entries)]
    lines += _reason_lines(entries)
    lines += _rate_lines(entries)
    lines += [
        "",
        "tok/s: mean pure-decode rate over the night's reps; gate: `speed.gates.min_decode_tok_s` (every "
        "candidate rep must reach it). Correct counts are over the contract's selected items (an unscored "
        "item is a miss). Health: natural stops, closed thinking, length caps, invalid outputs, U+FFFD "
        "characters, longest same-token run, top repeated-window count (candidate).",
        "",
    ]
    return "\n".join(lines)


def _rates_below(row: dict[str, Any] | None) -> str:
    """The items whose correct rate is below every seed, as `index k/R`; "all R/R" when none."""
    if not row or not row.get("quality_item_rates"):
        return "n/a"
    rates = json.loads(row["quality_item_rates"])
    below = [f"{i} {k}/{n}" for i, (k, n) in sorted(rates.items(), key=lambda x: int(x[0])) if k < n]
    return ", ".join(below) if below else f"all {row.get('quality_seeds')}/{row.get('quality_seeds')}"


def _rate_lines(entries: list[dict[str, Any]]) -> list[str]:
    """Per-item correct rates (raw and strict right) of the nights whose quality run repeated seeds."""
    arms = ("control", "candidate")
    seeded = [e for e in entries if any(_get(e, arm, "quality_item_rates") for arm in arms)]
    if not seeded:
        return []
    out = [
        "",
        "## Per-item correct rates (nights with repeated seeds)",
        "",
        "Items answered (raw and strict right) under fewer than all seeds; every other item was "
        "answered under every seed.",
        "",
        "| night | commit | seeds | control | candidate |",
        "|---|---|---|---|---|",
    ]
    for e in seeded:
        seeds = _get(e, "candidate", "quality_seeds") or _get(e, "control", "quality_seeds")
        cells = [e["night"], md_code(_short(e["commit"])), str(seeds), _rates_below(e.get("control")),
                 _rates_below(e.get("candidate"))]  # fmt: skip
        out.append(_row(cells))
    return out


def _reason_lines(entries: list[dict[str, Any]]) -> list[str]:
    bad = [e for e in entries if e["verdict"] in ("FAIL", "ERROR")]
    if not bad:
        return []
    out = ["", "## Why the failing nights failed", ""]
    for e in bad:
        out.append(f"- {md(e['night'])} ({md_code(_short(e['commit']))}) **{md(e['verdict'])}**")
        for kind, v in sorted(e["verdicts"].items()):
            for reason in v.get("reasons") or []:
                out.append(
                    f"  - {md(kind)} ({md(v['verdict'])}): {md(str(reason).removeprefix(kind + ': '))}"
                )
    return out


# ---------------------------------------------------------------- PNG


def series(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The values the PNG draws, per night (None where a night has no such figure)."""
    entries = nights(rows)

    def col(arm: str, key: str) -> list[Any]:
        return [_get(e, arm, key) for e in entries]

    def acc(arm: str, key: str) -> list[float | None]:
        return [None if v is None else 100.0 * v for v in col(arm, key)]

    def gate_pct(key: str) -> list[float | None]:
        out = []
        for e in entries:
            gate, n = _get(e, "candidate", key), _get(e, "candidate", "quality_selected")
            out.append(100.0 * gate / n if gate is not None and n else None)
        return out

    return {
        "nights": [e["night"] for e in entries],
        "commits": [_short(e["commit"]) for e in entries],
        "verdicts": [e["verdict"] for e in entries],
        "control_mean": col("control", "decode_tok_s_mean"),
        "candidate_mean": col("candidate", "decode_tok_s_mean"),
        "candidate_reps": [json.loads(v) if v else [] for v in col("candidate", "decode_tok_s_reps")],
        "gate": col("candidate", "gate_min_decode_tok_s"),
        "raw_pct": {arm: acc(arm, "raw_accuracy") for arm in ("control", "candidate")},
        "strict_pct": {arm: acc(arm, "strict_accuracy") for arm in ("control", "candidate")},
        "raw_gate_pct": gate_pct("gate_min_raw_correct"),
        "strict_gate_pct": gate_pct("gate_min_strict_correct"),
        "regressions": regression_nights(entries),
    }


def _line(ax: Any, ys: list[Any], **kw: Any) -> None:
    pts = [(i, y) for i, y in enumerate(ys) if y is not None]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **kw)


def _mark_nights(axes: list[Any], s: dict[str, Any]) -> None:
    for i, v in enumerate(s["verdicts"]):
        if v in ("FAIL", "ERROR"):
            for ax in axes:
                ax.axvspan(i - 0.5, i + 0.5, color=_COLORS["gate"], alpha=0.12, linewidth=0)
    n = len(s["nights"])
    for k, night in enumerate(s["regressions"]):
        i = s["nights"].index(night)
        for ax in axes:
            ax.axvline(i, color=_COLORS["gate"], linewidth=1.2)
        # Labels point inwards (right half: text to the left) and nearby ones are staggered downwards.
        right = i >= n / 2 and n > 1
        label = axes[0].annotate(
            f"regression: {night} ({s['commits'][i]})",
            (i, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-3 if right else 3, -12 - 11 * (k % 3)),
            textcoords="offset points",
            ha="right" if right else "left",
            color=_COLORS["gate"],
            fontsize="small",
        )
        label.set_in_layout(False)


def _decode_axes(ax: Any, s: dict[str, Any]) -> None:
    for i, reps in enumerate(s["candidate_reps"]):
        ys = [v for v in reps if v is not None]
        ax.plot([i] * len(ys), ys, ".", color=_COLORS["candidate"], alpha=0.35, markersize=4)
    _line(ax, s["control_mean"], marker="o", color=_COLORS["control"], label="control mean")
    _line(
        ax, s["candidate_mean"], marker="o", color=_COLORS["candidate"], label="candidate mean (dots: reps)"
    )
    gates = [g for g in s["gate"] if g is not None]
    label = f"floor: candidate mean >= {gates[-1]:g}" if gates else "gate"
    _line(ax, s["gate"], drawstyle="steps-mid", linestyle="--", color=_COLORS["gate"], label=label)
    ax.set_ylabel("decode tok/s")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")


def _quality_axes(ax: Any, s: dict[str, Any]) -> None:
    have = any(v is not None for arm in s["raw_pct"].values() for v in arm)
    if not have:
        ax.text(0.5, 0.5, "no quality results", transform=ax.transAxes, ha="center", va="center")
    _line(ax, s["raw_pct"]["candidate"], marker="o", color=_COLORS["candidate"], label="candidate raw")
    _line(ax, s["strict_pct"]["candidate"], marker="s", linestyle=":", color=_COLORS["candidate"],
          label="candidate strict")  # fmt: skip
    _line(ax, s["raw_pct"]["control"], marker="o", color=_COLORS["control"], alpha=0.6, label="control raw")
    _line(
        ax, s["raw_gate_pct"], drawstyle="steps-mid", linestyle="--", color=_COLORS["gate"], label="raw gate"
    )
    _line(ax, s["strict_gate_pct"], drawstyle="steps-mid", linestyle="--", color=_COLORS["strict"],
          label="strict gate")  # fmt: skip
    ax.set_ylabel("GSM8K accuracy %")
    ax.set_ylim(-5, 105)
    ax.grid(True, alpha=0.3)
    if have:
        ax.legend(loc="best", fontsize="small")


def render_png(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Two panels over the nights: decode tok/s with the gate, GSM8K accuracy with the gates."""
    s = series(rows)
    n = len(s["nights"])
    fig = Figure(figsize=(max(7.0, min(0.45 * n + 3, 24.0)), 7.0), dpi=110)
    FigureCanvasAgg(fig)
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    _decode_axes(top, s)
    _quality_axes(bottom, s)
    _mark_nights([top, bottom], s)
    step = max(1, n // 20)  # at most ~20 date labels, so a long history stays readable
    for ax in (top, bottom):
        ax.set_xlim(-0.6, max(n - 0.4, 0.6))
        ax.set_xticks(range(0, n, step))
    top.set_xticklabels([])
    bottom.set_xticklabels(s["nights"][::step], rotation=45, ha="right", fontsize="small")
    top.set_title("qgate nightly: decode tok/s and quality (shaded: FAIL/ERROR nights)")
    fig.tight_layout()
    fig.savefig(str(path), format="png")
