"""The `qgate` command: composes the sub-apps, nothing else."""

from __future__ import annotations

import typer

from qgate.cli import compare, contract, model, run

app = typer.Typer(
    help="qgate: gate GPU kernel candidates for LLM decode on speed and quality.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(contract.app, name="contract")
app.add_typer(model.app, name="model")
app.add_typer(run.app, name="run")
app.command("compare")(compare.compare)


def main() -> None:
    app()
