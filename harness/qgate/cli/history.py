"""`qgate history append|report|publish`: wiring only (the store's rules are in qgate.history).

Exit codes: 0 done (append: appended, or the identical night was already recorded), 2 a bad result
directory or store (one line; the store is left as it was), including a night already recorded with
different figures, a wrong URL, a refused password, a database that is not a qgate store and a store of
a newer schema. The store comes from --store or QGATE_HISTORY_STORE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import OutOpt, say, user_errors

app = typer.Typer(help="History of nightly verdicts: append a night, render the trend.", no_args_is_help=True)
StoreOpt = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        envvar="QGATE_HISTORY_STORE",
        help="history store: a SQLite file or a postgresql://user@host/db URL (created by the first append)",
    ),
]
EntryOpt = Annotated[
    str | None,
    typer.Option("--entry", help="a fleet entry's own history in the store (docs/nightly.md, the fleet)"),
]
ResultDirArg = Annotated[
    Path,
    typer.Argument(
        metavar="RESULT_DIR",
        help="a night's run directory: speed/<arm>.json, quality/<arm>.json and the compare verdict.json(s)",
        file_okay=False,
    ),
]
NightOpt = Annotated[
    str | None,
    typer.Option("--night", help="YYYY-MM-DD (default: the UTC date of the first engine start)"),
]
CommitOpt = Annotated[
    str | None, typer.Option("--commit", help="commit SHA (default: the git SHA the results record)")
]


@app.command("append")
def append_cmd(
    result_dir: ResultDirArg,
    store: StoreOpt,
    night: NightOpt = None,
    commit: CommitOpt = None,
    entry: EntryOpt = None,
) -> None:
    """Add one night (one row per arm); the same night again is a no-op if identical, else refused."""
    from qgate.history import append  # the statistics: not imported by every qgate command

    with user_errors():
        outcome = append(store, result_dir, night=night, commit=commit, entry=entry)
    say(
        f"{outcome.status}: night {outcome.night} ({', '.join(outcome.arms)}), "
        f"verdict {outcome.verdict or 'none'} -> {outcome.store}"
    )


@app.command("publish")
def publish_cmd(
    store: StoreOpt,
    out: OutOpt,
    entry: Annotated[
        list[str] | None, typer.Option("--entry", help="a fleet entry's history (repeat for several)")
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option(
            "--fleet", help="the fleet list (.github/fleet.yaml): every entry's history", dir_okay=False
        ),
    ] = None,
    contracts: Annotated[
        list[Path] | None,
        typer.Option(
            "--contracts", help="contract files or folders: the gate's margin on their nights (repeat)"
        ),
    ] = None,
    note: Annotated[str | None, typer.Option("--note", help="a line on top of every page")] = None,
) -> None:
    """Write OUT/index.html and a page per contract x runner: a static site, no server, no network."""
    from qgate.fleet import load_fleet
    from qgate.history import publish

    with user_errors():
        entries = [*(entry or []), *(e.name for e in (load_fleet(fleet) if fleet else ()))]
        done = publish(store, out, entries=entries or None, contracts=contracts, note=note)
    say(
        f"site: {done['index']} ({done['series']} contract x runner series, {done['nights']} nights, "
        f"{done['pages']} pages)"
    )


@app.command("report")
def report_cmd(store: StoreOpt, out: OutOpt, entry: EntryOpt = None) -> None:
    """Write OUT/history.md and OUT/history.png: decode tok/s and quality per night, with the gates."""
    from qgate.history import write_report  # the statistics: not imported by every qgate command

    with user_errors():
        paths = write_report(store, out, entry=entry)
    say(f"report: {paths['report']}")
    if "plot" in paths:
        say(f"plot: {paths['plot']}")
