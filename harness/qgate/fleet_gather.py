"""The fleet's gather step: every entry's run folder -> its night in the store -> one report.

Input: ARTIFACTS/<ARTIFACT_PREFIX><name>/ for each entry of the fleet list (what each entry's job
uploaded: speed/, quality/, compare-*/verdict.json), the store (qgate.history: SQLite path or
postgresql:// URL). Each entry's night goes to the entry's own history in the store; an entry whose
folder is missing (its job failed before the upload, or was cancelled) or holds no verdict is reported
as not recorded and never stops the others. Output, in OUT:
  fleet.md         the night: one line per entry (runner, verdict, speed and quality verdicts, recorded)
  junit.xml        every entry's verdicts as JUnit (qgate.report.junit)
  benchmark.json   every entry's decode tok/s and TPOT with CIs, Bencher Metric Format
  <name>/history.md, history.png   each recorded entry's trend (qgate history report)
`gather` returns a record of what happened; `store_failed` says whether a store refused a judged night
(the CLI's exit 2), which an entry's own failure never does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qgate import history
from qgate.fleet import ARTIFACT_PREFIX, Entry
from qgate.night import HistoryError, load_verdicts, unjudged_kinds
from qgate.report import benchmark, junit
from qgate.results import atomic_write_json, atomic_write_text


@dataclass(frozen=True)
class EntryOutcome:
    name: str
    runs_on: tuple[str, ...]
    status: str  # appended | already recorded | not run | not judged | refused
    detail: str
    verdicts: dict[str, str]  # kind -> verdict
    report: str | None
    night: str | None = None  # the night recorded (None when none was)


def _verdict_records(folder: Path) -> list[dict[str, Any]]:
    found = load_verdicts(folder)
    paths = sorted({v["path"] for v in found.values()})
    return [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]


def _one(
    entry: Entry, artifacts: Path, store: str, out: Path, night: str | None, commit: str | None
) -> EntryOutcome:
    folder = artifacts / f"{ARTIFACT_PREFIX}{entry.name}"
    base = {"name": entry.name, "runs_on": entry.runs_on}
    if not folder.is_dir():
        return EntryOutcome(
            **base, status="not run", detail=f"no {folder.name} artifact", verdicts={}, report=None
        )
    try:
        verdicts = {k: v["verdict"] for k, v in load_verdicts(folder).items()}
        unjudged = unjudged_kinds(folder)
    except HistoryError as exc:
        return EntryOutcome(**base, status="not judged", detail=str(exc), verdicts={}, report=None)
    if unjudged or not verdicts:
        what = " and ".join(unjudged) or "its"
        detail = f"no verdict for {what} results: the entry's compare did not run"
        return EntryOutcome(**base, status="not judged", detail=detail, verdicts=verdicts, report=None)
    try:
        outcome = history.append(store, folder, night=night, commit=commit, entry=entry.name)
    except HistoryError as exc:
        return EntryOutcome(**base, status="refused", detail=str(exc), verdicts=verdicts, report=None)
    paths = history.write_report(store, out / entry.name, entry=entry.name)
    detail = f"night {outcome.night} -> {outcome.store}"
    return EntryOutcome(
        **base,
        status=outcome.status,
        detail=detail,
        verdicts=verdicts,
        report=paths["report"],
        night=outcome.night,
    )


def gather(
    entries: tuple[Entry, ...],
    artifacts: str | Path,
    store: str,
    out: str | Path,
    night: str | None = None,
    commit: str | None = None,
) -> list[EntryOutcome]:
    """Append every entry's night and write OUT/fleet.md, junit.xml, benchmark.json (module doc)."""
    out_dir, art = Path(out), Path(artifacts)
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes = [_one(e, art, store, out_dir, night, commit) for e in entries]
    suites, bench = [], {}
    for e in outcomes:
        folder = art / f"{ARTIFACT_PREFIX}{e.name}"
        if not e.verdicts:
            continue
        for record in _verdict_records(folder):
            suites.append((junit.suite_name(record, e.name), record))
            bench.update(benchmark.bmf(record, prefix=e.name))
    atomic_write_text(out_dir / "junit.xml", junit.render(suites))
    atomic_write_json(out_dir / "benchmark.json", bench)
    atomic_write_text(out_dir / "fleet.md", render(outcomes, night))
    return outcomes


def store_failed(outcomes: list[EntryOutcome]) -> bool:
    return any(o.status == "refused" for o in outcomes)


def render(outcomes: list[EntryOutcome], night: str | None) -> str:
    nights = night or ", ".join(sorted({o.night for o in outcomes if o.night})) or "(none recorded)"
    lines = [f"# qgate fleet night {nights}", ""]
    lines += ["| entry | runner | verdict | speed | quality | history |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        worst = _worst(o.verdicts)
        trend = f"[{o.status}]({o.name}/history.md)" if o.report else f"{o.status}: {o.detail}"
        lines.append(
            f"| {o.name} | {', '.join(o.runs_on)} | {worst} | {o.verdicts.get('speed', '-')} | "
            f"{o.verdicts.get('quality', '-')} | {trend.replace('|', '/')} |"
        )
    recorded = sum(o.status in ("appended", "already recorded") for o in outcomes)
    lines += ["", f"{recorded} of {len(outcomes)} entries recorded."]
    return "\n".join(lines) + "\n"


def _worst(verdicts: dict[str, str]) -> str:
    from qgate.gate import VERDICT_RANK

    return max(verdicts.values(), key=VERDICT_RANK.__getitem__) if verdicts else "none"
