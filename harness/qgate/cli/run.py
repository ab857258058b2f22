"""`qgate run speed|quality|ops`: wiring only."""

from __future__ import annotations

from typing import Annotated

import typer

from qgate.cli._options import ArmChoice, ContractOpt, OutOpt, user_errors
from qgate.cli._progress import SpeedProgress
from qgate.contract import load_contract
from qgate.speed_run import ARMS, arm_path, run_speed

app = typer.Typer(help="Run a gate's workload on real vLLM, one engine start per arm.", no_args_is_help=True)
ArmOpt = Annotated[ArmChoice | None, typer.Option("--arm", help="one arm only (default: both)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the saved reps")]


@app.command()
def speed(contract: ContractOpt, out: OutOpt, arm: ArmOpt = None, resume: ResumeOpt = False) -> None:
    """Speed gate: warmup, then timed reps after a prefix-cache reset, per arm."""
    arms = (arm.value,) if arm else ARMS
    with user_errors():
        loaded = load_contract(contract)
        with SpeedProgress(loaded.contract) as progress:
            results = run_speed(loaded, out, arms, resume=resume, progress=progress)
    for name, res in results.items():
        rates = [r["decode_tok_s"] for r in res["reps"]]
        typer.echo(
            f"{name}: {len(rates)} reps, decode tok/s "
            + " ".join(f"{x:.1f}" for x in rates)
            + f" -> {arm_path(out, name)}"
        )
