"""`qgate run quality`: wiring only (mounted by qgate.cli.run as the `quality` command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import ArmChoice, ContractOpt, KillLeftoversOpt, OutOpt, say, user_errors
from qgate.cli._progress import QualityProgress

ArmOpt = Annotated[ArmChoice | None, typer.Option("--arm", help="one arm only (default: both)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the saved items")]
DataOpt = Annotated[
    Path | None,
    typer.Option("--data", help="GSM8K test JSONL (else env QGATE_GSM8K_PATH, quality.data_path)"),
]


def _kept(out: Path, arms: tuple[str, ...]) -> str:
    """What a stopped run keeps, for its last line: the finished outputs on disk per arm."""
    from qgate.quality.run import result_paths
    from qgate.results import read_jsonl

    counts = ", ".join(f"{a} {len(read_jsonl(result_paths(out, a)[0]))} outputs" for a in arms)
    return f"{counts} in {out / 'quality'}"


def quality(
    contract: ContractOpt, out: OutOpt, arm: ArmOpt = None, resume: ResumeOpt = False, data: DataOpt = None,
    kill_leftovers: KillLeftoversOpt = False,
) -> None:  # fmt: skip
    """Quality gate: the frozen GSM8K items under every seed, per arm; compare with `qgate compare`."""
    from qgate.contract import load_contract
    from qgate.quality.run import ARMS, result_paths, run_quality

    arms = (arm.value,) if arm else ARMS
    with user_errors(kept=lambda: _kept(out, arms)):
        loaded = load_contract(contract)
        q = loaded.contract.quality
        total = q.n_items * len(q.run_seeds) if q is not None else 0
        with QualityProgress(total) as progress:
            results = run_quality(
                loaded, out, arms, resume=resume, data=data, progress=progress, kill_leftovers=kill_leftovers
            )
    for name, res in results.items():
        s = res["summary"]
        rate = f"{s['decode_tok_s']:.1f}" if s["decode_tok_s"] else "-"
        n, outputs = s["n_items"], s.get("n_outputs", s["n_items"])
        say(
            f"{name}: seed {s['frozen_seed']}: raw {s['raw_correct']}/{n}, strict {s['strict_correct']}/{n}; "
            f"{s['n_seeds']} seed(s): correct {s['correct_outputs']}/{outputs}, natural stops "
            f"{s['natural_stops']}/{outputs}, invalid {s['invalid']}, decode {rate} tok/s "
            f"-> {result_paths(out, name)[1]}"
        )
