"""Rich progress bars for runs: one bar per arm; speed (reps, live decode rate) and quality (outputs)."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from qgate.contract import Contract
from qgate.report.escape import term
from qgate.speed.run import AUDIT_ARM

_Bars = TypeVar("_Bars", bound="ArmBars")


def shown(value: object) -> str:
    """Data in a rich line: no terminal control bytes (report.escape.term), no rich markup."""
    return escape(term(value))


class ArmBars:
    """One bar per arm on stderr (done of total, a status line, elapsed time); a context manager."""

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
        self._tasks: dict[str, TaskID] = {}

    def _task(self, arm: str, done: int = 0) -> TaskID:
        if arm not in self._tasks:
            # The audit's engine start scores as many reps as left the control's tokens, known only to
            # its workload: its bar counts them without a total (N/?), not against the timed reps.
            total = None if arm == AUDIT_ARM else self._total
            self._tasks[arm] = self._bar.add_task(
                arm, total=total, completed=done, arm=shown(arm), status="starting engine"
            )
        return self._tasks[arm]

    def __enter__(self: _Bars) -> _Bars:
        self._bar.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.__exit__(et, ev, tb)


class SpeedProgress(ArmBars):
    """Speed events: warmups and reps of every launch, the live decode rate."""

    def __init__(self, contract: Contract) -> None:
        s = contract.speed
        super().__init__(((s.warmup + s.repetitions) * s.launches) if s else 0)

    def __call__(self, arm: str, ev: dict, result: dict) -> None:
        task = self._task(arm)
        kind = ev.get("event")
        if kind == "engine_ready":
            self._bar.update(task, status=f"engine up in {ev['engine_start_s']:.1f} s")
        elif kind == "warmup":
            self._bar.update(task, advance=1, status=f"warmup {ev['index'] + 1}")
        elif kind == "rep":
            rep = ev["rep"]
            self._bar.update(
                task,
                completed=self._bar.tasks[task].completed + 1,
                status=f"rep {rep['index']}: {rep['decode_tok_s']:.1f} tok/s",
            )
        elif kind == "audit":  # the control's model scoring a candidate rep (qgate.speed.audit), untimed
            self._bar.update(task, advance=1, status=f"audit: rep {ev['audit']['index']} scored")
        elif kind == "error":
            self._bar.update(task, status=f"[red]error: {shown(str(ev.get('message', ''))[:60])}")


class QualityProgress(ArmBars):
    """One bar per arm (outputs done of items x seeds), one log line per output above the bars."""

    def __call__(self, arm: str, event: dict, result: dict) -> None:
        task = self._task(arm, max(0, len(result.get("items", [])) - (event.get("event") == "item")))
        kind = event.get("event")
        if kind == "engine_ready":
            self._console.print(
                f"{shown(arm)}: engine ready in {event['engine_start_s']:.1f} s", highlight=False
            )
            self._bar.update(task, status="running")
        elif kind == "item":
            r = event["item"]
            mark = "ok" if r["raw_correct"] and r["strict_correct"] else "MISS"
            rate = f"{r['decode_tok_s']:.0f} tok/s" if r["decode_tok_s"] else "-"
            self._console.print(
                term(
                    f"{arm}: item {r['index']} seed {r.get('seed')}: {mark} raw {r['raw_answer']} strict "
                    f"{r['strict_answer']} (expected {r['gold']}), {r['finish_reason']}, "
                    f"{r['output_tokens']} tokens, {rate}"
                ),
                highlight=False,
                markup=False,
            )
            self._bar.update(task, completed=len(result.get("items", [])), status=f"item {r['index']} {mark}")
        elif kind == "error":
            self._bar.update(task, status=f"[red]error: {shown(str(event.get('message', ''))[:60])}")
