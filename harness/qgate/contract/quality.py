"""The strict schema of a contract's `quality` section (the frozen GSM8K gate).

Example (contracts/quality-cpu.yaml):

    quality:
      dataset: gsm8k
      split: test
      first_index: 8            # 0-based, inclusive
      last_index: 23
      items_sha256: 695073ca...  # canonical form: qgate.gsm8k
      user_template: "{question}"
      chat_template_kwargs: {}
      sampling: {temperature: 1.0, top_p: 0.95, top_k: 20, seed: 20260828, max_tokens: 4096}
      seeds: [20260828, 1, 2]    # or `repeats: 3` (20260828, 20260829, 20260830); default: the one seed
      strict_formats: [hash, boxed, final_answer]
      gates: {min_raw_correct: 16, min_strict_correct: 16, alpha: 0.05}

Seeds: each arm runs every item under every seed. The first seed is always `sampling.seed` (the frozen
seed): the floors (min raw/strict correct) apply to that seed's run; the paired test and the health
checks use every output. See docs/quality.md.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from qgate.contract.base import TORCH_SEED_MAX, SamplingSeed, Strict

StrictFormat = Literal["hash", "boxed", "final_answer"]
# A `{name}` in a prompt text (a format field; literal braces such as JSON stay allowed): the workload
# fills in {question} (gsm8k.py) and nothing else, so any other field would reach the model as
# written; `{answer}` names the reference answer, which a prompt
# must never carry (the frozen gate would measure reading, not solving).
_FIELD = re.compile(r"\{\s*(\w[\w.\[\]]*)\s*(?:[!:][^{}]*)?\}")


def _only_the_question(text: str, allowed: tuple[str, ...] = ("question",)) -> None:
    filled = ["{" + a + "}" for a in allowed]
    for m in _FIELD.finditer(text):
        if m.group(0) not in filled:
            why = (
                " (the reference answer: a prompt that carries it gates nothing)" if "answer" in m[1] else ""
            )
            known = (
                f"the only field filled in is {', '.join(filled)}" if filled else "no field is filled in here"
            )
            raise ValueError(f"{m.group(0)}{why}: {known}; remove it")


class QualitySampling(Strict):
    """vllm.SamplingParams for every item; EOS is always natural (ignore_eos is never set)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(20, ge=-1, description="-1 or 0: off")
    seed: SamplingSeed = 20260828
    max_tokens: int = Field(4096, ge=1, le=10_000_000)
    skip_special_tokens: bool = True

    def vllm_kwargs(self) -> dict[str, Any]:
        return {**self.model_dump(), "ignore_eos": False}


class QualityGates(Strict):
    """Gates on the candidate's run: the floors count the frozen seed's run, the health limits hold for
    every output of every seed, the paired test judges correctness against the control."""

    min_raw_correct: int = Field(ge=0)
    min_strict_correct: int = Field(ge=0)
    all_natural_stops: bool = True
    all_closed_thinking: bool = True
    max_length_caps: int = Field(0, ge=0)
    max_invalid: int = Field(0, ge=0)
    max_fffd: int = Field(0, ge=0, description="U+FFFD characters over all outputs")
    repeated_window_below: int = Field(40, ge=1, description="every item's top 50-char window count < this")
    token_run_below: int = Field(64, ge=1, description="every item's longest same-token run < this")
    matched_misses: bool = Field(
        True,
        description="judge the candidate's correctness against the control: a one-sided exact sign test "
        "on the discordant item-seed pairs at `alpha` (FAIL / INCONCLUSIVE / pass), each candidate miss "
        "reported with both arms' per-item rates",
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level of the paired test")
    detect_broken_items: int = Field(
        2, ge=1, description="the regression the run must have the power to catch: this many items broken"
    )
    min_power: float = Field(
        0.8, gt=0, le=1, description="below this power (no regression seen) the verdict is INCONCLUSIVE"
    )


class Quality(Strict):
    dataset: Literal["gsm8k"] = "gsm8k"
    split: Literal["test"] = "test"
    first_index: int = Field(ge=0)
    last_index: int = Field(ge=0)
    items_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    data_path: str | None = Field(None, description="local JSONL; --data and QGATE_GSM8K_PATH win over it")
    system_prompt: str | None = None
    user_template: str = "{question}"
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    sampling: QualitySampling = Field(default_factory=QualitySampling)
    seeds: list[SamplingSeed] | None = Field(
        None,
        min_length=1,
        description="every item runs under every seed, in this order; the first must be sampling.seed "
        "(the frozen seed the floors apply to); default: [sampling.seed]",
    )
    repeats: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="instead of seeds: sampling.seed, sampling.seed + 1, ... (this many)",
    )
    strict_formats: list[StrictFormat] = Field(min_length=1)
    window_chars: int = Field(50, ge=1, le=1_000_000)
    reset_prefix_cache: bool = True
    gates: QualityGates

    @field_validator("user_template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("must contain {question}")
        _only_the_question(value)
        return value

    @field_validator("system_prompt")
    @classmethod
    def _no_fields(cls, value: str | None) -> str | None:
        if value is not None:
            _only_the_question(value, allowed=())
        return value

    @model_validator(mode="after")
    def _counts_fit(self) -> Quality:
        if self.last_index < self.first_index:
            raise ValueError(f"last_index {self.last_index} is below first_index {self.first_index}")
        if self.seeds is not None and self.repeats is not None:
            raise ValueError("give seeds or repeats, not both")
        if self.seeds is not None:
            if self.seeds[0] != self.sampling.seed:
                raise ValueError(
                    f"seeds[0] = {self.seeds[0]} must be sampling.seed = {self.sampling.seed} "
                    "(the frozen seed)"
                )
            dup = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
            if dup:
                raise ValueError(f"seeds repeat {dup}: each seed once")
        if self.repeats is not None and self.sampling.seed + self.repeats - 1 > TORCH_SEED_MAX:
            raise ValueError(
                f"repeats = {self.repeats} from sampling.seed = {self.sampling.seed} runs past the largest "
                f"seed vLLM's sampler takes ({TORCH_SEED_MAX}); expected a smaller sampling.seed"
            )
        n = self.n_items
        for key in ("min_raw_correct", "min_strict_correct", "detect_broken_items"):
            if getattr(self.gates, key) > n:
                raise ValueError(f"gates.{key} = {getattr(self.gates, key)} exceeds the {n} selected items")
        return self

    @property
    def indices(self) -> list[int]:
        return list(range(self.first_index, self.last_index + 1))

    @property
    def n_items(self) -> int:
        return self.last_index - self.first_index + 1

    @property
    def run_seeds(self) -> list[int]:
        """The seeds every item runs under, the frozen seed (sampling.seed) first."""
        if self.seeds is not None:
            return list(self.seeds)
        return [self.sampling.seed + k for k in range(self.repeats or 1)]
