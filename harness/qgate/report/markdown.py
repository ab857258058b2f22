"""The markdown report, rendered from a verdict record alone (so it can be rebuilt from verdict.json).

Tables are pandas DataFrames of preformatted strings, written as GitHub pipe tables by `table`
(report/tables.py; no tabulate dependency). The output is deterministic: no timestamps, fixed number
formats; it is golden-tested in tests/test_report_golden.py.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from qgate.report.escape import md, md_code
from qgate.report.quality import render_quality
from qgate.report.tables import table
from qgate.report.timeline import timeline_lines

_MARK = {True: "pass", False: "FAIL"}
_ON_FAILURE = {"error": "ERROR", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}


def _num(value: Any, fmt: str = ".2f") -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return format(value, fmt)


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:+.2f} %"


def _route_label(arm: dict[str, Any]) -> str:
    routes = arm.get("switched_routes") or []
    return ", ".join(routes) if routes else "none switched on"


def _throughput(record: dict[str, Any]) -> list[str]:
    figs, arms = record["figures"], record["speed"]["arms"]
    rows = []
    for name in ("control", "candidate"):
        f = figs[name]
        rows.append(
            {
                "arm": name,
                "route": _route_label(arms[name]),
                "steady samples (tok/s)": ", ".join(_num(v) for v in f["decode_tok_s"]),
                "mean (tok/s)": _num(f["decode_tok_s_mean"]),
                "mean TPOT (ms)": _num(f["tpot_ms_mean"], ".3f"),
                "sample sd (tok/s)": _num(f["decode_tok_s_std"], ".3f"),
                "CV": f"{_num(f['decode_tok_s_cv_pct'])} %",
            }
        )
    return [
        "### Decode throughput",
        "",
        table(pd.DataFrame(rows)),
        "",
        f"Throughput change: {_pct(figs['throughput_change_pct'])}; "
        f"TPOT change: {_pct(figs['tpot_change_pct'])}.{_compatible(record['stats'].get('decode_tok_s'))}",
        "",
    ]


def _compatible(st: dict[str, Any] | None) -> str:
    """What the data cannot rule out: the Welch-t CI of the ratio as a range of changes."""
    if not st or st.get("t_ci_low") is None or st.get("t_ci_high") is None or not st.get("ci_level"):
        return ""
    low, high = 100 * (st["t_ci_low"] - 1), 100 * (st["t_ci_high"] - 1)
    level = _num(100 * st["ci_level"], "g")
    return (
        f" The data are compatible with a decode change from {low:+.2f} % to {high:+.2f} % "
        f"({level} % Welch-t CI)."
    )


def _margin(record: dict[str, Any]) -> list[str]:
    """The non-inferiority bound against the margin, the sample-size estimate and the variance components."""
    figs = record["figures"]
    ni = figs.get("non_inferiority")
    if not ni:
        return []
    alpha = ni.get("one_sided_alpha")
    lines = [
        "### Non-inferiority and noise",
        "",
        f"- Margin: a decode slowdown beyond {_num(ni['margin_pct'], 'g')} % (ratio floor "
        f"{_num(ni['floor'], '.4f')}) must be ruled out.",
        f"- Welch-t lower bound of the ratio (one-sided alpha {_num(alpha, 'g')}): "
        f"{_num(ni['bound'], '.4f')}; upper bound {_num(ni['upper'], '.4f')}: "
        f"{md(_NI_OUTCOME.get(ni['outcome'], ni['outcome']))}.",
    ]
    if ni.get("sample_size"):
        lines.append(f"- Sample size: {md(ni['sample_size'])}.")
    rows = []
    for arm, comp in (figs.get("variance_components") or {}).items():
        if not comp:
            continue
        rows.append(
            {
                "arm": arm,
                "launches x reps": f"{comp['launches']} x {comp['reps_per_launch']}",
                "unit": comp["unit"],
                "between-launch CV": _pct_or_na(comp["cv_between_pct"]),
                "within-launch CV": _pct_or_na(comp["cv_within_pct"]),
                "CV of one unit": _pct_or_na(comp["unit_cv_pct"]),
                "df of the mean": _num(comp["df"], "g"),
            }
        )
    if rows:
        lines += [
            "",
            table(pd.DataFrame(rows)),
            "",
            "Variance components of decode tok/s (one-way random effects over the launches; n/a with one "
            "launch, or one rep per launch).",
        ]
    return [*lines, ""]


def _sequential(record: dict[str, Any]) -> list[str]:
    """The looks of `qgate run speed --until-decided` (qgate.speed.sequential) and why it stopped."""
    after = "This report's verdict is the fixed-design comparison of the data the sequence stopped with."
    return sequential_lines(record["figures"].get("sequential"), after)


def sequential_lines(seq: dict[str, Any] | None, after: str) -> list[str]:
    """A sequential record's design, looks and stop (qgate.speed.sequential.record), then `after`."""
    if not seq:
        return []
    d = seq["design"]
    rows = [
        {
            "look": x["look"],
            "launches per arm": x["launches"],
            "ratio": _num(x["ratio"], ".4f"),
            "bounds": f"[{_num(x['lower'], '.4f')}, {_num(x['upper'], '.4f')}]",
            "critical t": _num(x["critical_t"], ".3f"),
            "df": _num(x["df"], ".1f"),
            "decision": x["decision"],
        }
        for x in seq["looks"]
    ]
    stop = md(seq.get("decision") or "not finished")
    lines = [
        "### Sequential looks (--until-decided)",
        "",
        f"Design: {md(d['spending'])}, alpha {_num(d['alpha'], 'g')}; looks at "
        f"{', '.join(str(n) for n in d['planned_launches'])} launches per arm (z boundaries "
        f"{', '.join(_num(z, '.3f') for z in d['z_boundaries'])}).",
        "",
        table(pd.DataFrame(rows)),
        "",
        f"Stopped: {stop} after {md(seq.get('stopped_at_launches'))} launches per arm: "
        f"{md(seq.get('reason'))}. " + after,
        "",
    ]
    return lines


