"""The published history (`qgate history publish`): a static site of HTML pages with inline SVG plots,
from qgate.history_view's series. No script, no font, no file outside the page: it opens from the file
system, and a Content-Security-Policy of default-src 'none' keeps a page from fetching anything.

index.html: every contract x runner with its last verdict, decode ratio and 95 % interval, quality, how
many nights, the nights without a record, the last change of verdict and the flags (FAIL / ERROR nights,
runner drift). <slug>.html per series: the decode ratio over the nights with its band, the gate's margin
and the verdict markers, the control's and candidate's decode tok/s (drift flagged), quality per night,
and the night table (commit, contract sha256s, run folder, reasons, events): each marker links to its
night's line. Every string from a record is escaped (svg.esc). Rendering only: decisions are made in
qgate.history_view and qgate.trend.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from qgate.history_view import BAND_LEVEL, Night, Series
from qgate.report.svg import MARKERS, Plot, esc, nice_ticks
from qgate.trend import DRIFT_PCT

GENERATOR = "qgate history publish"  # marks the site's pages: a new publish replaces only those
_BOLD = re.compile(r"\*\*(.+?)\*\*")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'"
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#212121}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}p.meta{color:#555;margin:2px 0}
table{border-collapse:collapse;font-size:13px;margin-top:8px}
th,td{border:1px solid #ddd;padding:4px 7px;text-align:left;vertical-align:top}th{background:#f4f4f4}
tr.flag-fail td,tr.flag-error td{background:#fdecea}tr:target td{outline:2px solid #1565c0}
.v{font-weight:bold;padding:1px 6px;border-radius:3px;color:#fff;white-space:nowrap}
.v-PASS{background:#2e7d32}.v-FAIL{background:#c62828}.v-INCONCLUSIVE{background:#ef8f00}
.v-ERROR{background:#212121}.v-none{background:#9e9e9e}
.flag{font-weight:bold;color:#c62828}.drift{font-weight:bold;color:#6a1b9a}code{font-size:12px}
.site-note{background:#fff8e1;border:1px solid #ffcc80;padding:6px 10px;max-width:1100px}
.note{color:#555;font-size:12px;max-width:900px}svg{display:block;margin:8px 0;max-width:100%;height:auto}
"""


def _page(title: str, body: list[str], note: str | None = None) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta name="generator" content="{GENERATOR}">',
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
            *([f'<p class="site-note">{esc(note)}</p>'] if note else []),
            *body,
            "</body></html>",
            "",
        ]
    )


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def badge(verdict: str | None) -> str:
    v = verdict if verdict in MARKERS else "none"
    return f'<span class="v v-{v}">{esc(verdict or "none")}</span>'


def ratio_text(n: Night) -> str:
    if n.ratio is None:
        return f"n/a ({esc(n.band_basis)})"
    if n.ci_low is None:
        return f"{n.ratio:.3f} ({esc(n.band_basis)})"
    return f"{n.ratio:.3f} [{n.ci_low:.3f}, {n.ci_high:.3f}] <small>({esc(n.band_basis)})</small>"


def quality_text(n: Night) -> str:
    q = n.quality
    if q["selected"] is None:
        return "n/a"
    gate = f" (gate {q['gate_raw']})" if q["gate_raw"] is not None else ""
    verdict = n.kind_verdicts.get("quality")
    return (
        f"raw {q['candidate_raw']}/{q['selected']}{esc(gate)}, "
        f"strict {q['candidate_strict']}/{q['selected']}; "
        f"control raw {q['control_raw']}/{q['selected']}" + (f" {badge(verdict)}" if verdict else "")
    )


def runner_label(runner: dict[str, Any]) -> str:
    device = runner.get("gpu") or f"{runner.get('cpu') or 'CPU ?'} x{runner.get('cpu_count') or '?'}"
    host, torch, vllm = (runner.get(k) for k in ("hostname", "torch", "vllm"))
    return f"{host or '?'} · {device} · torch {torch} · vLLM {vllm}"


def _day(series: Series, night: str) -> int:
    return (date.fromisoformat(night) - date.fromisoformat(series.nights[0].night)).days


