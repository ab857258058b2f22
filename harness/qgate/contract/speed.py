"""The contract's `speed:` section: the decode workload of one arm launch and the speed gates."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from qgate.contract.base import NonNegativeSeed, Strict


class SpeedGates(Strict):
    min_decode_tok_s: float | None = Field(
        None,
        ge=0,
        description="the candidate's mean decode rate >= this (one-sided bound; low reps reported)",
    )
    max_prefill_regression_pct: float | None = Field(None, ge=0)
    identical_tokens: bool = Field(
        True,
        description="the candidate's timed output must be the control's tokens, or tokens the control's "
        "model finds plausible where they differ (the audit, docs/speed-audit.md): beyond its calibrated "
        "count of implausible tokens the speed gate FAILs; false: the audit is reported, never failing",
    )
    min_decode_improvement_pct: float | None = Field(None, ge=0)
    max_decode_regression_pct: float = Field(
        gt=0,
        lt=100,
        description="required non-inferiority margin: passes only when the Welch-t lower bound (one-sided "
        "alpha/2) of the decode ratio (candidate/control) is >= 1 - margin/100, i.e. the data rule out a "
        "larger slowdown; not ruled out is INCONCLUSIVE (FAIL when the whole interval is below)",
    )


class SpeedStats(Strict):
    alpha: float = Field(0.05, gt=0, lt=1)
    min_effect_pct: float = Field(2.0, ge=0, description="practical floor for improved/regressed")
    max_cv_pct: float = Field(10.0, gt=0, description="above this CV an arm is inconclusive")
    bootstrap_resamples: int = Field(10000, ge=100, le=10_000_000)
    seed: NonNegativeSeed = Field(20260828, description="the bootstrap's numpy generator")


class Speed(Strict):
    input_tokens: int = Field(ge=1, le=10_000_000)
    output_tokens: int = Field(
        ge=2, le=10_000_000, description="at least 2: the decode rate is (n - 1) / decode time"
    )
    greedy: bool = True
    ignore_eos: bool = True
    warmup: int = Field(1, ge=0, le=1000)
    repetitions: int = Field(5, ge=1, le=10_000)
    reset_prefix_cache: bool = True
    launches: int = Field(
        1,
        ge=1,
        le=100,  # as --max-launches: planning the looks of 1,000 launches took minutes
        description="engine starts per arm, interleaved; a PASS or FAIL on the decode ratio needs >= 2 "
        "(or `qgate compare --history`)",
    )
    prompt_seed: NonNegativeSeed | None = Field(
        None,
        description="the seed every rep's prompt is drawn from (rep i: its own prompt, the same in both "
        "arms); unset: a fresh seed is drawn when the run starts (recorded in the results and the "
        "history), so no candidate can be tuned to a published one; set: pinned, and reported as pinned",
    )
    audit_top_k: int | None = Field(
        None,
        ge=2,
        le=20,
        description="every timed rep also returns its top-k next-token logprobs at every position (vLLM "
        "`logprobs`; both arms pay it alike): the distribution audit holds the candidate's against the "
        "control's where both decoded the same prefix (docs/speed-audit.md); unset: not recorded, and "
        "the verdict says the timed output's distributions were not audited",
    )
    repeat_reps: int | None = Field(
        None,
        ge=1,
        le=100,
        description="MLPerf TEST04: after its timed reps each launch decodes its first rep's prompt again "
        "this many times (the same route inputs at every step), timed alike; the repetition gate FAILs a "
        "candidate that gains from repeated inputs (a result cache) beyond what the control does "
        "(docs/speed-audit.md); unset: not run",
    )
    gates: SpeedGates
    stats: SpeedStats = Field(default_factory=SpeedStats)

    def workload(self) -> dict[str, Any]:
        """What an arm's result records under `workload` (WORKLOAD_KEYS, from this schema)."""
        return {key: getattr(self, key) for key in WORKLOAD_KEYS}

    def prompt(self, seed: int | None = None) -> dict[str, Any]:
        """What an arm's result records under `prompt` (its sha256 comes from the child): the run's seed
        (the contract's when pinned, else `seed`, drawn when the run started) and whether it was pinned."""
        out = {PROMPT_KEYS[key]: getattr(self, key) for key in PROMPT_KEYS}
        out["seed_pinned"] = self.prompt_seed is not None
        if self.prompt_seed is None:
            out["seed"] = seed
        return out


# The section's keys by role, derived from the schema: the prompt's (field -> its key in a result's
# `prompt`), the judging ones (not part of what ran), and the workload of every launch: the rest.
PROMPT_KEYS = {"input_tokens": "input_tokens", "prompt_seed": "seed"}
JUDGING_KEYS = ("gates", "stats")
WORKLOAD_KEYS = tuple(k for k in Speed.model_fields if k not in PROMPT_KEYS and k not in JUDGING_KEYS)
