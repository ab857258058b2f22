"""The decode-step timeline section of the ablation report and of the verdict report, rendered from a
timeline record alone (qgate.timeline; the ablation record's or the verdict record's `timeline`).
Deterministic: fixed number formats, no timestamps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from qgate.report.escape import Md, md, md_code
from qgate.report.tables import table
from qgate.timeline import MATCHED_BY

TITLE = "## Decode-step timeline (torch profiler, not a gate)"
NAME_CHARS = 90  # a C++ template kernel name runs to hundreds of characters: its head says which kernel


def _num(value: Any, fmt: str = ".2f") -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return format(value, fmt)


def _name(name: str) -> Md:
    """A kernel name as code (its <...> would read as HTML otherwise), cut to NAME_CHARS."""
    text = name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."
    return md_code(text.replace("`", "'"))


def _pair(row: Mapping[str, Any], key: str, fmt: str) -> str:
    a, b = row["control"], row["arm"]
    return f"{_num(a[key], fmt) if a else '-'} -> {_num(b[key], fmt) if b else '-'}"


def reading(arm: str, a: Mapping[str, Any]) -> str:
    """One line on host against GPU for one arm against the control."""
    d, pct = a["delta_gpu_busy_us_per_step"], a["gpu_busy_change_pct"]
    gap = a["delta_host_gap_us_per_step"]
    if pct is None and d == 0:
        return "no CUDA kernels in either profile: the host side only (the qgate ops below)"
    if pct is None:
        verdict, pct_text = f"the control ran no CUDA kernels, the {arm} did", "n/a"
    else:
        pct_text = f"{pct:+.1f} %"
        if abs(pct) < 1.0:
            verdict = f"the {arm}'s kernels take about the control's GPU time under the profiler"
        else:
            verdict = f"the {arm}'s kernels are {'faster' if d < 0 else 'slower'} under the profiler"
    if abs(gap) > abs(d):
        verdict += "; the host gaps changed more than the GPU time"
    return f"GPU busy {d:+.0f} us a step ({pct_text}), host gap {gap:+.0f} us: {verdict}"


def _summary(tl: Mapping[str, Any], order: list[str]) -> list[str]:
    arms = {arm: tl["arms"][arm] for arm in order}
    rows = [
        {
            "arm": arm,
            "device": s["device"] or "n/a",
            "tokens": s["tokens"],
            "GPU busy us/step": _num(s["gpu_busy_us_per_step"]),
            "kernel span us/step": _num(s["kernel_span_us_per_step"]),
            "host gap us/step": _num(s["host_gap_us_per_step"]),
            "graph launches/step": _num(s["graph_launches_per_step"]),
            "eager kernel launches/step": _num(s["eager_kernel_launches_per_step"]),
            "kernels named": _num(s["kernels_named"], "d"),
        }
        for arm, s in arms.items()
    ]
    if any(s.get("graph_kernels") is not None for s in arms.values()):  # timeline schema 2
        for row, s in zip(rows, arms.values(), strict=True):
            row["graph replay: kernels"] = _num(s.get("graph_kernels"), "d")
            row["graph replay: span us"] = _num(s.get("graph_span_us"), ".1f")
    return [table(pd.DataFrame(rows)), ""]


def _stretches(arm: str, a: Mapping[str, Any]) -> list[str]:
    """One decode graph replay aligned with the control's: where they differ, by route."""
    g = a.get("graph_stretches")
    if not g:
        return []
    c, t = g["control"], g["arm"]
    d = t["span_us"] - c["span_us"]
    head = (
        f"One decode graph replay aligned with the control's: control {c['kernels']} kernels in "
        f"{c['span_us']:.1f} us, {md(arm)} {t['kernels']} in {t['span_us']:.1f} us ({d:+.1f}), "
        f"{g['aligned_kernels']} kernels alike. Where they differ, by the routes of the stretch's kernels "
        "(span: the stretch's first start to its last end, the gaps between its kernels included; "
        "busy: the time one of them ran):"
    )
    if not g["by_route"]:
        return [head.split(". Where")[0] + ": the same kernels in the same order.", ""]
    rows = [
        {
            "stretch": name,
            "stretches": r["stretches"],
            "control kernels": r["control"]["kernels"],
            "control span (busy) us": f"{r['control']['span_us']:.1f} ({r['control']['busy_us']:.1f})",
            f"{arm} kernels": r["arm"]["kernels"],
            f"{arm} span (busy) us": f"{r['arm']['span_us']:.1f} ({r['arm']['busy_us']:.1f})",
            "change of span us": f"{r['delta_span_us']:+.1f}",
        }
        for name, r in g["by_route"].items()
    ]
    return [head, "", table(pd.DataFrame(rows)), ""]


