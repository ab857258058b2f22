"""`qgate fleet check|matrix|contracts|gather`: the nightly as a matrix over GPU runners. Wiring only
(qgate.fleet reads the list, qgate.fleet_gather appends and reports). Exit 2 with one line for a bad
list or store; docs/nightly.md, "From one runner to a fleet"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import EXIT_ERROR, EXIT_USAGE, OutOpt, exit_with, say, user_errors

app = typer.Typer(help="The nightly as a matrix over GPU runners: check the list, gather the night.")
FleetArg = Annotated[
    Path, typer.Argument(metavar="FLEET", help="the fleet list (.github/fleet.yaml)", dir_okay=False)
]


@app.command("check")
def check_cmd(fleet: FleetArg) -> None:
    """Validate the list: keys, contracts, duplicate entries."""
    from qgate.fleet import load_fleet

    with user_errors():
        entries = load_fleet(fleet)
    say(f"{fleet}: {len(entries)} entries: {', '.join(e.name for e in entries)}")


@app.command("matrix")
def matrix_cmd(fleet: FleetArg) -> None:
    """Print the checked list as GitHub Actions' strategy.matrix (one line of JSON)."""
    from qgate.fleet import load_fleet, matrix

    with user_errors():
        entries = load_fleet(fleet)
    say(json.dumps(matrix(entries), separators=(",", ":")))


@app.command("contracts")
def contracts_cmd(
    fleet: FleetArg,
    out: OutOpt,
    entry: Annotated[str, typer.Option("--entry", help="the entry's name")],
) -> None:
    """Write the entry's contracts to OUT/<kind>.yaml (candidate_env applied); print KIND_CONTRACT=path."""
    from qgate.fleet import find, load_fleet, write_contracts

    with user_errors():
        paths = write_contracts(find(load_fleet(fleet), entry), out)
    for kind, path in paths.items():
        say(f"{kind.upper()}_CONTRACT={path}")


@app.command("gather")
def gather_cmd(
    fleet: FleetArg,
    artifacts: Annotated[
        Path, typer.Argument(metavar="ARTIFACTS", help="the entries' downloaded artifacts", file_okay=False)
    ],
    out: OutOpt,
    store: Annotated[
        str,
        typer.Option("--store", "-s", envvar="QGATE_HISTORY_STORE", help="SQLite path or postgresql:// URL"),
    ],
    night: Annotated[str | None, typer.Option("--night", help="YYYY-MM-DD (default: each run's own)")] = None,
    commit: Annotated[str | None, typer.Option("--commit", help="commit SHA (default: the results')")] = None,
) -> None:
    """Append every entry's night to its history in the store; write OUT/fleet.md, junit.xml,
    benchmark.json and each entry's trend. Exit 2 when the store refused a judged night, else 3 when an
    entry did not finish (no artifact, killed mid-run, a kind without a verdict)."""
    from qgate.fleet import load_fleet
    from qgate.fleet_gather import gather, lost, store_failed

    with user_errors():
        outcomes = gather(load_fleet(fleet), artifacts, store, out, night=night, commit=commit)
    for o in outcomes:
        say(f"{o.name}: {o.status}: {o.detail}")
    say(f"report: {out / 'fleet.md'}")
    if store_failed(outcomes):
        exit_with(EXIT_USAGE)
    missing = lost(outcomes)
    if missing:
        names = ", ".join(o.name for o in missing)
        said = f"{len(missing)} of {len(outcomes)} entries did not finish: {names}"
        say(f"qgate: error: {said}", err=True)
        exit_with(EXIT_ERROR)
