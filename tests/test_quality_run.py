"""The in-engine item loop with a scripted adapter: prompts, sampling passed through, resume, reset check.

The real engine path is covered by tests/test_quality_e2e.py; this checks the loop's own logic.
"""

from __future__ import annotations

import pytest

from qgate.quality.workload import QualityRunError, build_messages, run_items

SPEC = {
    "items": [{"index": 8, "question": "Q8?", "gold": "8"}, {"index": 9, "question": "Q9?", "gold": "9"}],
    "user_template": "Solve: {question} \\boxed{}",
    "system_prompt": "Be brief.",
    "chat_template_kwargs": {"enable_thinking": True},
    "sampling": {
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
        "seed": 7,
        "max_tokens": 64,
        "ignore_eos": False,
    },
    "strict_formats": ["hash"],
    "window_chars": 50,
    "reset_prefix_cache": True,
}


class ScriptedEngine:
    """Answers each question with a fixed text; records what the loop asked for."""

    def __init__(self, reset_ok: bool = True) -> None:
        self.calls: list[tuple] = []
        self.reset_ok = reset_ok

    def chat_prompt_ids(self, messages: list[dict], kwargs: dict) -> list[int]:
        self.calls.append(("chat", messages, kwargs))
        return [1, 2, len(messages[-1]["content"])]

    def decode(self, ids: list[int]) -> str:
        return "<|im_start|>assistant\n"

    def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset",))
        return self.reset_ok

    def generate(self, prompt_ids: list[int], sampling: dict) -> dict:
        self.calls.append(("generate", prompt_ids, sampling))
        return {"token_ids": [5, 6, 7], "text": "<think>\nx\n</think>\n\n#### 8", "finish_reason": "stop",
                "first_token_ts": 10.0, "last_token_ts": 10.02, "num_generation_tokens": 3}  # fmt: skip


def test_messages_use_system_prompt_and_template() -> None:
    assert build_messages(SPEC, "Q?") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Solve: Q? \\boxed{}"},
    ]


def test_items_are_generated_scored_and_done_ones_skipped() -> None:
    engine, out = ScriptedEngine(), []
    run_items(engine, SPEC, out.append, done={8})
    assert [e["item"]["index"] for e in out] == [9]
    rec = out[0]["item"]
    assert rec["raw_answer"] == "8" and not rec["raw_correct"]  # gold of item 9 is 9
    assert rec["decode_tok_s"] == pytest.approx(2 / 0.02)
    assert rec["prefix_cache_reset"] is True and rec["natural_stop"]
    kinds = [c[0] for c in engine.calls]
    assert kinds == ["chat", "reset", "generate"]
    assert engine.calls[0][2] == {"enable_thinking": True}
    assert engine.calls[2][2] == SPEC["sampling"]


def test_a_failed_prefix_cache_reset_stops_the_run() -> None:
    with pytest.raises(QualityRunError, match="item 8: reset_prefix_cache"):
        run_items(ScriptedEngine(reset_ok=False), SPEC, lambda e: None, done=set())


def test_every_item_runs_under_every_seed_frozen_seed_first_and_resume_skips_pairs() -> None:
    spec = {**SPEC, "seeds": [7, 100, 101]}
    engine, out = ScriptedEngine(), []
    run_items(engine, spec, out.append, done={8, "100:9"})  # bare index = the first (frozen) seed
    got = [(e["item"]["seed"], e["item"]["index"]) for e in out]
    assert got == [(7, 9), (100, 8), (101, 8), (101, 9)]
    seeds = [c[2]["seed"] for c in engine.calls if c[0] == "generate"]
    assert seeds == [7, 100, 101, 101]
    assert SPEC["sampling"]["seed"] == 7  # the spec itself is not changed
