"""`qgate ablate -c C -o DIR [--design D] [--resume] [--force] [--until-decided [--max-launches N]]
[--timeline PROFILES] [--report-only]`.

--report-only starts no engine: the report from the arms' results already in DIR (a run cut by its time
limit, read where there is no GPU); not with --resume or --until-decided (exit 2).

D: both | one-at-a-time | leave-one-out | full. An ablation report already in DIR is refused (exit 2)
unless --resume or --force. --timeline reads tools/gpu_engine/profile_decode.py's folder (qgate.timeline)
before any engine starts: a bad one is exit 2 with nothing run. Wiring only.
Mounted by the top-level app as `app.command("ablate")(ablate.ablate)`.
Exit codes: 0 the ablation is trustworthy (status OK), 3 ERROR (an arm incomplete, not comparable,
not attested, or a statistic that could not be computed), 2 usage / contract error, 1 engine failure.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from qgate.cli._options import (
    EXIT_ERROR,
    EXIT_OK,
    ContractOpt,
    MaxLaunchesOpt,
    OutOpt,
    TimelineOpt,
    UntilDecidedOpt,
    exit_with,
    fail,
    say,
    user_errors,
)
from qgate.cli._progress import SpeedProgress
from qgate.contract import load_contract
from qgate.engine.procs import claimed


class Design(str, Enum):
    both = "both"
    one_at_a_time = "one-at-a-time"
    leave_one_out = "leave-one-out"
    full = "full"


DesignOpt = Annotated[
    Design,
    typer.Option(
        "--design",
        help="both: each factor alone and left out (default); one-at-a-time; leave-one-out; "
        "full: 2^k factorial",
    ),
]
_DEFAULT = Design.both  # qgate.ablate.DEFAULT_DESIGN (tests/test_ablate.py checks they agree)
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue: run only the arms and reps not done")]
ForceOpt = Annotated[bool, typer.Option("--force", help="overwrite an ablation report already in --out")]
ReportOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--report-only",
        help="start no engine: the report from the arms' results already in --out (a run cut short)",
    ),
]


def ablate(
    contract: ContractOpt,
    out: OutOpt,
    design: DesignOpt = _DEFAULT,
    resume: ResumeOpt = False,
    force: ForceOpt = False,
    until_decided: UntilDecidedOpt = False,
    max_launches: MaxLaunchesOpt = 10,
    timeline: TimelineOpt = None,
    report_only: ReportOnlyOpt = False,
) -> None:
    """Which route earned the speed-up: the speed gate per derived arm, effects with CIs, a report.
    With --until-decided, launches are added to every arm until the candidate's own verdict against
    the control is decided (as in `qgate run speed --until-decided`)."""
    from qgate.ablate import OK, run_ablation  # the statistics: not imported by every qgate command
    from qgate.timeline import read_timeline

    if report_only and (resume or until_decided):
        fail(f"--report-only starts no engine: not with {'--resume' if resume else '--until-decided'}")
    with user_errors():
        loaded = load_contract(contract)
        profiles = None if timeline is None else read_timeline(timeline)
    with user_errors(kept=lambda: f"the completed reps and items in {out}"):
        # One record of the run's processes in out for its speed and quality parts (engine/procs.py).
        with SpeedProgress(loaded.contract) as progress, claimed(out, command="qgate ablate"):
            record, paths = run_ablation(
                loaded, out, design.value, resume=resume, progress=progress, force=force,
                max_launches=max_launches if until_decided else None, timeline=profiles,
                report_only=report_only,
            )  # fmt: skip
    say(f"ablation: {record['status']} ({len(record['arms'])} arms, design {record['design']})")
    for reason in record["reasons"]:
        say(f"  - {reason}")
    for name, e in _effect_lines(record):
        say(f"  {name}: {e}")
    for note in record["notes"]:
        say(f"  note: {note}")
    say(f"report: {paths['report']}")
    exit_with(EXIT_OK if record["status"] == OK else EXIT_ERROR)


def _effect_lines(record: dict) -> list[tuple[str, str]]:
    eff = record["effects"]
    lines = [("all (candidate)", _fmt(eff["candidate"]))]
    for group, label in (("alone", "alone"), ("leave_one_out", "left out")):
        lines += [(f"{name} {label}", _fmt(e)) for name, e in eff[group].items()]
    return lines


def _fmt(e: dict) -> str:
    d = e["decode"]
    if d.get("ratio") is None:
        return d["verdict"]
    return f"x{d['ratio']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}] {d['verdict']}"
