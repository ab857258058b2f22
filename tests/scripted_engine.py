"""An engine start replaced by a script (for tests whose subject is what qgate does around the engine:
contract checks before a run, records and errors while saving): each start answers its spec's reps
with the same 8-token rep, through the same callbacks `engine.arms` gives `run_segment`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qgate.speed.workload import rep_record

OUT = {
    "token_ids": [1] * 8, "text": "", "finish_reason": "length", "num_generation_tokens": 8,
    "first_token_ts": 1.0, "last_token_ts": 1.1, "first_token_latency_s": 0.01, "scheduled_ts": 0.99,
}  # fmt: skip


class ScriptedSegments:
    """Stands in for `engine.arms.run_segment`; before_rep (if given) runs before each rep is reported."""

    def __init__(self, before_rep: Callable[[], None] | None = None) -> None:
        self.before_rep = before_rep

    def __call__(self, spec: dict, env: Any, log: Path, attest: Path, result: dict, on_event: Any,
                 save: Any, label: str) -> dict:  # fmt: skip
        out = {**OUT, "num_prompt_tokens": spec["input_tokens"]}
        on_event({"event": "engine_ready", "fingerprint": {"cpu": "x"}, "engine_start_s": 0.1})
        on_event({"event": "prompt", "input_tokens": spec["input_tokens"], "sha256": "p"})
        for i in spec["rep_indices"]:
            if self.before_rep is not None:
                self.before_rep()
            on_event({"event": "rep", "rep": rep_record(out, 0.2, i, spec["launch"], True)})
        save(result)
        return result
