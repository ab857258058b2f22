"""The `qgate` command: composes the sub-apps, nothing else."""

from __future__ import annotations

from typing import Annotated

import typer

import qgate
from qgate.cli import (
    ablate,
    compare,
    contract,
    contract_doc,
    demo,
    fleet,
    gates,
    history,
    model,
    ops,
    quality,
    records,
    run,
    runner,
)
from qgate.cli._options import OneLineUsageErrors

app = typer.Typer(
    cls=OneLineUsageErrors,
    help="qgate: gate GPU kernel candidates for LLM decode on speed and quality.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
)


def _print_version(value: bool) -> None:
    # qgate.__version__ is the distribution's version too (pyproject.toml reads it): the code that runs
    # says its own version, also from a source tree on PYTHONPATH beside another installed qgate.
    if value:
        typer.echo(f"qgate {qgate.__version__}")
        raise typer.Exit()


@app.callback()
def _top(
    show_version: Annotated[
        bool,
        typer.Option("--version", help="print qgate's version", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """qgate: gate GPU kernel candidates for LLM decode on speed and quality."""


contract.app.command("doc")(contract_doc.doc)
run.app.command("quality")(quality.quality)
run.app.command("ops")(ops.run_ops_cmd)
app.add_typer(contract.app, name="contract")
app.add_typer(model.app, name="model")
app.add_typer(run.app, name="run")
app.add_typer(ops.bench_app, name="bench")
app.add_typer(history.app, name="history")
app.add_typer(fleet.app, name="fleet")
app.add_typer(records.app, name="records")
app.command("compare")(compare.compare)
app.command("ablate")(ablate.ablate)
app.command("demo")(demo.demo)
app.command("check-runner")(runner.check_runner)
app.command("gates")(gates.gates)


def main() -> None:
    """The commands (the `qgate` script is qgate.entry's main: the stop signals' line first)."""
    app()
