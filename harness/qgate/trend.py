"""Trend decisions over the nightly history: which night a regression came in, and what changed when.

Input: the rows of qgate.history (one per arm per night). A regression shows the night it came in:
- an event "regression came in (speed|quality)" on the first night whose verdict of that kind is FAIL
  or ERROR after a passing night (or on its first night), with the last passing night and its commit
  beside the commit of that night (so the commits between the two are the suspects);
- events when the candidate's slowest rep first falls under the decode gate, when quality first falls
  under a quality gate, when an arm's mean decode rate moves by DRIFT_PCT or more from the night before
  (a note only: the nightly verdict is the gate), and when a contract or the environment changes
  (figures on either side of that night were measured under different conditions).
qgate.report.trend renders these (markdown + PNG); nothing here renders or prints.
"""

from __future__ import annotations

import json
from typing import Any

DRIFT_PCT = 5.0
_ENV_KEYS = ("gpu", "driver", "torch", "vllm")


def nights(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per night, oldest first: {night, commit, verdict, verdicts, control, candidate}."""
    by_night: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = by_night.setdefault(
            row["night"],
            {
                "night": row["night"],
                "commit": row["commit_sha"],
                "verdict": row["verdict"],
                "verdicts": json.loads(row["verdicts"] or "{}"),
                "control": None,
                "candidate": None,
            },
        )
        entry[row["arm"]] = row
    return [by_night[n] for n in sorted(by_night)]


def pct_change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return 100.0 * (new / old - 1.0)


def arm_value(entry: dict[str, Any] | None, arm: str, key: str) -> Any:
    row = entry and entry.get(arm)
    return row.get(key) if row else None


def short_commit(commit: str | None) -> str:
    return (commit or "?")[:12]


def _below_quality_gate(entry: dict[str, Any]) -> list[str]:
    row = entry.get("candidate")
    if not row or row.get("quality_selected") is None:
        return []
    out = []
    for label, key, gate_key in (
        ("raw", "raw_correct", "gate_min_raw_correct"),
        ("strict", "strict_correct", "gate_min_strict_correct"),
    ):
        gate = row.get(gate_key)
        if gate is not None and row[key] < gate:
            out.append(f"{label} {row[key]}/{row['quality_selected']} < {gate}")
    return out


def _below_speed_gate(entry: dict[str, Any]) -> bool:
    low, gate = (
        arm_value(entry, "candidate", "decode_tok_s_min"),
        arm_value(entry, "candidate", "gate_min_decode_tok_s"),
    )
    return low is not None and gate is not None and low < gate


def _kind_verdict(entry: dict[str, Any] | None, kind: str) -> str | None:
    return ((entry or {}).get("verdicts") or {}).get(kind, {}).get("verdict")


def _regressed(prev: dict[str, Any] | None, cur: dict[str, Any], kind: str) -> bool:
    """The kind's verdict is FAIL/ERROR and was PASS (or absent) the night before."""
    return _kind_verdict(cur, kind) in ("FAIL", "ERROR") and _kind_verdict(prev, kind) in (None, "PASS")


def _verdict_events(
    prev: dict[str, Any] | None, cur: dict[str, Any], last_pass: dict[str, dict[str, Any]]
) -> list[str]:
    """Per kind (speed, quality): the night its verdict turned FAIL/ERROR, and the night it recovered."""
    out = []
    for kind in sorted(cur["verdicts"]):
        v, pv = _kind_verdict(cur, kind), _kind_verdict(prev, kind)
        if _regressed(prev, cur, kind):
            lp = last_pass.get(kind)
            since = (
                f"last passing night {lp['night']} at commit {short_commit(lp['commit'])}"
                if lp
                else "no earlier passing night"
            )
            out.append(f"**regression came in** ({kind}): verdict {pv or 'none'} -> {v} ({since})")
        elif v == "PASS" and pv in ("FAIL", "ERROR"):
            out.append(f"recovered ({kind}): verdict {pv} -> PASS")
        elif v != pv and prev is not None and pv is not None:
            out.append(f"{kind} verdict {pv} -> {v}")
    return out


def _change_events(prev: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    out = []
    for arm in ("control", "candidate"):
        change = pct_change(
            arm_value(cur, arm, "decode_tok_s_mean"), arm_value(prev, arm, "decode_tok_s_mean")
        )
        if change is not None and abs(change) >= DRIFT_PCT:
            out.append(f"{arm} decode mean {change:+.1f} % vs the previous night")
    for kind in ("speed", "quality"):
        old, new = (arm_value(e, "candidate", f"{kind}_contract_sha256") for e in (prev, cur))
        if old and new and old != new:
            out.append(f"{kind} contract changed (sha256 {old[:12]} -> {new[:12]})")
    old_fp = json.loads(arm_value(prev, "candidate", "fingerprint") or "null") or {}
    new_fp = json.loads(arm_value(cur, "candidate", "fingerprint") or "null") or {}
    for key in _ENV_KEYS:
        if old_fp and new_fp and old_fp.get(key) != new_fp.get(key):
            out.append(f"environment changed: {key} {old_fp.get(key)!r} -> {new_fp.get(key)!r}")
    return out


def events(entries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What changed on which night, oldest first: [{night, commit, event}]."""
    out: list[dict[str, str]] = []
    prev: dict[str, Any] | None = None
    last_pass: dict[str, dict[str, Any]] = {}
    for cur in entries:
        found = _verdict_events(prev, cur, last_pass)
        if _below_speed_gate(cur) and (prev is None or not _below_speed_gate(prev)):
            low, gate = (
                arm_value(cur, "candidate", "decode_tok_s_min"),
                arm_value(cur, "candidate", "gate_min_decode_tok_s"),
            )
            found.append(f"candidate below the decode gate: slowest rep {low:.2f} < {gate:g} tok/s")
        below = _below_quality_gate(cur)
        if below and (prev is None or not _below_quality_gate(prev)):
            found.append("candidate below a quality gate: " + ", ".join(below))
        if prev is not None:
            found += _change_events(prev, cur)
        out += [{"night": cur["night"], "commit": short_commit(cur["commit"]), "event": e} for e in found]
        last_pass.update({k: cur for k in cur["verdicts"] if _kind_verdict(cur, k) == "PASS"})
        prev = cur
    return out


def regression_nights(entries: list[dict[str, Any]]) -> list[str]:
    """Nights on which a kind's verdict turned FAIL or ERROR after passing (or on its first night)."""
    out, prev = [], None
    for cur in entries:
        if any(_regressed(prev, cur, kind) for kind in cur["verdicts"]):
            out.append(cur["night"])
        prev = cur
    return out
