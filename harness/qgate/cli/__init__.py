"""The `qgate` command: composes the sub-apps, nothing else."""

from __future__ import annotations

import typer

from qgate.cli import (
    ablate,
    compare,
    contract,
    contract_doc,
    demo,
    fleet,
    history,
    model,
    ops,
    quality,
    run,
    runner,
)

app = typer.Typer(
    help="qgate: gate GPU kernel candidates for LLM decode on speed and quality.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
contract.app.command("doc")(contract_doc.doc)
run.app.command("quality")(quality.quality)
run.app.command("ops")(ops.run_ops_cmd)
app.add_typer(contract.app, name="contract")
app.add_typer(model.app, name="model")
app.add_typer(run.app, name="run")
app.add_typer(ops.bench_app, name="bench")
app.add_typer(history.app, name="history")
app.add_typer(fleet.app, name="fleet")
app.command("compare")(compare.compare)
app.command("ablate")(ablate.ablate)
app.command("demo")(demo.demo)
app.command("check-runner")(runner.check_runner)


def main() -> None:
    """The commands (the `qgate` script is qgate.entry's main: the stop signals' line first)."""
    app()
