"""`qgate demo`: wiring only (core in qgate.demo; the summary table in qgate.report.demo).

Exit codes: the overall verdict's (0 PASS, 1 FAIL, 3 ERROR, 4 INCONCLUSIVE); with --faulty (or
--faulty-kind KIND), 0 when every gate the kind names FAILed on the faulty candidate and 1 when one did
not; 2 bad input.
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from qgate.cli._options import DeviceChoice, MaxLaunchesOpt, UntilDecidedOpt, exit_with, user_errors
from qgate.demo import FAULTY_KINDS

# --faulty-kind's choices, made from qgate.demo.FAULTY_KINDS so that a new kind is one at once. A type
# checker cannot read an Enum built at run time: to it the value is the str each member is.
if TYPE_CHECKING:
    FaultyKindChoice = str
else:
    FaultyKindChoice = Enum("FaultyKindChoice", {kind: kind for kind in FAULTY_KINDS}, type=str)

DemoContractOpt = Annotated[
    Path | None,
    typer.Option(
        "--contract",
        "-c",
        help="contract with a speed section (default: the shipped demo-cpu.yaml); without an ops section "
        "the screen runs on its checkpoint's weights, without a quality section no quality gate runs",
    ),
]
DemoOutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="output directory (default: runs/demo-<time>)", file_okay=False),
]
FaultyOpt = Annotated[
    bool,
    typer.Option("--faulty", help="the candidate runs a known-faulty GEMV route (kind sign) the gates catch"),
]
# Typer has no option whose value may be left out, so the kind is an option of its own.
FaultyKindOpt = Annotated[
    FaultyKindChoice | None,
    typer.Option(
        "--faulty-kind",
        help="with or without --faulty: which gamed GEMV the candidate runs (qgate.demo.FAULTY_KINDS, "
        "docs/integrity.md)",
    ),
]

DeviceOpt = Annotated[
    DeviceChoice,
    typer.Option(
        "--device",
        help="where the operator screen runs the routes' ops: auto (CUDA when torch sees a GPU), cpu, cuda",
    ),
]


def demo(
    contract: DemoContractOpt = None,
    out: DemoOutOpt = None,
    faulty: FaultyOpt = False,
    faulty_kind: FaultyKindOpt = None,
    device: DeviceOpt = DeviceChoice.auto,
    until_decided: UntilDecidedOpt = False,
    max_launches: MaxLaunchesOpt = 6,
) -> None:
    """The whole gate on one contract: operator screen, speed gate, GSM8K quality gate, one summary.

    On a production-shape contract (no ops or quality section: a checkpoint without trained weights)
    the screen runs the candidate's code on the checkpoint's weights as vLLM loads them, the speed gate
    carries its audits, and the summary says that no quality gate ran."""
    from qgate import demo as core
    from qgate.cli._progress import QualityProgress, SpeedProgress, shown
    from qgate.report.demo import summary_table
    from qgate.report.escape import term, term_lines

    console = Console(stderr=True)
    started = time.perf_counter()
    contract = contract or core.default_contract()
    kind_name = faulty_kind.value if isinstance(faulty_kind, Enum) else faulty_kind  # a str to a type checker
    kind = kind_name if kind_name is not None else faulty
    tag = f"-faulty-{kind_name}" if kind_name else "-faulty" if faulty else ""
    out = out or Path("runs") / (time.strftime("demo-%Y%m%d-%H%M%S") + tag)
    with user_errors():
        plan = core.make_plan(contract, out, kind, device.value, max_launches if until_decided else None)
        faulty_txt = f" (faulty candidate: {plan.faulty})" if plan.faulty else ""
        console.rule(f"qgate demo: {contract} -> {out}{faulty_txt}")
        with console.status(
            f"model {shown(plan.loaded.contract.model)}: cached, or trained now (first use, 1-2 min)"
        ):
            path, seconds, built = core.ensure_model(plan)
        how = f"built now in {seconds:.0f} s (first use)" if built else "cached"
        console.print(f"model: {shown(path)} ({how})")
        real = " --real" if plan.loaded.contract.ops is None else ""
        console.rule(f"1/3 operator screen (qgate run ops{real})")
        with console.status("screening the routes' ops against their references"):
            gates = [core.run_screen_gate(plan)]
        console.print(f"operator screen: {shown(gates[-1].verdict)}: {shown(gates[-1].figure)}")
        decided = f" --until-decided --max-launches {max_launches}" if until_decided else ""
        console.rule(f"2/3 speed gate (qgate run speed{decided} + qgate compare)")
        with SpeedProgress(plan.loaded.contract) as progress:
            gates.append(core.run_speed_gate(plan, progress))
        console.print(f"speed: {shown(gates[-1].verdict)}: {shown(gates[-1].figure)}")
        console.rule("3/3 quality gate (qgate run quality + qgate compare)")
        q = plan.loaded.contract.quality
        with QualityProgress(q.n_items * len(q.run_seeds) if q is not None else 0) as progress:
            gates.append(core.run_quality_gate(plan, progress))
        model = {"spec": plan.loaded.contract.model, "path": path, "seconds": seconds, "built_now": built}
        record = core.summarize_demo(plan, gates, model, started)
    out_console = Console()
    out_console.print(summary_table(record))
    for g in record["gates"]:
        for reason in g["reasons"][:3]:
            out_console.print(term(f"- {g['gate']}: {reason}"), markup=False, highlight=False)
        if len(g["reasons"]) > 3:
            more = len(g["reasons"]) - 3
            out_console.print(
                term(f"- {g['gate']}: {more} more in {g['report']}"), markup=False, highlight=False
            )
    out_console.print(term(f"summary: {out / 'summary.md'}"), markup=False, highlight=False)
    out_console.print(term_lines(record["next_step"]), markup=False, highlight=False)
    exit_with(core.exit_code(record))
