"""The history as the published site shows it: one series per contract x runner, decided here from the
store's rows (plain dicts, qgate.history.read_rows), drawn by qgate.report.site. Nothing here renders.

A series is the nights of one history (a store, or a fleet entry's history in it) that ran the same
contracts (the speed and the quality contract's names) on the same runner (qgate.launch_cv's runner key:
hostname, CPU model and count, GPU, driver, torch, and vLLM); a runner change starts a new series, as it
starts a new between-launch estimate. Per night:
- the decode ratio (candidate / control mean) and its 95 % Welch-t interval, recomputed from the night's
  stored reps by qgate.stats (the launch as the unit on a night of 2+ engine starts; a one-launch night
  with the history's between-launch bound of the nights before it, qgate.launch_cv, as `compare
  --history` adds it; without one the interval of the reps alone, which knows nothing of the engine
  starts: `band_basis` says which);
- the gate's margin (speed.gates.max_decode_regression_pct) when the contract of that sha256 was given;
- the verdicts, the control's decode tok/s and its change from the night before (a drift of the runner
  at qgate.trend.DRIFT_PCT), quality counts, qgate.trend's events;
- what makes every figure traceable: commit, contract sha256s, the run folder, the runner key.
Nights missing between a series' first and last (no record: lost or not run) are listed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from qgate import trend
from qgate.launch_cv import LATER_KEYS, RUNNER_KEYS
from qgate.launch_cv import estimate as launch_estimate
from qgate.stats import LaunchDataError, StatsConfig, compare_samples, group_by_launch

BAND_LEVEL = 0.95
# Only the Welch-t interval is used: the bootstrap compare_samples also runs is kept small.
_BAND_STATS = StatsConfig(alpha=1 - BAND_LEVEL, bootstrap_resamples=200)
_KEYS = tuple(k for k in RUNNER_KEYS if k not in LATER_KEYS)


@dataclass(frozen=True)
class Margin:
    """A contract's non-inferiority margin, known by its sha256 (from the contracts given)."""

    name: str
    sha256: str
    margin_pct: float | None


@dataclass(frozen=True)
class Night:
    """One night of a series: its figures and where they come from."""

    night: str
    commit: str
    verdict: str | None
    kind_verdicts: dict[str, str]
    reasons: tuple[str, ...]
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    band_basis: str  # "launches" | "history" | "reps only" | why there is none
    margin_pct: float | None
    control_tok_s: float | None
    candidate_tok_s: float | None
    candidate_min_tok_s: float | None
    control_change_pct: float | None  # vs the series' previous night
    drift: bool
    quality: dict[str, Any]
    speed_contract_sha256: str | None
    quality_contract_sha256: str | None
    source: str | None
    events: tuple[str, ...]

    @property
    def flags(self) -> tuple[str, ...]:
        """What a reader must see: a FAIL or ERROR night, a drift of the runner."""
        bad = tuple(v for v in ("FAIL", "ERROR") if v == self.verdict)
        return bad + (("drift",) if self.drift else ())


@dataclass(frozen=True)
class Series:
    """The nights of one contract x runner (oldest first) and the lost nights between them."""

    slug: str  # the page's file name stem: [a-z0-9-] only, whatever the names hold
    entry: str | None
    speed_contract: str | None
    quality_contract: str | None
    runner: dict[str, Any]
    runner_id: str
    nights: tuple[Night, ...]
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def contract(self) -> str:
        names = [n for n in (self.speed_contract, self.quality_contract) if n]
        return " + ".join(dict.fromkeys(names)) or "(no contract recorded)"

    @property
    def last(self) -> Night:
        return self.nights[-1]

    def last_change(self) -> tuple[str, str, str] | None:
        """(night, verdict before, verdict after) of the latest change of the night's verdict."""
        for prev, cur in reversed(list(zip(self.nights, self.nights[1:], strict=False))):
            if prev.verdict != cur.verdict:
                return cur.night, str(prev.verdict), str(cur.verdict)
        return None


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def runner_key(row: Mapping[str, Any]) -> dict[str, Any]:
    """The runner a row ran on: launch_cv's runner keys (memory, recorded later, left out) and vLLM."""
    fp = _json(row.get("fingerprint"))
    fp = fp if isinstance(fp, dict) else {}
    return {**{k: fp.get(k) for k in _KEYS}, "vllm": fp.get("vllm")}


