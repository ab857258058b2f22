"""`kind: speed`: one arm's speed result (qgate.speed.run; checked by qgate.speed.record).

Format history:
  1 (2026-11-29): first version; reps carry engine timestamps and token ids.
  2 (2026-12-04): `run_id` (one per result file: an arm of one run) in the header and in every rep, so
                  a rep copied in from another run's file is told apart (qgate.speed.record).
  3 (2026-12-04): every rep on its own prompt (rep `prompt_sha256`), `warmups` (their prompts),
                  `prompt.seed` the run's (drawn unless pinned: `prompt.seed_pinned`), `prompt.sha256`
                  the prompt plan's; `audit` in the control's result (qgate.speed.audit). Versions 1
                  and 2 are still read, so that compare can say why it refuses one (one prompt in
                  every rep).

Unknown keys are kept at every level (extra="allow"): reps gain keys while the speed audit grows
(per-rep top-k logprobs), and a key added to a rep must not make every earlier result unreadable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qgate.records.arm import ArmHeader
from qgate.records.base import HEX64, Open, Record


class SpeedPrompt(Open):
    input_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    seed_pinned: bool | None = None
    sha256: str | None = None  # the prompt plan's sha256 (qgate.speed.record checks it where reps are)


class SpeedWorkload(Open):
    repetitions: int = Field(ge=1)
    launches: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    warmup: int = Field(0, ge=0)
    greedy: bool | None = None
    ignore_eos: bool | None = None
    reset_prefix_cache: bool | None = None


class SpeedRep(Open):
    """One measured rep (qgate.speed.workload.rep_record); its figures are one measurement."""

    index: int = Field(ge=0)
    launch: int = Field(ge=0)
    decode_tok_s: float
    tpot_ms: float
    ttft_ms: float
    prefill_ms: float | None = None
    wall_s: float | None = None
    engine_s: float | None = None
    harness_overhead_s: float | None = None
    harness_overhead_pct: float | None = None
    output_tokens: int = Field(ge=0)
    token_ids: list[int]
    token_ids_sha256: str = Field(pattern=HEX64)
    prompt_sha256: str | None = None
    finish_reason: Literal["length", "stop"]
    prefix_cache_reset: bool | None = None
    started_at: str
    run_id: str | None = None


class Warmup(Open):
    index: int = Field(ge=0)
    launch: int = Field(ge=0)
    prompt_sha256: str | None = None


class LaunchOrder(Open):
    """The order of the arms' engine starts (qgate.engine.order)."""

    scheme: str
    seed: int
    first: list[str]
    schema_version: int | None = None


class Speed(ArmHeader, Record):
    model_config = Record.model_config | {"extra": "allow"}

    kind: Literal["speed"]
    schema_version: Literal[1, 2, 3]
    prompt: SpeedPrompt
    workload: SpeedWorkload
    reps: list[SpeedRep]
    warmups: list[Warmup] | None = None
    launch_order: LaunchOrder | None = None
    sequential: dict[str, Any] | None = None  # qgate.speed.sequential's looks (checked by speed.record)
    audit: dict[str, Any] | None = None  # the control's audit engine start (qgate.speed.audit)
