"""The speed workload: a deterministic prompt, warmup, timed reps after a prefix-cache reset.

Runs inside the engine child against the adapter (qgate.engine.child.VllmEngine); it never imports vLLM.
Pure decode rate = (n - 1) / (last_token_ts - first_token_ts), both taken from the engine's own
timestamps, so the harness's own work (Python, IPC, detokenising) is not in the figure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from qgate.errors import RunFailure
from qgate.results import ids_sha256, utc_now


class SpeedError(RunFailure, RuntimeError):
    """A rep that cannot be measured honestly (reset refused, missing timestamps)."""


class Engine(Protocol):
    vocab_size: int
    special_token_ids: list[int]

    def reset_prefix_cache(self) -> bool: ...
    def generate(self, prompt_token_ids: list[int], sampling: dict) -> dict: ...


def synthetic_prompt(vocab_size: int, n_tokens: int, seed: int, exclude: list[int]) -> list[int]:
    """Exactly n_tokens ids drawn from the vocabulary without special tokens; same seed, same ids."""
    banned = set(exclude)
    pool = [i for i in range(vocab_size) if i not in banned]
    if not pool:
        raise SpeedError("the vocabulary has no ordinary tokens to build a prompt from")
    rng = random.Random(seed)
    return [pool[rng.randrange(len(pool))] for _ in range(n_tokens)]


def sampling_params(spec: dict) -> dict[str, Any]:
    """vLLM SamplingParams kwargs of the speed gate: exact output length, greedy unless told otherwise."""
    params: dict[str, Any] = {
        "max_tokens": spec["output_tokens"],
        "min_tokens": spec["output_tokens"] if spec["ignore_eos"] else 0,
        "ignore_eos": spec["ignore_eos"],
        "detokenize": False,
    }
    if spec["greedy"]:
        params["temperature"] = 0.0
    return params


def rep_record(out: dict, wall_s: float, index: int, launch: int, reset: bool | None) -> dict[str, Any]:
    """One measured rep from one generate() result and the wall time around it."""
    n = out["num_generation_tokens"]
    decode_s = out["last_token_ts"] - out["first_token_ts"]
    if n < 2 or decode_s <= 0:
        raise SpeedError(f"rep {index}: cannot compute decode rate (tokens={n}, decode_s={decode_s:.6f})")
    decode_tok_s = (n - 1) / decode_s
    # Engine time on one clock (engine-core monotonic): from scheduling to the last token. The rest of
    # the wall time around generate() is the harness's and vLLM front end's overhead.
    engine_s = out["last_token_ts"] - out["scheduled_ts"]
    overhead_s = wall_s - engine_s
    return {
        "index": index,
        "launch": launch,
        "decode_tok_s": decode_tok_s,
        "tpot_ms": 1000.0 / decode_tok_s,
        "ttft_ms": out["first_token_latency_s"] * 1000.0,
        "prefill_ms": (out["first_token_ts"] - out["scheduled_ts"]) * 1000.0,
        "wall_s": wall_s,
        "engine_s": engine_s,
        "harness_overhead_s": overhead_s,
        "harness_overhead_pct": 100.0 * overhead_s / wall_s,
        "output_tokens": n,
        "token_ids": out["token_ids"],
        "token_ids_sha256": ids_sha256(out["token_ids"]),
        "finish_reason": out["finish_reason"],
        "prefix_cache_reset": reset,
        "started_at": utc_now(),
    }


def _one(engine: Engine, prompt: list[int], spec: dict) -> tuple[dict, float, bool | None]:
    reset = None
    # The prefix-cache reset is asserted here, before every warmup and rep: a refused reset fails the run.
    if spec["reset_prefix_cache"]:
        reset = engine.reset_prefix_cache()
        if not reset:
            raise SpeedError("reset_prefix_cache() returned False: the prefix cache was not reset")
    t0 = time.perf_counter()
    out = engine.generate(prompt, sampling_params(spec))
    return out, time.perf_counter() - t0, reset


def run_reps(engine: Engine, spec: dict, emit: Callable[[dict], None]) -> None:
    """Warmup reps, then the reps not yet done; emit every record as soon as it exists."""
    prompt = synthetic_prompt(
        engine.vocab_size, spec["input_tokens"], spec["prompt_seed"], engine.special_token_ids
    )
    emit({"event": "prompt", "input_tokens": len(prompt), "sha256": ids_sha256(prompt)})
    for w in range(spec["warmup"]):
        out, wall_s, _ = _one(engine, prompt, spec)
        emit({"event": "warmup", "index": w, "wall_s": wall_s})
    for index in spec["rep_indices"]:
        out, wall_s, reset = _one(engine, prompt, spec)
        emit({"event": "rep", "rep": rep_record(out, wall_s, index, spec["launch"], reset)})