def _changes(a: Mapping[str, Any]) -> list[str]:
    k = a["kernels"]
    t = k["totals"]
    totals = ", ".join(
        f"{t[c]['count']} {c} ({t[c]['delta_us_per_step']:+.2f} us/step)"
        for c in ("added", "removed", "changed")
    )
    if not k["rows"]:
        return ["Kernels against the control: the same kernels, calls and GPU time in both profiles.", ""]
    lines = [
        f"Kernels against the control: {totals}; the {k['shown']} of {k['differing']} largest by |change|:",
        "",
    ]
    rows = [
        {
            "change": r["change"],
            "kernel": _name(r["name"]),
            "calls/step control -> arm": _pair(r, "per_step", ".2f"),
            "GPU us/step control -> arm": _pair(r, "us_per_step", ".2f"),
            "delta us/step": f"{r['delta_us_per_step']:+.2f}",
        }
        for r in k["rows"]
    ]
    lines += [table(pd.DataFrame(rows)), ""]
    return lines


def _early(arm: str, a: Mapping[str, Any]) -> list[str]:
    """The kernels of a replay that start before an earlier kernel ends, where that differs from the
    control (timeline schema 4): the part of a kernel's GPU us change that is a wait, not work."""
    e = a.get("graph_early_starts")
    if not e:
        return []
    c, t = e["early_us"]["control"], e["early_us"]["arm"]
    head = (
        f"Kernels that start before an earlier kernel of the replay ends: {c:.1f} us of overlap in the "
        f"control's replay, {t:.1f} in the {md(arm)}'s ({t - c:+.1f}). Under programmatic dependent launch "
        "(PDL) such a kernel waits in griddepcontrol.wait, and the profiler counts the wait as its time; "
        "another stream (vLLM's aux stream) overlaps the same way. Take a kernel's change of overlap "
        "off its change of GPU us above for the change of its own work"
    )
    if not e["rows"]:
        return [head + ": the same in both replays.", ""]
    rows = [
        {
            "kernel": _name(r["name"]),
            "early calls control -> arm": f"{r['control']['early']:.0f} -> {r['arm']['early']:.0f}",
            "overlap us control -> arm": f"{r['control']['early_us']:.1f} -> {r['arm']['early_us']:.1f}",
            "change us": f"{r['delta_early_us']:+.1f}",
        }
        for r in e["rows"]
    ]
    return [f"{head} ({e['shown']} of {e['differing']} that changed):", "", table(pd.DataFrame(rows)), ""]


def _host(arm: str, a: Mapping[str, Any]) -> list[str]:
    lines = []
    api = a["runtime_api"]
    if api is None:
        lines += ["Runtime API: not in both profiles.", ""]
    elif api["rows"]:
        rows = [
            {
                "runtime API": r["name"],
                "calls/step control -> arm": _pair(r, "per_step", ".2f"),
                "host us/step control -> arm": _pair(r, "us_per_step", ".1f"),
                "delta us/step": f"{r['delta_us_per_step']:+.1f}",
            }
            for r in api["rows"]
        ]
        lines += [f"Runtime-API calls that changed ({api['shown']} of {api['differing']}):", ""]
        lines += [table(pd.DataFrame(rows)), ""]
    else:
        lines += ["Runtime API: the same calls in both profiles.", ""]
    ops = a["qgate_ops"]
    if ops is None:
        text = "not in the profile"
    elif not ops:
        text = "none (under CUDA graphs a replay calls no op on the host)"
    else:
        text = ", ".join(
            f"{md_code(o['name'])} {o['per_step']:.2f}/step ({o['us_per_step']:.1f} us CPU)" for o in ops
        )
    return lines + [f"qgate ops on the host in {md(arm)}: {text}.", ""]


