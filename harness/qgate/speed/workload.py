"""The speed workload: warmup, timed reps after a prefix-cache reset, each on a prompt of its own.

Runs inside the engine child against the adapter (qgate.engine.child.VllmEngine); it never imports vLLM.
Pure decode rate = (n - 1) / (last_token_ts - first_token_ts), both taken from the engine's own
timestamps, so the harness's own work (Python, IPC, detokenising) is not in the figure.

Nothing repeats (MLPerf's TEST04): rep i decodes the prompt drawn from (run seed, i), warm-up w of
launch L the one drawn from (run seed, L, w); both arms draw the same sequence, no prompt comes twice in
a run, so a result cache keyed by the input finds nothing to return. Each rep records its prompt's hash
(`prompt_sha256`); qgate.speed.gates.prompts_gate refuses a comparison where a prompt repeats or the
arms' sequences differ. The run seed is drawn when the run starts unless the contract pins one
(qgate.speed.run.run_seed).
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
    def score(
        self, token_ids: list[int], start: int, exclude: list[int] | None = None
    ) -> list[tuple[int, float, float]]: ...


def prompt_pool(vocab_size: int, exclude: list[int]) -> list[int]:
    """The token ids prompts are drawn from: the vocabulary without special tokens."""
    banned = set(exclude)
    pool = [i for i in range(vocab_size) if i not in banned]
    if not pool:
        raise SpeedError("the vocabulary has no ordinary tokens to build a prompt from")
    return pool


def synthetic_prompt(vocab_size: int, n_tokens: int, seed: int | str, exclude: list[int]) -> list[int]:
    """Exactly n_tokens ids drawn from the vocabulary without special tokens; same seed, same ids."""
    return draw(prompt_pool(vocab_size, exclude), n_tokens, seed)


def draw(pool: list[int], n_tokens: int, seed: int | str) -> list[int]:
    # random.Random seeds a str through SHA-512 (version 2): the same ids on every platform and Python.
    rng = random.Random(seed)
    return [pool[rng.randrange(len(pool))] for _ in range(n_tokens)]


def rep_seed(run_seed: int, index: int) -> str:
    """The seed of timed rep `index`'s prompt (the same in both arms: the reps' index is the pairing)."""
    return f"qgate-speed-rep:{run_seed}:{index}"


def warmup_seed(run_seed: int, launch: int, index: int) -> str:
    """The seed of a warm-up's prompt: its own, never a timed rep's."""
    return f"qgate-speed-warmup:{run_seed}:{launch}:{index}"


def plan_sha256(pool: list[int], n_tokens: int, run_seed: int) -> str:
    """What every launch of both arms must agree on (the result's `prompt.sha256`): the ids prompts are
    drawn from, their length and the run seed; each rep's own prompt hash is its `prompt_sha256`."""
    return ids_sha256([len(pool), *pool, -1, n_tokens, -1, run_seed])


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
    if spec.get("audit_top_k"):  # the distribution audit's top-k at every position (qgate.speed.dist_audit)
        params["logprobs"] = spec["audit_top_k"]
    return params


def rep_record(
    out: dict, wall_s: float, index: int, launch: int, reset: bool | None, prompt_sha256: str | None = None
) -> dict[str, Any]:
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
        **{key: out[key] for key in ("top_ids", "top_logprobs") if key in out},
        "prompt_sha256": prompt_sha256,
        "finish_reason": out["finish_reason"],
        "prefix_cache_reset": reset,
        "started_at": utc_now(),
    }


def _one(engine: Engine, prompt: list[int], spec: dict) -> tuple[dict, float, bool | None, float]:
    reset = None
    # The prefix-cache reset is asserted here, before every warmup and rep: a refused reset fails the run.
    if spec["reset_prefix_cache"]:
        reset = engine.reset_prefix_cache()
        if not reset:
            raise SpeedError("reset_prefix_cache() returned False: the prefix cache was not reset")
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate(prompt, sampling_params(spec))
    # This process's CPU seconds over the rep (every thread): the work an in-process engine did, which
    # other processes' load does not stretch as it stretches the wall clock (qgate.speed.repetition).
    return out, time.perf_counter() - t0, reset, time.process_time() - c0