def _digest(value: Any, n: int = 10) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:n]


def _reps(row: Mapping[str, Any] | None) -> tuple[list[Any], list[Any] | None]:
    if not row:
        return [], None
    reps = _json(row.get("decode_tok_s_reps"))
    ids = _json(row.get("decode_launch_ids")) if row.get("decode_launch_ids") else None
    return (reps if isinstance(reps, list) else []), (ids if isinstance(ids, list) else None)


def _grouped(reps: list[Any], ids: list[Any] | None) -> tuple[Any, int]:
    """An arm's reps launch-major and its number of launches (stats.group_by_launch)."""
    launches = len({json.dumps(x) for x in ids}) if ids else 1
    return group_by_launch(reps, ids or [], launches), launches


def _between(rows: list[dict[str, Any]], control: Mapping[str, Any], n_reps: int) -> dict[str, float] | None:
    """The history's between-launch bound for a one-launch night, as `compare --history` computes it."""
    tonight = {
        "fingerprint": _json(control.get("fingerprint")),
        "contract": {"sha256": control.get("speed_contract_sha256")},
        "workload": {"repetitions": n_reps},
        "launches": [{"started_at": f"{control['night']}T12:00:00+00:00"}],
    }
    cv = launch_estimate(rows, tonight)
    return {"rel_var": cv.rel_var, "df": math.inf} if cv.used and cv.rel_var is not None else None


def decode_band(
    rows: list[dict[str, Any]], control: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None
) -> tuple[float | None, float | None, float | None, str]:
    """(ratio, low, high, basis) of one night's decode ratio from its stored reps; None and why not."""
    (c_reps, c_ids), (t_reps, t_ids) = _reps(control), _reps(candidate)
    if not c_reps or not t_reps or control is None:
        return None, None, None, "no decode reps of both arms"
    try:
        c, lc = _grouped(c_reps, c_ids)
        t, lt = _grouped(t_reps, t_ids)
    except (LaunchDataError, TypeError, ValueError) as exc:
        return None, None, None, f"reps do not group by launch: {exc}"
    if lc != lt:
        return None, None, None, f"control ran {lc} launches, candidate {lt}"
    between = _between(rows, control, len(c_reps)) if lc == 1 else None
    stats = compare_samples(c, t, _BAND_STATS, launches=lc, between=between)
    if stats.error is not None or stats.t_ci_low is None:
        return stats.ratio, None, None, f"no interval: {stats.error}"
    basis = "launches" if lc > 1 else ("history" if between else "reps only")
    return stats.ratio, stats.t_ci_low, stats.t_ci_high, basis


def _quality(cand: Mapping[str, Any] | None, ctrl: Mapping[str, Any] | None) -> dict[str, Any]:
    def get(row: Mapping[str, Any] | None, key: str) -> Any:
        return row.get(key) if row and row.get("quality_selected") is not None else None

    return {
        "selected": get(cand, "quality_selected"),
        "candidate_raw": get(cand, "raw_correct"),
        "candidate_strict": get(cand, "strict_correct"),
        "control_raw": get(ctrl, "raw_correct"),
        "control_strict": get(ctrl, "strict_correct"),
        "gate_raw": get(cand, "gate_min_raw_correct"),
        "gate_strict": get(cand, "gate_min_strict_correct"),
    }