def _matched(tl: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """What the profiles were matched with (qgate.timeline.match_arms) and how: ("ablation" or
    "comparison", per profile {in_<of>, env_differs}); None where nothing matched them (a timeline
    record of its own, or one of schema 1 or 2 in a comparison)."""
    for of in MATCHED_BY:
        match = tl.get(f"{of}_arms")
        if match:
            return of, match
    return None


def _order(tl: Mapping[str, Any]) -> list[str]:
    """The profiles in the record's order (the control first), the arms they were matched with before
    a probe's other variants: the candidate's section comes before cand-noshared's."""
    matched = _matched(tl)
    others = [arm for arm in tl["arms"] if arm != "control"]
    if matched is not None:
        of, match = matched
        others.sort(key=lambda arm: not match.get(arm, {}).get(f"in_{of}", False))  # stable: names kept
    return ["control", *others]


def _arm_notes(tl: Mapping[str, Any]) -> list[str]:
    """What ties the profiles to the ablation's or the comparison's arms, where they were matched."""
    matched = _matched(tl)
    if matched is None:
        return []
    of, match = matched
    notes = []
    others = [arm for arm, m in match.items() if not m[f"in_{of}"]]
    if others:
        notes.append(f"Profiles of variants that are no arm of this {of}: {md(', '.join(others))}.")
    unchecked = [arm for arm, m in match.items() if m[f"in_{of}"] and m["env_differs"] is None]
    if unchecked:
        notes.append(
            f"No route env recorded in {md(', '.join(unchecked))}: the file names alone tie them to the arms."
        )
    alike = [arm for arm, m in match.items() if m[f"in_{of}"] and m["env_differs"] == {}]
    if alike:
        notes.append(f"The route env these profiles recorded is their {of} arm's: {md(', '.join(alike))}.")
    for arm, m in match.items():
        for var, v in (m["env_differs"] or {}).items():
            notes.append(
                f"**{md(arm)}: the profile ran {md(var)} = {md(repr(v['profile']))}, the {of}'s arm "
                f"{md(repr(v['arm']))}: "
                "a profile of other code than this arm's.**"
            )
    return [*notes, ""] if notes else []


def timeline_lines(tl: Mapping[str, Any] | None) -> list[str]:
    """The section's markdown lines; none without a timeline (the report is then as before)."""
    if tl is None:
        return []
    src, order = tl["source"], _order(tl)
    files = ", ".join(
        f"{md(f['file'])} (sha256 {md_code(f['sha256'][:12])})" for f in (src["files"][a] for a in order)
    )
    gaps = ", ".join(
        f"{md(arm)} {_num(s['host_gap_us_per_step'], '.0f')} of {_num(s['kernel_span_us_per_step'], '.0f')}"
        for arm, s in ((a, tl["arms"][a]) for a in order)
    )
    if any(s["kernel_span_us_per_step"] for s in tl["arms"].values()):
        caveat = (
            "Under torch.profiler every launch is recorded on the host, which makes every profiled arm "
            f"host-bound (host gap of the kernel span, us a step: {gaps}): these microseconds are not the "
            "speed gate's figures. Compare the arms with each other here, and judge speed by the speed "
            "gate's tok/s."
        )
    else:
        caveat = (
            "No CUDA kernels in these profiles (no GPU): the host side only. Timings under torch.profiler "
            "are not the speed gate's figures; judge speed by the speed gate's tok/s."
        )
    lines = [
        TITLE,
        "",
        f"Read from {md_code(src['folder'])}: {files} (tools/gpu_engine/profile_decode.py: one profiled "
        "generate() per arm, figures per decode step).",
        "",
        *_arm_notes(tl),
        caveat,
        "",
        *_summary(tl, order),
    ]
    for arm in order[1:]:
        a = tl["against_control"][arm]
        lines += [f"### {md(arm)} against the control", "", f"Reading: {md(reading(arm, a))}.", ""]
        lines += _changes(a) + _stretches(arm, a) + _early(arm, a) + _host(arm, a)
    return lines
