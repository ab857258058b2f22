"""The fleet's gather step: every entry's run folder -> its night in the store -> one report.

Input: ARTIFACTS/<ARTIFACT_PREFIX><name>/ for each entry of the fleet list (what each entry's job
uploaded: speed/, quality/, compare-*/verdict.json), the store (qgate.history: SQLite path or
postgresql:// URL). Each entry's night goes to the entry's own history in the store; an entry whose
folder is missing (its job failed before the upload, or was cancelled) or holds no verdict is reported
as not recorded and never stops the others. An entry that did not finish is LOST: no folder ("not run"),
results without a verdict or no results ("not judged", killed mid-run), a store that refused its night
("refused"), or a kind the fleet list names (speed, quality) with no verdict in a folder whose other kind
was recorded ("incomplete": what finished is recorded, the missing kind is reported). Every lost entry
is said in the report's first lines, as an <error> test case of junit.xml, and in `lost()` (the CLI's
exit code), so a night that lost entries never looks clean. Output, in OUT:
  fleet.md         the night: the lost entries first, then one line per entry (runner, verdict, speed
                   and quality verdicts, recorded)
  junit.xml        a suite "qgate fleet entries" with one test case per entry (an <error> with why for
                   a lost one), then every entry's verdicts (qgate.report.junit)
  benchmark.json   every entry's decode tok/s and TPOT with CIs, Bencher Metric Format
  <name>/history.md, history.png   each recorded entry's trend (qgate history report)
`gather` returns a record of what happened; `store_failed` says whether a store refused a judged night
(the CLI's exit 2), `lost` which entries did not finish (the CLI's exit 3 when no store refused).
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
from qgate.report.escape import md, md_cell
from qgate.results import atomic_write_json, atomic_write_text


@dataclass(frozen=True)
class EntryOutcome:
    name: str
    runs_on: tuple[str, ...]
    status: str  # appended | already recorded | incomplete | not run | not judged | refused
    detail: str
    verdicts: dict[str, str]  # kind -> verdict
    report: str | None
    night: str | None = None  # the night recorded (None when none was)
    lost: str | None = None  # why the entry, or a kind of it, did not finish (None: it finished)


def _verdict_records(folder: Path) -> list[dict[str, Any]]:
    found = load_verdicts(folder)
    paths = sorted({v["path"] for v in found.values()})
    return [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]


def _one(
    entry: Entry, artifacts: Path, store: str, out: Path, night: str | None, commit: str | None
) -> EntryOutcome:
    folder = artifacts / f"{ARTIFACT_PREFIX}{entry.name}"
    base: dict[str, Any] = {"name": entry.name, "runs_on": entry.runs_on}
    if not folder.is_dir():
        why = f"no {folder.name} artifact: the entry's job did not upload its run folder"
        return EntryOutcome(**base, status="not run", detail=why, verdicts={}, report=None, lost=why)
    try:
        verdicts = {k: v["verdict"] for k, v in load_verdicts(folder).items()}
        unjudged = unjudged_kinds(folder)
    except HistoryError as exc:
        return EntryOutcome(
            **base, status="not judged", detail=str(exc), verdicts={}, report=None, lost=str(exc)
        )
    if unjudged or not verdicts:
        what = " and ".join(unjudged)
        detail = (
            f"no verdict for {what} results: the entry's compare did not run (killed mid-run?)"
            if what
            else "no results and no verdict in the run folder: the entry did not finish"
        )
        return EntryOutcome(
            **base, status="not judged", detail=detail, verdicts=verdicts, report=None, lost=detail
        )
    try:
        outcome = history.append(store, folder, night=night, commit=commit, entry=entry.name)
    except HistoryError as exc:
        return EntryOutcome(
            **base, status="refused", detail=str(exc), verdicts=verdicts, report=None, lost=str(exc)
        )
    paths = history.write_report(store, out / entry.name, entry=entry.name)
    detail = f"night {outcome.night} -> {outcome.store}"
    missing = [kind for kind in entry.contracts if kind not in verdicts]
    lost = None
    if missing:  # the kinds that finished are recorded; the one the job never got to is lost
        lost = f"no {' or '.join(missing)} verdict: the entry's {' and '.join(missing)} run did not finish"
        detail = f"{outcome.status}: {detail}; {lost}"
    return EntryOutcome(
        **base,
        status="incomplete" if missing else outcome.status,
        detail=detail,
        verdicts=verdicts,
        report=paths["report"],
        night=outcome.night,
        lost=lost,
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
    cases = [(o.name, o.lost, f"{o.status}: {o.detail}") for o in outcomes]
    for e in outcomes:
        folder = art / f"{ARTIFACT_PREFIX}{e.name}"
        if not e.verdicts:
            continue
        for record in _verdict_records(folder):
            suites.append((junit.suite_name(record, e.name), record))
            bench.update(benchmark.bmf(record, prefix=e.name))
    atomic_write_text(out_dir / "junit.xml", junit.render(suites, entries=cases))
    atomic_write_json(out_dir / "benchmark.json", bench)
    atomic_write_text(out_dir / "fleet.md", render(outcomes, night))
    return outcomes


def store_failed(outcomes: list[EntryOutcome]) -> bool:
    return any(o.status == "refused" for o in outcomes)


def lost(outcomes: list[EntryOutcome]) -> list[EntryOutcome]:
    """The entries (or a kind of one) that did not finish: what the night lost."""
    return [o for o in outcomes if o.lost is not None]


def render(outcomes: list[EntryOutcome], night: str | None) -> str:
    nights = night or ", ".join(sorted({o.night for o in outcomes if o.night})) or "(none recorded)"
    lines = [f"# qgate fleet night {nights}", ""]
    missing = lost(outcomes)
    if missing:  # first: a night that lost entries must not read as a clean one
        lines.append(f"**ERROR: {len(missing)} of {len(outcomes)} entries did not finish:**")
        lines += [md(f"{o.name}: {o.status}: {o.lost}".replace("|", "/")).join(("- ", "")) for o in missing]
        lines.append("")
    lines += ["| entry | runner | verdict | speed | quality | history |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        worst = _worst(o.verdicts)
        # The link's target is the entry's name (a-z, 0-9, '-': fleet.py checks it); all else is data.
        said = f"{o.status}: {o.detail}".replace("|", "/")
        trend = f"[{md(o.status)}]({o.name}/history.md)" if o.report else md_cell(said)
        cells = [
            o.name,
            ", ".join(o.runs_on),
            worst,
            o.verdicts.get("speed", "-"),
            o.verdicts.get("quality", "-"),
        ]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + f" | {trend} |")
    recorded = sum(o.night is not None for o in outcomes)
    lines += ["", f"{recorded} of {len(outcomes)} entries recorded."]
    return "\n".join(lines) + "\n"


def _worst(verdicts: dict[str, str]) -> str:
    from qgate.gate import VERDICT_RANK

    return max(verdicts.values(), key=VERDICT_RANK.__getitem__) if verdicts else "none"