def _reasons(verdicts: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for kind, v in sorted(verdicts.items()):
        if isinstance(v, dict):
            out += [f"{kind} ({v.get('verdict')}): {r}" for r in v.get("reasons") or []]
    return tuple(out)


def _night(
    entry: dict[str, Any],
    prev: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    margins: Mapping[str, Margin],
    events: tuple[str, ...],
) -> Night:
    ctrl, cand = entry.get("control"), entry.get("candidate")
    ratio, low, high, basis = decode_band(rows, ctrl, cand)
    either = cand or ctrl or {}
    sha = either.get("speed_contract_sha256")
    c_now, c_before = trend.arm_value(entry, "control", "decode_tok_s_mean"), None
    if prev is not None:
        c_before = trend.arm_value(prev, "control", "decode_tok_s_mean")
    change = trend.pct_change(c_now, c_before)
    verdicts = entry.get("verdicts") or {}
    return Night(
        night=entry["night"],
        commit=str(entry["commit"]),
        verdict=entry["verdict"],
        kind_verdicts={k: str(v.get("verdict")) for k, v in verdicts.items() if isinstance(v, dict)},
        reasons=_reasons(verdicts),
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        band_basis=basis,
        margin_pct=margins[sha].margin_pct if isinstance(sha, str) and sha in margins else None,
        control_tok_s=c_now,
        candidate_tok_s=trend.arm_value(entry, "candidate", "decode_tok_s_mean"),
        candidate_min_tok_s=trend.arm_value(entry, "candidate", "decode_tok_s_min"),
        control_change_pct=change,
        drift=change is not None and abs(change) >= trend.DRIFT_PCT,
        quality=_quality(cand, ctrl),
        speed_contract_sha256=sha,
        quality_contract_sha256=either.get("quality_contract_sha256"),
        source=either.get("source"),
        events=events,
    )


def _missing(nights: list[str]) -> tuple[str, ...]:
    """The calendar days between a series' first and last night that hold no night of it."""
    try:
        days = sorted(date.fromisoformat(n) for n in nights)
    except ValueError:
        return ()
    have, out, day = set(days), [], days[0] if days else None
    while day is not None and day < days[-1]:
        if day not in have:
            out.append(day.isoformat())
        day += timedelta(days=1)
    return tuple(out)


def _slug(entry: str | None, contract: str, runner_id: str) -> str:
    readable = "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in contract.lower())
    readable = "-".join(p for p in readable.split("-") if p)[:40] or "contract"
    return f"{readable}-{_digest([entry, contract, runner_id], 8)}"


def _group_key(rows_of_night: list[dict[str, Any]]) -> tuple[Any, ...]:
    row = next((r for r in rows_of_night if r["arm"] == "candidate"), rows_of_night[0])
    return row.get("speed_contract"), row.get("quality_contract"), json.dumps(runner_key(row), sort_keys=True)


def build_series(
    rows: list[dict[str, Any]], entry: str | None = None, margins: Mapping[str, Margin] | None = None
) -> list[Series]:
    """The contract x runner series of one history's rows (one store or fleet entry), oldest night first."""
    margins = margins or {}
    by_night: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_night.setdefault(row["night"], []).append(row)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for night in sorted(by_night):
        groups.setdefault(_group_key(by_night[night]), []).extend(by_night[night])
    out = []
    for (speed, quality, runner_json), group_rows in groups.items():
        entries = trend.nights(group_rows)
        by_event: dict[str, list[str]] = {}
        for ev in trend.events(entries):
            by_event.setdefault(ev["night"], []).append(ev["event"])
        nights = tuple(
            _night(e, entries[i - 1] if i else None, rows, margins, tuple(by_event.get(e["night"], ())))
            for i, e in enumerate(entries)
        )
        runner = json.loads(runner_json)
        runner_id = _digest(runner)
        contract = " + ".join(n for n in (speed, quality) if n) or "contract"
        out.append(
            Series(
                slug=_slug(entry, contract, runner_id),
                entry=entry,
                speed_contract=speed,
                quality_contract=quality,
                runner=runner,
                runner_id=runner_id,
                nights=nights,
                missing=_missing([n.night for n in nights]),
            )
        )
    return out
