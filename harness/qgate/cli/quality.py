"""`qgate run quality`: wiring only (mounted by qgate.cli.run as the `quality` command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import ArmChoice, ContractOpt, OutOpt, user_errors

ArmOpt = Annotated[ArmChoice | None, typer.Option("--arm", help="one arm only (default: both)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the saved items")]
DataOpt = Annotated[
    Path | None,
    typer.Option("--data", help="GSM8K test JSONL (else env QGATE_GSM8K_PATH, quality.data_path)"),
]


def _progress(arm: str, event: dict, result: dict) -> None:
    if event.get("event") == "engine_ready":
        typer.echo(f"{arm}: engine ready in {event['engine_start_s']:.1f} s", err=True)
    elif event.get("event") == "item":
        r = event["item"]
        mark = "ok" if r["raw_correct"] and r["strict_correct"] else "MISS"
        rate = f"{r['decode_tok_s']:.0f} tok/s" if r["decode_tok_s"] else "-"
        typer.echo(
            f"{arm}: item {r['index']}: {mark} raw {r['raw_answer']} strict {r['strict_answer']} "
            f"(expected {r['gold']}), {r['finish_reason']}, {r['output_tokens']} tokens, {rate}",
            err=True,
        )


def quality(
    contract: ContractOpt, out: OutOpt, arm: ArmOpt = None, resume: ResumeOpt = False, data: DataOpt = None
) -> None:
    """Quality gate: the contract's frozen GSM8K items on each arm; compare with `qgate compare`."""
    from qgate.contract import load_contract
    from qgate.quality.runner import ARMS, result_paths, run_quality

    arms = (arm.value,) if arm else ARMS
    with user_errors():
        loaded = load_contract(contract)
        results = run_quality(loaded, out, arms, resume=resume, data=data, progress=_progress)
    for name, res in results.items():
        s = res["summary"]
        rate = f"{s['decode_tok_s']:.1f}" if s["decode_tok_s"] else "-"
        typer.echo(
            f"{name}: raw {s['raw_correct']}/{s['n_items']}, strict {s['strict_correct']}/{s['n_items']}, "
            f"natural stops {s['natural_stops']}, invalid {s['invalid']}, decode {rate} tok/s "
            f"-> {result_paths(out, name)[1]}"
        )