def _ticks(series: Series, n_days: int) -> list[tuple[int, str]]:
    step = max(1, n_days // 10)
    first = date.fromisoformat(series.nights[0].night)
    return [(d, (first.fromordinal(first.toordinal() + d)).isoformat()[5:]) for d in range(0, n_days, step)]


def tip(series: Series, n: Night, what: str) -> str:
    """What a marker's tooltip says: the figure and the record it comes from."""
    return (
        f"{n.night} {n.verdict or 'no verdict'}: {what}; commit {n.commit}; speed contract sha256 "
        f"{n.speed_contract_sha256 or 'n/a'}; runner {series.runner_id}"
    )


def _flag_stripes(plot: Plot, series: Series, kinds: tuple[str, ...]) -> None:
    """Flagged nights (FAIL / ERROR, or drift) as stripes, and the days without a record as grey ones."""
    for night in series.missing:
        plot.stripe(_day(series, night), "missing", "#9e9e9e", "no record", f"{night}: no night recorded")
    colors = {"FAIL": "#c62828", "ERROR": "#212121", "drift": "#6a1b9a"}
    for n in series.nights:
        for flag in n.flags:
            if flag in kinds:
                label = flag if flag != "drift" else f"drift {n.control_change_pct:+.1f}%"
                plot.stripe(
                    _day(series, n.night),
                    f"flag-{flag.lower()}",
                    colors[flag],
                    label,
                    f"{n.night}: {label} (commit {n.commit})",
                )


def ratio_plot(series: Series) -> str:
    n_days = _day(series, series.last.night) + 1
    values = [v for n in series.nights for v in (n.ratio, n.ci_low, n.ci_high) if v is not None]
    floors = [1 - n.margin_pct / 100 for n in series.nights if n.margin_pct is not None]
    lo, hi = min([*values, *floors, 1.0]), max([*values, 1.0])
    plot = Plot(
        n_days, (lo, hi), f"decode ratio (candidate / control) with its {BAND_LEVEL:.0%} interval", "ratio"
    )
    _flag_stripes(plot, series, ("FAIL", "ERROR"))
    strong = [
        (
            _day(series, n.night),
            (n.ci_low, n.ci_high)
            if n.ci_low is not None and n.ci_high is not None and n.band_basis != "reps only"
            else None,
        )
        for n in series.nights
    ]
    weak = [
        (
            _day(series, n.night),
            (n.ci_low, n.ci_high)
            if n.ci_low is not None and n.ci_high is not None and n.band_basis == "reps only"
            else None,
        )
        for n in series.nights
    ]
    plot.band(strong, "band", "#1565c0")
    plot.band(weak, "band band-reps-only", "#90a4ae")
    plot.hline(1.0, "parity", "#757575", "1.0", "2,3")
    margin = [
        (_day(series, n.night), 1 - n.margin_pct / 100 if n.margin_pct is not None else None)
        for n in series.nights
    ]
    plot.steps(margin, "margin", "#c62828", "6,3")
    plot.line([(_day(series, n.night), n.ratio) for n in series.nights], "ratio", "#1565c0")
    plot.legend([("decode ratio", "#1565c0", ""), ("1 - margin", "#c62828", "6,3")])
    for n in series.nights:
        if n.ratio is not None:
            what = f"decode ratio {ratio_text(n)}".replace("<small>", "").replace("</small>", "")
            plot.marker(_day(series, n.night), n.ratio, n.verdict, f"#n-{n.night}", tip(series, n, what))
    plot.axes(_ticks(series, n_days), nice_ticks(plot.lo, plot.hi))
    return plot.svg("decode ratio per night with its interval, the margin and the verdicts")


def tok_s_plot(series: Series) -> str:
    n_days = _day(series, series.last.night) + 1
    values = [v for n in series.nights for v in (n.control_tok_s, n.candidate_tok_s) if v is not None]
    plot = Plot(
        n_days,
        (min(values, default=0.0), max(values, default=1.0)),
        "decode tok/s: the control (the runner's drift) and the candidate",
        "tok/s",
    )
    _flag_stripes(plot, series, ("drift",))
    plot.line([(_day(series, n.night), n.control_tok_s) for n in series.nights], "control", "#4c72b0")
    plot.line(
        [(_day(series, n.night), n.candidate_tok_s) for n in series.nights], "candidate", "#dd8452", "5,3"
    )
    plot.legend([("control mean", "#4c72b0", ""), ("candidate mean", "#dd8452", "5,3")])
    for n in series.nights:
        if n.control_tok_s is not None:
            change = (
                ""
                if n.control_change_pct is None
                else f" ({n.control_change_pct:+.1f} % vs the night before)"
            )
            plot.marker(
                _day(series, n.night),
                n.control_tok_s,
                n.verdict,
                f"#n-{n.night}",
                tip(series, n, f"control {n.control_tok_s:.2f} tok/s{change}"),
            )
    if not values:
        plot.text("no speed results")
    plot.axes(_ticks(series, n_days), nice_ticks(plot.lo, plot.hi))
    return plot.svg("decode tok/s of the control and the candidate per night")


def quality_plot(series: Series) -> str:
    n_days = _day(series, series.last.night) + 1
    plot = Plot(n_days, (0.0, 100.0), "quality: GSM8K correct % of the selected items", "% correct")

    def pct(n: Night, key: str) -> float | None:
        q = n.quality
        return None if q["selected"] in (None, 0) or q[key] is None else 100.0 * q[key] / q["selected"]

    have = any(n.quality["selected"] for n in series.nights)
    _flag_stripes(plot, series, ("FAIL", "ERROR"))
    plot.steps(
        [(_day(series, n.night), pct(n, "gate_raw")) for n in series.nights], "gate-raw", "#c62828", "6,3"
    )
    plot.line([(_day(series, n.night), pct(n, "control_raw")) for n in series.nights], "control", "#4c72b0")
    plot.line(
        [(_day(series, n.night), pct(n, "candidate_strict")) for n in series.nights],
        "strict",
        "#8172b3",
        "2,2",
    )
    plot.line(
        [(_day(series, n.night), pct(n, "candidate_raw")) for n in series.nights], "candidate", "#dd8452"
    )
    plot.legend(
        [
            ("candidate raw", "#dd8452", ""),
            ("candidate strict", "#8172b3", "2,2"),
            ("control raw", "#4c72b0", ""),
            ("raw gate", "#c62828", "6,3"),
        ]
    )
    for n in series.nights:
        value = pct(n, "candidate_raw")
        if value is not None:
            verdict = n.kind_verdicts.get("quality")
            what = f"quality {verdict}: candidate raw {n.quality['candidate_raw']}/{n.quality['selected']}"
            plot.marker(_day(series, n.night), value, verdict, f"#n-{n.night}", tip(series, n, what))
    if not have:
        plot.text("no quality results")
    plot.axes(_ticks(series, n_days), [0, 25, 50, 75, 100])
    return plot.svg("quality per night")


# ---------------------------------------------------------------- pages


def _night_row(n: Night) -> str:
    cls = " ".join(f"flag-{f.lower()}" for f in n.flags)
    kinds = " ".join(f"{esc(k)} {badge(v)}" for k, v in sorted(n.kind_verdicts.items()))
    change = "" if n.control_change_pct is None else f" ({n.control_change_pct:+.1f} %)"
    drift = ' <span class="drift">drift</span>' if n.drift else ""
    margin = "n/a" if n.margin_pct is None else f"{n.margin_pct:g} % (floor {1 - n.margin_pct / 100:.3f})"
    shas = (
        f'speed <code title="{esc(n.speed_contract_sha256)}">{esc(str(n.speed_contract_sha256)[:12])}</code>'
    )
    if n.quality_contract_sha256:
        sha = n.quality_contract_sha256
        shas += f'<br>quality <code title="{esc(sha)}">{esc(sha[:12])}</code>'
    # qgate.trend's events mark the night a regression came in as **bold** (markdown): bold here too.
    notes = ["<li>" + _BOLD.sub(r"<strong>\1</strong>", esc(x)) + "</li>" for x in (*n.events, *n.reasons)]
    cells = [
        f'<a href="#n-{esc(n.night)}">{esc(n.night)}</a>',
        f'<code title="{esc(n.commit)}">{esc(n.commit[:12])}</code>',
        badge(n.verdict),
        kinds,
        ratio_text(n),
        margin,
        f"{_f(n.control_tok_s, '.2f')}{esc(change)}{drift}",
        f"{_f(n.candidate_tok_s, '.2f')} (slowest {_f(n.candidate_min_tok_s, '.2f')})",
        quality_text(n),
        shas,
        f"<code>{esc(n.source or 'n/a')}</code>",
        f"<ul>{''.join(notes)}</ul>" if notes else "",
    ]
    return (
        f'<tr id="n-{esc(n.night)}" class="night {cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
    )


def _runner_table(series: Series) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in series.runner.items())
    key = f"<tr><th>runner key</th><td><code>{esc(series.runner_id)}</code></td></tr>"
    return f'<table class="runner">{key}{rows}</table>'


