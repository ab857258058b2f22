"""`qgate run speed|quality|ops|leftovers`: wiring only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import (
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    ArmChoice,
    ContractOpt,
    KillLeftoversOpt,
    MaxLaunchesOpt,
    OutOpt,
    UntilDecidedOpt,
    fail,
    say,
    user_errors,
)
from qgate.cli._progress import SpeedProgress
from qgate.contract import load_contract
from qgate.engine import procs
from qgate.speed.run import ARMS, arm_path, kept_reps, run_speed, run_speed_until_decided

app = typer.Typer(help="Run a gate's workload on real vLLM, one engine start per arm.", no_args_is_help=True)
ArmOpt = Annotated[ArmChoice | None, typer.Option("--arm", help="one arm only (default: both)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the saved reps")]
SEQUENTIAL_EXIT = {"PASS": 0, "FAIL": EXIT_FAIL, "INCONCLUSIVE": EXIT_INCONCLUSIVE}


@app.command()
def speed(
    contract: ContractOpt,
    out: OutOpt,
    arm: ArmOpt = None,
    resume: ResumeOpt = False,
    kill_leftovers: KillLeftoversOpt = False,
    until_decided: UntilDecidedOpt = False,
    max_launches: MaxLaunchesOpt = 10,
) -> None:
    """Speed gate: warmup, then timed reps after a prefix-cache reset, per arm."""
    arms = (arm.value,) if arm else ARMS
    if until_decided and arm is not None:
        fail("--until-decided runs both arms: leave out --arm")
    seq = None
    with user_errors(kept=lambda: kept_reps(out, arms)):
        loaded = load_contract(contract)
        with SpeedProgress(loaded.contract) as progress:
            if until_decided:
                results, seq = run_speed_until_decided(
                    loaded, out, max_launches, resume=resume, progress=progress, kill_leftovers=kill_leftovers
                )
            else:
                results = run_speed(
                    loaded, out, arms, resume=resume, progress=progress, kill_leftovers=kill_leftovers
                )
    for name, res in results.items():
        rates = [r["decode_tok_s"] for r in res["reps"]]
        say(
            f"{name}: {len(rates)} reps, decode tok/s "
            + " ".join(f"{x:.1f}" for x in rates)
            + f" -> {arm_path(out, name)}"
        )
    if seq is not None:
        for look in seq["looks"]:
            head = f"look {look['look']} at {look['launches']} launches per arm"
            say(f"{head}: {look['decision']}: {look['reason']}")
        decision = seq["decision"] or "ERROR"
        say(f"sequential decision: {decision} after {seq['stopped_at_launches']} launches per arm")
        raise typer.Exit(SEQUENTIAL_EXIT.get(decision, EXIT_ERROR))


@app.command()
def leftovers(
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="the run folder whose recorded run to check", file_okay=False),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="also processes whose qgate still runs (default: orphans only)")
    ] = False,
    kill: Annotated[bool, typer.Option("--kill", help="end them: SIGTERM, then SIGKILL after 3 s")] = False,
) -> None:
    """Processes of earlier qgate runs (engine children, vLLM's EngineCore and Workers) still alive.

    Without --out: every process of this user that carries a qgate run token and whose qgate is gone
    (with --all: whatever its qgate). With --out: the run recorded in DIR/processes.json, its qgate
    included. One line per process; exit 0 when none is left, 1 when some are (listed, or not ended).
    """
    with user_errors():
        if out is not None:
            found = procs.earlier_run(out)
            pids = found[1] if found else []
        else:
            pids = procs.leftovers(orphans_only=not every)
        for pid in pids:
            say(f"{'ending' if kill else 'alive'}: {procs.describe(pid)}")
        left = procs.end(pids) if kill else pids
    if left:
        say(f"qgate: {len(left)} process(es) of earlier runs still alive", err=True)
        raise typer.Exit(EXIT_FAIL)
    say(f"no qgate run processes left{'' if out is None else f' for {out}'}")
