"""`qgate compare CONTROL CANDIDATE [--contract C] --out DIR [--force] [--aa] [--history STORE]
[--timeline PROFILES]`: wiring only.

--timeline reads tools/gpu_engine/profile_decode.py's folder (qgate.timeline) before anything is
compared: a bad one is exit 2 with nothing written. The timeline is in the report, never a gate.
Exit codes: 0 PASS, 1 FAIL, 2 usage or contract error, 3 ERROR, 4 INCONCLUSIVE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import (
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    OutOpt,
    TimelineOpt,
    exit_with,
    say,
    user_errors,
)

app = typer.Typer(help="Compare a control and a candidate result: statistics, gates, verdict.")
ControlArg = Annotated[
    Path,
    typer.Argument(
        metavar="CONTROL", help="control result JSON, or a run directory (its speed/control.json)"
    ),
]
CandidateArg = Annotated[
    Path,
    typer.Argument(
        metavar="CANDIDATE", help="candidate result JSON, or a run directory (its speed/candidate.json)"
    ),
]
# Optional here (the results name their contract), so the shared ContractOpt is restated with None.
MaybeContractOpt = Annotated[
    Path | None,
    typer.Option(
        "--contract", "-c", help="contract YAML (default: the one the results name)", dir_okay=False
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="overwrite a report already in --out")]
AaOpt = Annotated[
    bool,
    typer.Option("--aa", help="the arms ran with the same env on purpose (an A/A test); refused without it"),
]
JunitOpt = Annotated[
    Path | None,
    typer.Option(
        "--junit", help="also write the verdict as JUnit XML (a test case per gate)", dir_okay=False
    ),
]
BmfOpt = Annotated[
    Path | None,
    typer.Option(
        "--bmf",
        help="also write decode tok/s and TPOT per arm with CIs, Bencher Metric Format JSON",
        dir_okay=False,
    ),
]
HistoryOpt = Annotated[
    str | None,
    typer.Option(
        "--history",
        envvar="QGATE_HISTORY_STORE",
        help="history store (a SQLite file or a postgresql:// URL): with one engine start per arm, the "
        "control's between-launch CV from its earlier nights of this contract and runner (a SQLite store "
        "not yet created: none)",
    ),
]
_CODES = {"PASS": EXIT_OK, "FAIL": EXIT_FAIL, "INCONCLUSIVE": EXIT_INCONCLUSIVE, "ERROR": EXIT_ERROR}


@app.command()
def compare(
    control: ControlArg,
    candidate: CandidateArg,
    out: OutOpt,
    contract: MaybeContractOpt = None,
    force: ForceOpt = False,
    aa: AaOpt = False,
    junit: JunitOpt = None,
    bmf: BmfOpt = None,
    history: HistoryOpt = None,
    timeline: TimelineOpt = None,
) -> None:
    """Write DIR/report.md, DIR/verdict.json and DIR/speed.png.

    Exit 0 PASS, 1 FAIL, 3 ERROR, 4 INCONCLUSIVE; 2 when DIR already holds a report (unless --force),
    for the same file or run as both arms, and for a candidate with the control's env (unless --aa).
    """
    from qgate.compare import run_compare  # the statistics: not imported by every qgate command
    from qgate.timeline import read_timeline

    with user_errors():
        profiles = None if timeline is None else read_timeline(timeline)
        record, paths = run_compare(
            control, candidate, contract, out, force=force, aa=aa, history=history, timeline=profiles,
            exports={"junit": junit, "bmf": bmf},
        )  # fmt: skip
    say(f"verdict: {record['verdict']}")
    for reason in record["reasons"]:
        say(f"  - {reason}")
    say(f"report: {paths['report']}")
    for label, path in (("junit", junit), ("bmf", bmf)):
        if path is not None:
            say(f"{label}: {path}")
    exit_with(_CODES[record["verdict"]])
