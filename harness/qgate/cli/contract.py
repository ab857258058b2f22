"""`qgate contract validate|show|shipped`: wiring only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import say, say_text, user_errors
from qgate.contract import load_contract
from qgate.engine.arms import contract_arms
from qgate.engine.preflight import arm_envs

app = typer.Typer(help="Validate and show contracts.", no_args_is_help=True)
FileArg = Annotated[Path, typer.Argument(help="contract YAML", dir_okay=False)]


@app.command()
def validate(file: FileArg) -> None:
    """Check a contract as `qgate run` does before any engine starts (schema, route switches, overrides
    and sites imported and checked, shims); exit 2 with one line naming the key when it is wrong. Left
    to `run`: whether this machine's vLLM has the sites of the routes switched on."""
    with user_errors():
        loaded = load_contract(file)
        arm_envs([(plan.name, plan.env) for plan in contract_arms(loaded)], os.environ, machine=False)
    say(f"ok: {file} ({loaded.contract.name} v{loaded.contract.version}) sha256 {loaded.sha256}")


@app.command()
def show(file: FileArg) -> None:
    """Print the resolved contract (defaults filled in) and its sha256."""
    with user_errors():
        loaded = load_contract(file)
    resolved = loaded.contract.model_dump(mode="json")
    say_text(json.dumps({"path": loaded.path, "sha256": loaded.sha256, "contract": resolved}, indent=2))


@app.command()
def shipped() -> None:
    """Print the path of every contract qgate ships (demo-cpu.yaml, the demo's, among them), one a line:
    copy one to start your own."""
    from qgate.shipped import contracts

    with user_errors():
        for path in contracts():
            say(str(path))