def run_reps(engine: Engine, spec: dict, emit: Callable[[dict], None]) -> None:
    """Warmup reps, then the reps not yet done, each on its own prompt; emit every record as soon as it
    exists. The prompt is drawn before the rep's reset and generate(), outside its timing."""
    pool = prompt_pool(engine.vocab_size, engine.special_token_ids)
    n, seed, launch = spec["input_tokens"], spec["prompt_seed"], spec["launch"]
    emit({"event": "prompt", "input_tokens": n, "sha256": plan_sha256(pool, n, seed)})
    for w in range(spec["warmup"]):
        prompt = draw(pool, n, warmup_seed(seed, launch, w))
        out, wall_s, _, _ = _one(engine, prompt, spec)
        emit(
            {
                "event": "warmup",
                "index": w,
                "launch": launch,
                "wall_s": wall_s,
                "prompt_sha256": ids_sha256(prompt),
            }
        )
    for index in spec["rep_indices"]:
        prompt = draw(pool, n, rep_seed(seed, index))
        out, wall_s, reset, cpu_s = _one(engine, prompt, spec)
        rep = {**rep_record(out, wall_s, index, launch, reset, ids_sha256(prompt)), "cpu_s": cpu_s}
        emit({"event": "rep", "rep": rep})
    # TEST04: the launch's first rep again, timed alike (qgate.speed.repetition), after the timed reps.
    for r in range(spec.get("repeat_reps") or 0):
        if not spec["rep_indices"]:
            break
        index = spec["rep_indices"][0]
        prompt = draw(pool, n, rep_seed(seed, index))
        out, wall_s, reset, cpu_s = _one(engine, prompt, spec)
        again = {**rep_record(out, wall_s, index, launch, reset, ids_sha256(prompt)), "cpu_s": cpu_s}
        emit({"event": "repeat", "repeat": {**again, "repeat": r}})
    # After the timed reps, never between them: the audit's scoring is on no clock.
    for item in spec.get("audit") or []:
        emit({"event": "audit", "audit": audit_rep(engine, pool, spec, item)})


def audit_rep(engine: Engine, pool: list[int], spec: dict, item: dict) -> dict[str, Any]:
    """Score another arm's output of one rep with this engine's model (qgate.speed.audit): the rep's
    prompt drawn again (its hash must be the one the rep recorded), then teacher forcing over prompt +
    output from the first position where the output left this arm's own greedy tokens."""
    prompt = draw(pool, spec["input_tokens"], rep_seed(spec["prompt_seed"], item["index"]))
    if ids_sha256(prompt) != item["prompt_sha256"]:
        raise SpeedError(f"audit of rep {item['index']}: its prompt does not draw again from the run seed")
    tokens, start = list(item["token_ids"]), int(item["from"])
    if spec["reset_prefix_cache"] and not engine.reset_prefix_cache():
        raise SpeedError("reset_prefix_cache() returned False before an audit")
    t0 = time.perf_counter()
    # With ignore_eos the timed decode ran under min_tokens = output_tokens, which bans the stop tokens:
    # the control's top among the tokens decoding could pick (the special ones left out) is the measure.
    exclude = engine.special_token_ids if spec["ignore_eos"] else []
    scored = engine.score(prompt + tokens, len(prompt) + start, exclude)
    return {
        "index": item["index"],
        "arm": item.get("arm", "candidate"),  # whose tokens: the candidate's, or the control's own (baseline)
        "prompt_sha256": item["prompt_sha256"],
        "token_ids_sha256": ids_sha256(tokens),
        "from": start,
        "top_ids": [top for top, _, _ in scored],
        "margins": [top_lp - lp for _, top_lp, lp in scored],
        "seconds": time.perf_counter() - t0,
    }
