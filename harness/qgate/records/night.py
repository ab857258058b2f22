"""One night's row of the history store (qgate.night.collect -> qgate.history): a record without a file
of its own, so no `kind`; its version is the store's (qgate.history.schema.HISTORY_SCHEMA_VERSION, whose
format history is there). The fields are night.COLUMNS in order, typed as the store's SQL types (TEXT:
str, INTEGER: int, REAL: float; NOT NULL: required); tests/test_records.py holds the two equal.
JSON-valued columns (decode_tok_s_reps, verdicts, fingerprint, quality_item_rates, decode_launch_ids)
are JSON text, as stored."""

from __future__ import annotations

from qgate.records.base import Part


class NightRow(Part):
    night: str
    arm: str
    commit_sha: str
    appended_at: str
    source: str | None = None
    speed_contract: str | None = None
    speed_contract_sha256: str | None = None
    quality_contract: str | None = None
    quality_contract_sha256: str | None = None
    decode_reps: int | None = None
    decode_tok_s_mean: float | None = None
    decode_tok_s_min: float | None = None
    decode_tok_s_reps: str | None = None
    tpot_ms_mean: float | None = None
    ttft_ms_median: float | None = None
    speed_complete: int | None = None
    gate_min_decode_tok_s: float | None = None
    quality_selected: int | None = None
    quality_scored: int | None = None
    raw_correct: int | None = None
    strict_correct: int | None = None
    raw_accuracy: float | None = None
    strict_accuracy: float | None = None
    natural_stops: int | None = None
    closed_thinking: int | None = None
    length_caps: int | None = None
    invalid_outputs: int | None = None
    fffd_chars: int | None = None
    max_token_run: int | None = None
    max_window_repeats: int | None = None
    quality_complete: int | None = None
    gate_min_raw_correct: int | None = None
    gate_min_strict_correct: int | None = None
    verdict: str | None = None
    verdicts: str | None = None
    fingerprint: str | None = None
    content_sha256: str
    quality_seeds: int | None = None
    quality_outputs: int | None = None
    quality_item_rates: str | None = None
    decode_launch_ids: str | None = None
    prompt_seed: int | None = None
    prompt_seed_pinned: int | None = None
