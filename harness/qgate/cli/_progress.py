"""Rich progress bars for runs: one task per arm, reps done and the live decode rate."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from qgate.contract import Contract


class SpeedProgress:
    """Context manager that renders speed events on stderr."""

    def __init__(self, contract: Contract) -> None:
        s = contract.speed
        self._per_launch = (s.warmup + s.repetitions) if s else 0
        self._launches = s.launches if s else 1
        self._bar = Progress(
            TextColumn("[bold]{task.fields[arm]:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._tasks: dict[str, int] = {}

    def _task(self, arm: str) -> int:
        if arm not in self._tasks:
            total = self._per_launch * self._launches
            self._tasks[arm] = self._bar.add_task(arm, total=total, arm=arm, status="starting engine")
        return self._tasks[arm]

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
        elif kind == "error":
            self._bar.update(task, status=f"[red]error: {ev.get('message', '')[:60]}")

    def __enter__(self) -> SpeedProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.__exit__(et, ev, tb)
