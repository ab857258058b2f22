"""`kind: quality`: one arm's quality result (qgate.quality.run; checked by qgate.quality.record).

Format history:
  1: first version.
  2: repeated seeds (item records carry `seed`), per-item rates.
  3: run_id in the header and every item (an item grafted from another run is refused).

A stored reference result may be hand-written and hold only what the comparison reads, so an item's
keys beyond its index are optional; unknown keys are kept (extra="allow") at every level.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qgate.records.arm import ArmHeader
from qgate.records.base import Open, Record


class QualityItem(Open):
    """One item under one seed (qgate.quality.workload.run_item + qgate.quality.scoring)."""

    index: int = Field(ge=0)
    seed: int | None = None
    run_id: str | None = None
    gold: str | None = None
    output: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    output_tokens: int | None = Field(None, ge=0)
    finish_reason: str | None = None
    decode_s: float | None = None
    decode_tok_s: float | None = None
    raw_answer: str | None = None
    raw_correct: bool | None = None
    strict_answer: str | None = None
    strict_correct: bool | None = None
    natural_stop: bool | None = None
    length_cap: bool | None = None
    closed_thinking: bool | None = None
    invalid: bool | None = None
    fffd_count: int | None = Field(None, ge=0)
    longest_token_run: int | None = Field(None, ge=0)
    max_window_repeats: int | None = Field(None, ge=0)
    prefix_cache_reset: bool | None = None


class Quality(ArmHeader, Record):
    model_config = Record.model_config | {"extra": "allow"}

    kind: Literal["quality"]
    schema_version: Literal[1, 2, 3]
    items: list[QualityItem]
    dataset: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None  # the contract's quality section as the run saw it
    seeds: list[int] | None = None
    summary: dict[str, Any] | None = None  # qgate.quality.gates.summarize