def series_page(series: Series, stores: list[str], generated: str, note: str | None = None) -> str:
    flagged = [n for n in series.nights if n.flags]
    body = [
        '<p><a href="index.html" id="back">&larr; all contracts and runners</a></p>',
        f"<h1>{esc(series.contract)}</h1>",
        f'<p class="meta">runner {esc(runner_label(series.runner))}'
        + (f" · fleet entry <code>{esc(series.entry)}</code>" if series.entry else "")
        + f" · {len(series.nights)} nights, {esc(series.nights[0].night)} to {esc(series.last.night)}</p>",
        f'<p class="meta">last verdict {badge(series.last.verdict)} on {esc(series.last.night)}</p>',
    ]
    if flagged:
        links = ", ".join(
            f'<a href="#n-{esc(n.night)}">{esc(n.night)}</a> ({esc(" + ".join(n.flags))})' for n in flagged
        )
        body.append(f'<p class="flagged"><span class="flag">Flagged nights:</span> {links}</p>')
    if series.missing:
        body.append(
            f'<p class="missing">No record (a lost night or no run) on {len(series.missing)} '
            f"day(s): {esc(', '.join(series.missing))}</p>"
        )
    body += [
        ratio_plot(series),
        f'<p class="note">Band: the {BAND_LEVEL:.0%} Welch-t interval of the decode ratio recomputed from '
        "the night's stored reps (qgate.stats): over its engine starts (launches), or for a one-launch night "
        "with the between-launch bound of the history's earlier nights (history), as "
        "<code>compare --history</code> adds it; grey where neither was there (reps only: it knows "
        "nothing of the engine starts). Red "
        "dashes: the gate's floor, 1 - margin (the contract's max_decode_regression_pct, shown when its "
        "sha256 was among <code>--contracts</code>). Markers: the night's verdict (circle PASS, triangle "
        "FAIL, square INCONCLUSIVE, diamond ERROR); each links to its night below.</p>",
        tok_s_plot(series),
        f'<p class="note">A change of the control\'s mean decode rate of {DRIFT_PCT:g} % or more from the '
        "night before is flagged as a drift of the runner: the same code measured differently.</p>",
        quality_plot(series),
        "<h2>Runner</h2>",
        _runner_table(series),
        "<h2>Nights</h2>",
        '<table class="nights"><tr><th>night</th><th>commit</th><th>verdict</th><th>by kind</th>'
        f"<th>decode ratio [{BAND_LEVEL:.0%} interval] (basis)</th><th>margin</th><th>control tok/s "
        "(vs night before)</th><th>candidate tok/s</th><th>quality</th><th>contract sha256</th>"
        "<th>run folder</th><th>events and reasons</th></tr>",
        *[_night_row(n) for n in reversed(series.nights)],
        "</table>",
        f'<p class="meta">From {esc(", ".join(stores))}; published {esc(generated)}.</p>',
    ]
    return _page(f"qgate history: {series.contract}", body, note)


