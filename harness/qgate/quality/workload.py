"""The in-engine item loop of the quality gate: chat prompt, sampling as the contract says, score, emit.

Runs inside the engine child (qgate.engine.child hands it the `engine` adapter); it never imports vLLM.
The spec (built by qgate.quality.run.item_spec) carries everything the loop needs:

    items: [{index, question, gold}], user_template ("... {question} ..."), system_prompt (str | None),
    chat_template_kwargs (dict), sampling (vllm.SamplingParams kwargs: temperature, top_p, top_k, seed,
    max_tokens, ignore_eos False, skip_special_tokens), strict_formats ([hash|boxed|final_answer]),
    window_chars (int), reset_prefix_cache (bool), seeds ([int], the frozen seed first; default
    [sampling.seed])

Every item runs under every seed, seed by seed (the frozen seed's run first), each record carrying its
`seed`. Each output is independent of the others (a per-request seed, the prefix cache reset before
it), so a resumed run gives the same records as an uninterrupted one. `done` holds what is already
recorded: "seed:index" strings (or bare indices, meaning the first seed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qgate.errors import RunFailure
from qgate.gsm8k import build_messages
from qgate.quality.scoring import prompt_closes_thinking, score_output
from qgate.results import ids_sha256


class QualityRunError(RunFailure, RuntimeError):
    """The engine did not do what the contract asks (e.g. the prefix cache would not reset)."""


def decode_tok_s(n_tokens: int, first_ts: float, last_ts: float) -> float | None:
    """Pure decode rate from the engine's own timestamps: (n - 1) tokens after the first one."""
    if n_tokens < 2 or last_ts <= first_ts:
        return None
    return (n_tokens - 1) / (last_ts - first_ts)


def run_item(
    engine: Any, spec: dict[str, Any], item: dict[str, Any], seed: int | None = None
) -> dict[str, Any]:
    """Generate and score one item under `seed` (default: the spec's sampling seed); returns its record."""
    sampling = dict(spec["sampling"])
    if seed is not None:
        sampling["seed"] = seed
    messages = build_messages(spec, item["question"])
    kwargs = dict(spec.get("chat_template_kwargs") or {})
    prompt_ids = engine.chat_prompt_ids(messages, kwargs)
    prompt_text = engine.decode(prompt_ids) if hasattr(engine, "decode") else None
    reset = None
    if spec.get("reset_prefix_cache", True):
        reset = bool(engine.reset_prefix_cache())
        if not reset:
            raise QualityRunError(f"item {item['index']}: reset_prefix_cache() returned False")
    out = engine.generate(prompt_ids, sampling)
    closed_in_prompt = prompt_closes_thinking(prompt_text or "")
    scores = score_output(
        out["text"],
        out["token_ids"],
        out["finish_reason"],
        item["gold"],
        list(spec["strict_formats"]),
        closed_in_prompt=closed_in_prompt,
        window=int(spec.get("window_chars", 50)),
    )
    n = len(out["token_ids"])
    return {
        "index": item["index"],
        "seed": sampling.get("seed"),
        "gold": item["gold"],
        "messages": messages,
        "prompt": prompt_text,
        "prompt_token_ids": prompt_ids,
        "prompt_sha256": ids_sha256(prompt_ids),
        "thinking_closed_in_prompt": closed_in_prompt,
        "output": out["text"],
        "token_ids": out["token_ids"],
        "token_ids_sha256": ids_sha256(out["token_ids"]),
        "output_tokens": n,
        "finish_reason": out["finish_reason"],
        "first_token_ts": out["first_token_ts"],
        "last_token_ts": out["last_token_ts"],
        "decode_s": max(0.0, out["last_token_ts"] - out["first_token_ts"]),
        "decode_tok_s": decode_tok_s(n, out["first_token_ts"], out["last_token_ts"]),
        "prefix_cache_reset": reset,
        **scores,
    }


def seeds_of(spec: dict[str, Any]) -> list[int]:
    """The seeds to run, the frozen seed first."""
    return [int(s) for s in spec.get("seeds") or [spec["sampling"]["seed"]]]


def done_key(seed: int, index: int) -> str:
    return f"{seed}:{index}"


def _done_keys(done: set[Any] | list[Any], first_seed: int) -> set[str]:
    return {d if isinstance(d, str) else done_key(first_seed, int(d)) for d in done}


def run_items(
    engine: Any, spec: dict[str, Any], emit: Callable[[dict[str, Any]], None], done: set[Any]
) -> None:
    """Run every item under every seed not in `done`, emitting {"event": "item", "item": ...}."""
    seeds = seeds_of(spec)
    skip = _done_keys(done, seeds[0])
    for seed in seeds:
        for item in spec["items"]:
            if done_key(seed, item["index"]) in skip:
                continue
            emit({"event": "item", "item": run_item(engine, spec, item, seed)})


def run(engine: Any, spec: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
    """The engine child's entry point (the spec's `runner`): every pair not in the spec's `done`."""
    run_items(engine, spec, emit, set(spec.get("done", [])))