def _pct_or_na(value: Any) -> str:
    return "n/a" if value is None else f"{_num(value)} %"


_NI_OUTCOME = {
    "shown": "non-inferiority shown",
    "inferior": "the whole interval lies below the floor (a slowdown beyond the margin)",
    "undecided": "not shown, nor a slowdown beyond the margin",
    "error": "could not be computed",
}


def _statistics(record: dict[str, Any]) -> list[str]:
    rows, reasons = [], []
    for name, st in record["stats"].items():
        c, t = st.get("control") or {}, st.get("candidate") or {}
        level = st.get("ci_level")
        rows.append(
            {
                "metric": name,
                "unit": st["unit"],
                "n (control v candidate)": f"{c.get('n', 0)} v {t.get('n', 0)}",
                "verdict": st["verdict"],
                "change of means": _pct(st.get("change_pct")),
                "ratio cand/ctrl": _num(st.get("ratio"), ".4f"),
                f"{_num(100 * level, 'g') if level else '?'} % bootstrap CI": (
                    f"[{_num(st.get('ci_low'), '.4f')}, {_num(st.get('ci_high'), '.4f')}]"
                ),
                "Welch-t CI": f"[{_num(st.get('t_ci_low'), '.4f')}, {_num(st.get('t_ci_high'), '.4f')}]",
                "Welch t": _num(st.get("welch_t"), ".3f"),
                "df": _num(st.get("df"), ".1f"),
                "Welch p": _num(st.get("welch_p"), ".3g"),
                "Mann-Whitney U": _num(st.get("mwu_u"), "g"),
                "Mann-Whitney p": f"{_num(st.get('mwu_p'), '.3g')} ({st.get('mwu_method') or 'n/a'})",
            }
        )
        reasons.append(f"- {md(name)}: {md(st['verdict'])}: {md(st['reason'])}")
    any_st = next(iter(record["stats"].values()))
    settings = (
        f"alpha {_num(any_st.get('alpha'), 'g')}, "
        f"practical floor {_num(any_st.get('min_effect_pct'), 'g')} %, "
        f"noise limit CV {_num(any_st.get('max_cv_pct'), 'g')} %, "
        f"{md(any_st.get('bootstrap_resamples'))} bootstrap resamples, seed {md(any_st.get('seed'))}"
    )
    return ["### Statistics", "", table(pd.DataFrame(rows)), "", *reasons, "", f"Settings: {settings}.", ""]


def _prefill(record: dict[str, Any]) -> list[str]:
    figs = record["figures"]
    rows = [
        {
            "arm": name,
            "median TTFT (ms)": _num(figs[name]["ttft_ms_median"], ".3f"),
            "samples (ms)": ", ".join(_num(v, ".3f") for v in figs[name]["ttft_ms"]),
        }
        for name in ("control", "candidate")
    ]
    change = f"Median TTFT change: {_pct(figs['ttft_median_change_pct'])}."
    return ["### Warm prefill (TTFT)", "", table(pd.DataFrame(rows)), "", change, ""]