def _index_row(series: Series) -> str:
    last = series.last
    change = series.last_change()
    fails = sum(1 for n in series.nights if n.verdict in ("FAIL", "ERROR"))
    drifts = sum(1 for n in series.nights if n.drift)
    flags = []
    if fails:
        flags.append(f'<span class="flag">{fails} FAIL/ERROR</span>')
    if drifts:
        flags.append(f'<span class="drift">{drifts} drift</span>')
    cells = [
        f'<a href="{esc(series.slug)}.html">{esc(series.contract)}</a>',
        esc(series.entry or ""),
        f"{esc(runner_label(series.runner))}<br><code>{esc(series.runner_id)}</code>",
        f'{badge(last.verdict)} <a href="{esc(series.slug)}.html#n-{esc(last.night)}">{esc(last.night)}</a>',
        ratio_text(last),
        quality_text(last),
        str(len(series.nights)),
        str(len(series.missing)),
        "none" if change is None else f"{esc(change[0])}: {badge(change[1])} &rarr; {badge(change[2])}",
        " ".join(flags) or "none",
    ]
    cls = f"series flag-{last.verdict.lower()}" if last.verdict in ("FAIL", "ERROR") else "series"
    return f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def index_page(series: list[Series], stores: list[str], generated: str, note: str | None = None) -> str:
    body = [
        "<h1>qgate nightly history</h1>",
        f'<p class="meta">{len(series)} contract x runner series from {esc(", ".join(stores))}; '
        f"published {esc(generated)}.</p>",
    ]
    if not series:
        body.append("<p>The history holds no nights yet.</p>")
    else:
        body += [
            '<table class="index"><tr><th>contract</th><th>fleet entry</th><th>runner</th>'
            f"<th>last verdict</th><th>decode ratio [{BAND_LEVEL:.0%} interval] (basis)</th><th>quality</th>"
            "<th>nights</th><th>no record</th><th>last change of verdict</th><th>flags</th></tr>",
            *[_index_row(s) for s in series],
            "</table>",
            '<p class="note">A series is one contract (the speed and quality contracts\' names) on one '
            "runner "
            "(host, CPU or GPU, driver, torch, vLLM): a runner change starts a new one. Each page draws the "
            "decode ratio with its interval and the gate's margin, the control's tok/s and quality per "
            "night, every figure with its commit, contract sha256 and runner key.</p>",
        ]
    return _page("qgate nightly history", body, note)


def render_site(
    series: list[Series], stores: list[str], generated: str, note: str | None = None
) -> dict[str, str]:
    """{file name: HTML} of the whole site: index.html and one page per series; `note`, a line the
    publisher gives (what the history is), on top of every page."""
    pages = {"index.html": index_page(series, stores, generated, note)}
    for s in series:
        pages[f"{s.slug}.html"] = series_page(s, stores, generated, note)
    return pages
