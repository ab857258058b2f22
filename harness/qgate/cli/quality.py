"""`qgate run quality`: wiring only (mounted by qgate.cli.run as the `quality` command)."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from qgate.cli._options import ArmChoice, ContractOpt, KillLeftoversOpt, OutOpt, user_errors

ArmOpt = Annotated[ArmChoice | None, typer.Option("--arm", help="one arm only (default: both)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the saved items")]
DataOpt = Annotated[
    Path | None,
    typer.Option("--data", help="GSM8K test JSONL (else env QGATE_GSM8K_PATH, quality.data_path)"),
]


class QualityProgress:
    """One bar per arm (outputs done of items x seeds), one log line per output above the bars."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("[bold]{task.fields[arm]:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self._console,
        )
        self._tasks: dict[str, int] = {}

    def _task(self, arm: str, done: int) -> int:
        if arm not in self._tasks:
            self._tasks[arm] = self._bar.add_task(
                arm, total=self._total, completed=done, arm=arm, status="starting engine"
            )
        return self._tasks[arm]

    def __call__(self, arm: str, event: dict, result: dict) -> None:
        task = self._task(arm, max(0, len(result.get("items", [])) - (event.get("event") == "item")))
        kind = event.get("event")
        if kind == "engine_ready":
            self._console.print(f"{arm}: engine ready in {event['engine_start_s']:.1f} s", highlight=False)
            self._bar.update(task, status="running")
        elif kind == "item":
            r = event["item"]
            mark = "ok" if r["raw_correct"] and r["strict_correct"] else "MISS"
            rate = f"{r['decode_tok_s']:.0f} tok/s" if r["decode_tok_s"] else "-"
            self._console.print(
                f"{arm}: item {r['index']} seed {r.get('seed')}: {mark} raw {r['raw_answer']} strict "
                f"{r['strict_answer']} (expected {r['gold']}), {r['finish_reason']}, "
                f"{r['output_tokens']} tokens, {rate}",
                highlight=False,
                markup=False,
            )
            self._bar.update(task, completed=len(result.get("items", [])), status=f"item {r['index']} {mark}")
        elif kind == "error":
            self._bar.update(task, status=f"[red]error: {str(event.get('message', ''))[:60]}")

    def __enter__(self) -> QualityProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.__exit__(et, ev, tb)


def _kept(out: Path, arms: tuple[str, ...]) -> str:
    """What a stopped run keeps, for its last line: the finished outputs on disk per arm."""
    from qgate.quality.runner import result_paths
    from qgate.results import read_jsonl

    counts = ", ".join(f"{a} {len(read_jsonl(result_paths(out, a)[0]))} outputs" for a in arms)
    return f"{counts} in {out / 'quality'}"


def quality(
    contract: ContractOpt, out: OutOpt, arm: ArmOpt = None, resume: ResumeOpt = False, data: DataOpt = None,
    kill_leftovers: KillLeftoversOpt = False,
) -> None:  # fmt: skip
    """Quality gate: the frozen GSM8K items under every seed, per arm; compare with `qgate compare`."""
    from qgate.contract import load_contract
    from qgate.engine.procs import claimed
    from qgate.quality.runner import ARMS, result_paths, run_quality

    arms = (arm.value,) if arm else ARMS
    with user_errors(kept=lambda: _kept(out, arms)):
        loaded = load_contract(contract)
        q = loaded.contract.quality
        total = q.n_items * len(q.run_seeds) if q is not None else 0
        # claimed: refuse (or end) live processes of an earlier run in out (engine/procs.py).
        with QualityProgress(total) as progress, claimed(out, kill_leftovers):
            results = run_quality(loaded, out, arms, resume=resume, data=data, progress=progress)
    for name, res in results.items():
        s = res["summary"]
        rate = f"{s['decode_tok_s']:.1f}" if s["decode_tok_s"] else "-"
        n, outputs = s["n_items"], s.get("n_outputs", s["n_items"])
        typer.echo(
            f"{name}: seed {s['frozen_seed']}: raw {s['raw_correct']}/{n}, strict {s['strict_correct']}/{n}; "
            f"{s['n_seeds']} seed(s): correct {s['correct_outputs']}/{outputs}, natural stops "
            f"{s['natural_stops']}/{outputs}, invalid {s['invalid']}, decode {rate} tok/s "
            f"-> {result_paths(out, name)[1]}"
        )