def _tokens(record: dict[str, Any]) -> list[str]:
    tk = record["speed"]["tokens"]
    yes = {True: "yes", False: "no", None: "n/a (no prompt came twice)"}
    if tk["control_vs_candidate_identical"]:
        versus = f"identical in all {md(tk.get('reps_compared', 'n/a'))} reps"
    else:
        where = f"rep {md(tk['first_diverging_rep'])}, " if tk.get("first_diverging_rep") is not None else ""
        diverging = tk.get("diverging_reps")
        count = (
            f"{len(diverging)} of {md(tk.get('reps_compared'))} reps " if isinstance(diverging, list) else ""
        )
        versus = f"{count}differ; first diverging at {where}index {md(tk['first_diverging_index'])}"
    return [
        "### Tokens",
        "",
        f"- Candidate reps of one prompt gave one token array: {yes[tk['candidate_identical_across_reps']]}",
        f"- Control reps of one prompt gave one token array: {yes[tk['control_identical_across_reps']]}",
        f"- Control vs candidate, rep by rep on the same prompt ({md(tk['control_tokens'])} v "
        f"{md(tk['candidate_tokens'])} tokens): {versus}",
        "",
    ]


def counts_text(counts: dict[str, int], empty: str = "none") -> str:
    """`{"qkv_proj": 3, "o_proj": 1}` -> "o_proj: 1, qkv_proj: 3" (sorted), `empty` when there is none."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or empty


def _fallbacks(entry: dict[str, Any]) -> str:
    fb = entry.get("fallbacks") or {}
    total = sum(int(v) for v in fb.values())
    return f"{total} ({counts_text(fb)})" if fb else "0"


def _routes(record: dict[str, Any]) -> list[str]:
    arms = record["speed"]["arms"]
    croutes, troutes = arms["control"].get("routes") or {}, arms["candidate"].get("routes") or {}
    names = sorted(set(croutes) | set(troutes))
    if not names:
        return ["### Routes", "", "No route counters in either result.", ""]
    on = {name: set(arms[name].get("switched_routes") or []) for name in ("control", "candidate")}
    rows = []
    graphed = any((arm.get(n) or {}).get("captures") for arm in (croutes, troutes) for n in names)
    ranked = any(len((troutes.get(n) or {}).get("ranks") or {}) > 1 for n in names)  # tensor parallel
    for r in names:
        c, t = croutes.get(r) or {}, troutes.get(r) or {}
        roles = t.get("roles") or {}
        rows.append(
            {
                "route": r,
                "switched on in": ", ".join(n for n in ("control", "candidate") if r in on[n]) or "-",
                "control hits": c.get("hits", "n/a"),
                "control fallbacks": _fallbacks(c) if c else "n/a",
                "candidate hits": t.get("hits", "n/a"),
                "candidate fallbacks": _fallbacks(t) if t else "n/a",
                "candidate hits by role": counts_text(roles, empty="-"),
            }
        )
        if graphed:
            # Under CUDA graphs hits are executions (a captured call counts once per replay); the calls
            # captured into the graphs stand beside them. Without graphs the column is left out.
            rows[-1]["candidate captured calls by role"] = counts_text(t.get("captures") or {}, empty="-")
            rows[-1]["control captured calls"] = sum((c.get("captures") or {}).values()) if c else "n/a"
        if ranked:  # each worker's own hits: qgate.routes asks every rank for them (every_rank)
            per_rank = {
                f"rank {k}": v.get("hits", 0)
                for k, v in (t.get("ranks") or {}).items()
                if isinstance(v, dict)
            }
            rows[-1]["candidate hits by rank"] = counts_text(per_rank, empty="-")
    return ["### Routes", "", table(pd.DataFrame(rows)), "", *_shims(arms)]


def _shims(arms: dict[str, Any]) -> list[str]:
    """The platform shims each arm ran with (qgate_kernels.shims): bridges, never route hits."""
    cs, ts = arms["control"].get("shims") or {}, arms["candidate"].get("shims") or {}
    if not cs and not ts:
        return []
    rows = [
        {
            "shim": name,
            "control calls": (cs.get(name) or {}).get("calls", "not applied"),
            "candidate calls": (ts.get(name) or {}).get("calls", "not applied"),
            "what it does": (ts.get(name) or cs.get(name) or {}).get("applied", ""),
        }
        for name in sorted(set(cs) | set(ts))
    ]
    note = "Platform shims bridge what this platform lacks, in both arms alike; they are never route hits."
    return ["### Platform shims", "", table(pd.DataFrame(rows)), "", note, ""]


def _gates(record: dict[str, Any]) -> list[str]:
    rows = [
        {
            "gate": g["name"],
            "result": _MARK[bool(g["passed"])],
            "on failure": _ON_FAILURE.get(str(g.get("severity")), "ERROR"),
            "detail": g["detail"],
        }
        for g in record["gates"]
    ]
    note = (
        'A failed gate makes the verdict what its "on failure" column says; ERROR outranks FAIL, FAIL '
        "outranks INCONCLUSIVE. The margin and improvement gates are INCONCLUSIVE when the interval cannot "
        "decide and FAIL when it lies wholly on the wrong side."
    )
    return ["## Gates", "", table(pd.DataFrame(rows)), "", note, ""]


def _flat(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k in sorted(value):
            out.update(_flat(f"{prefix}.{k}", value[k]))
        return out
    if isinstance(value, list):
        return {prefix: json.dumps(value)}
    return {prefix: "" if value is None else str(value)}


def _environment(section: dict[str, Any]) -> list[str]:
    arms = section["arms"]
    flat = {}
    for name in ("control", "candidate"):
        a = arms[name]
        keys = ("path", "arm", "env", "engine_args", "model", "fingerprint", "prompt", "workload")
        entries = {k: a.get(k) for k in keys if k in a}
        flat[name] = {k: v for key, val in entries.items() for k, v in _flat(key, val).items()}
    names = sorted(set(flat["control"]) | set(flat["candidate"]))
    rows = [
        {
            "": k,
            "control": flat["control"].get(k, "-"),
            "candidate": flat["candidate"].get(k, "-"),
            "same": "yes" if flat["control"].get(k) == flat["candidate"].get(k) else "no",
        }
        for k in names
    ]
    return ["## Environment", "", table(pd.DataFrame(rows)), ""]


def _list(title: str, items: list[str]) -> list[str]:
    return [title, "", *[f"- {md(i)}" for i in items], ""] if items else []


def _history_estimate(hist: dict[str, Any] | None) -> list[str]:
    """The history's between-launch estimate (qgate.launch_cv), when the comparison looked for one."""
    if not hist:
        return []
    lines = ["### Between engine starts: the history", ""]
    if not hist["used"]:
        return [*lines, f"Not used: {md(hist['reason'])}.", ""]
    lines += [
        f"- Between-launch CV of the control: {hist['cv_between_pct']:.2f} %, upper "
        f"{100 * hist['confidence']:g} % bound {hist['cv_between_upper_pct']:.2f} % (used for both arms); "
        f"within-launch CV {hist['cv_within_pct']:.2f} %.",
        f"- From {md(hist['reason'])}.",
        f"- Nights: {md(', '.join(hist['nights']))}.",
    ]
    if hist.get("skipped"):
        lines.append(f"- Skipped: {md('; '.join(hist['skipped']))}.")
    return [*lines, ""]


def _speed(record: dict[str, Any]) -> list[str]:
    figs, sp = record["figures"], record["speed"]
    unit = figs["unit"]
    across = figs.get("between_launch") or {}
    reps = f"{md(figs['control']['reps'])} v {md(figs['candidate']['reps'])} reps"
    if unit == "launch":
        how = (
            f", {md(figs['control']['launches'])} launches per arm: one-way random effects, the variance "
            "between engine starts is in the statistics)."
        )
    elif across.get("source") == "history":
        how = "). Each arm is one engine start; the variance between engine starts comes from the history "
        how += "(below)."
    else:
        how = (
            "). Each arm is one engine start, so variation between engine starts is not in these statistics "
            "and the decode ratio can neither PASS nor FAIL: use the contract's `launches` (>= 2), "
            "`--until-decided`, or `qgate compare --history STORE` for a verdict across engine starts."
        )
    unit_line = f"Statistics unit: {md(unit)} ({reps}{how}"
    return [
        "## Speed",
        "",
        unit_line,
        "",
        *_throughput(record),
        *_statistics(record),
        *_margin(record),
        *_history_estimate(across.get("history")),
        *_sequential(record),
        *_prefill(record),
        *_tokens(record),
        *_routes(record),
        *_list("### Refused: the arms differ in more than their env", sp["differences"]),
        *_list("### Notes", sp["notes"]),
    ]


def render_markdown(record: dict[str, Any]) -> str:
    """The full report for a verdict record."""
    c = record["contract"]
    lines = [
        f"# qgate verdict: {md(record['verdict'])}",
        "",
        f"Contract: {md(c['name'])} v{md(c['version'])}, sha256 {md_code(c['sha256'])} ({md(c['path'])})",
        "",
        *_list("Reasons:", record["reasons"]),
    ]
    if "speed" in record:
        lines += _speed(record)
    # beside the speed figures (not a gate); a verdict without one (no --timeline, schema 1 to 3)
    # renders as before
    lines += timeline_lines(record.get("timeline"))
    if "quality" in record:
        q = record["quality"]
        lines += ["## Quality", "", render_quality(q, q.get("quality_gates", [])).strip(), ""]
        lines += _list("### Refused: the arms differ in more than their env", q.get("differences", []))
    lines += _gates(record)
    section = record.get("speed") or record.get("quality")
    if section and "arms" in section:
        lines += _environment(section)
    return "\n".join(lines).rstrip() + "\n"
