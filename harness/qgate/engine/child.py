"""The engine child: the one process of the harness that imports vLLM.

Started by the launcher as `python -m qgate.engine.child SPEC_JSON EVENTS_FD` with the arm's environment,
so the env reaches vLLM's engine-core and worker processes, which inherit it. It owns one vllm.LLM
(one engine start), hands the workload the spec names (`runner`: an import path, so the engine imports
no workload) a small adapter, and reports records as JSON lines on a private pipe (vLLM's own logging
goes to stdout/stderr, which the launcher saves to a log file).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

from qgate.engine import lifeline

if __name__ == "__mp_main__":
    # A process vLLM started with multiprocessing's spawn method re-imports this, the parent's main
    # module, before anything else: it dies with its parent from here on (see lifeline.py).
    lifeline.arm()

from qgate.engine.fingerprint import fingerprint  # noqa: E402 (after arming: as early as possible)

# Prompt logprobs asked per position when scoring: enough that the best token decoding could pick is
# among them when the model's own top is a stop token it could not (min_tokens).
SCORE_TOP = 5


class VllmEngine:
    """The adapter a workload sees: plain lists and dicts in and out, no vLLM types."""

    def __init__(self, llm: Any) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._llm = llm
        self._sampling_cls = SamplingParams
        self._prompt_cls = TokensPrompt
        self._tokenizer = llm.get_tokenizer()

    @property
    def vocab_size(self) -> int:
        return int(self._llm.llm_engine.model_config.get_vocab_size())

    @property
    def special_token_ids(self) -> list[int]:
        return sorted({int(i) for i in getattr(self._tokenizer, "all_special_ids", [])})

    def reset_prefix_cache(self) -> bool:
        # vLLM returns False when it could not reset (e.g. blocks still in use): callers must fail on it.
        return bool(self._llm.reset_prefix_cache())

    def chat_prompt_ids(self, messages: list[dict], chat_template_kwargs: dict) -> list[int]:
        ids = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **chat_template_kwargs
        )
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids)

    def generate(self, prompt_token_ids: list[int], sampling: dict) -> dict:
        params = self._sampling_cls(**sampling)
        prompt = self._prompt_cls(prompt_token_ids=list(prompt_token_ids))
        (out,) = self._llm.generate([prompt], params, use_tqdm=False)
        completion = out.outputs[0]
        m = out.metrics
        if m is None:
            raise RuntimeError("vLLM returned no request metrics (disable_log_stats must be False)")
        return {
            "token_ids": [int(t) for t in completion.token_ids],
            **top_logprobs(completion.logprobs, int(sampling.get("logprobs") or 0)),
            "text": completion.text,
            "finish_reason": completion.finish_reason,
            "num_generation_tokens": int(m.num_generation_tokens),
            "first_token_ts": float(m.first_token_ts),
            "last_token_ts": float(m.last_token_ts),
            "first_token_latency_s": float(m.first_token_latency),
            "scheduled_ts": float(m.scheduled_ts),
            "num_prompt_tokens": len(out.prompt_token_ids or prompt_token_ids),
        }

    def score(
        self, token_ids: list[int], start: int, exclude: list[int] | None = None
    ) -> list[tuple[int, float, float]]:
        """Teacher forcing: this engine's model reads token_ids in one prefill (vLLM prompt logprobs)
        and, for every position from `start` on, says (its top token, that token's logprob, the logprob
        of the token that stands there). `exclude`: tokens decoding could not pick (a stop token under
        min_tokens / ignore_eos): the top is the best of the others, from the SCORE_TOP best. Nothing is
        decoded (max_tokens 1, greedy)."""
        banned = set(exclude or ())
        params = self._sampling_cls(
            max_tokens=1, temperature=0.0, prompt_logprobs=SCORE_TOP, detokenize=False
        )
        prompt = self._prompt_cls(prompt_token_ids=list(token_ids))
        (out,) = self._llm.generate([prompt], params, use_tqdm=False)
        rows = out.prompt_logprobs
        if rows is None or len(rows) != len(token_ids):
            raise RuntimeError(
                f"vLLM returned {0 if rows is None else len(rows)} prompt logprobs, not {len(token_ids)}"
            )
        scored = []
        for pos in range(max(1, start), len(token_ids)):
            row = rows[pos] or {}
            have = row.get(token_ids[pos])
            ranked = sorted((lp.rank, t) for t, lp in row.items() if lp.rank is not None and t not in banned)
            if have is None or not ranked:
                raise RuntimeError(f"prompt logprobs at position {pos} lack the token or an allowed top one")
            top = ranked[0][1]
            scored.append((int(top), float(row[top].logprob), float(have.logprob)))
        return scored


def top_logprobs(rows: Any, k: int) -> dict[str, list[list[Any]]]:
    """The top-k next-token logprobs at every decoded position, as vLLM's sampler computed them from the
    model's logits (raw logprobs: before min_tokens bans the stop tokens), by rank: {"top_ids": [[k
    ids]], "top_logprobs": [[k floats]]}, one row per generated token; {} when none were asked. vLLM adds
    the sampled token to a row when it is not among the top k: it is left out here (rank > k)."""
    if k <= 0:
        return {}
    if rows is None:
        raise RuntimeError(f"vLLM returned no logprobs though {k} were asked")
    ids, lps = [], []
    for row in rows:
        ranked = sorted((lp.rank, int(t), float(lp.logprob)) for t, lp in (row or {}).items() if lp.rank)
        ranked = [r for r in ranked if r[0] <= k][:k]
        if len(ranked) < k:
            raise RuntimeError(f"vLLM returned {len(ranked)} ranked logprobs at a position, not {k}")
        ids.append([t for _, t, _ in ranked])
        lps.append([round(lp, 5) for _, _, lp in ranked])
    return {"top_ids": ids, "top_logprobs": lps}


def runner(path: str) -> Any:
    """The workload function an import path names (`package.module:function`), imported here."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(f"runner {path!r}: expected package.module:function")
    found = getattr(importlib.import_module(module), name, None)
    if not callable(found):
        raise ValueError(f"runner {path!r}: {module} has no function {name}")
    return found


def _run(spec: dict, emit: Any) -> None:
    run = runner(spec["runner"])  # a bad name fails before the engine's minute of start-up
    t0 = time.perf_counter()
    from vllm import LLM

    llm = LLM(model=spec["model_path"], disable_log_stats=False, **spec["engine_args"])
    engine = VllmEngine(llm)
    emit({"event": "engine_ready", "engine_start_s": time.perf_counter() - t0, "fingerprint": fingerprint()})
    run(engine, spec, emit)


def main() -> int:
    lifeline.arm()  # die with qgate; vLLM's processes arm themselves in turn
    spec_path, events_fd = sys.argv[1], int(sys.argv[2])
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    events = os.fdopen(events_fd, "w", buffering=1, encoding="utf-8")

    def emit(record: dict) -> None:
        events.write(json.dumps(record) + "\n")
        events.flush()

    try:
        _run(spec, emit)
    except Exception as exc:  # reported to the launcher as one line; the full trace goes to the log
        traceback.print_exc()
        emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"event": "done"})
    events.close()
    return 0


def exit_without_finalizing(code: int) -> None:
    """Exit after the cleanup a normal exit runs, without the interpreter's teardown of its modules.

    atexit runs vLLM's engine shutdown (in the multi-process engine it waits for the engine core, whose
    own exit writes the route counters of the layers it ran), the plugin's last counter write and
    logging's flush; what is skipped is freeing thousands of modules one by one, about 1.5 s of the
    2.8 s an in-process engine child took after its last record (2 cores). With a non-daemon thread
    still running a normal exit would wait for it, so then the exit is the normal one.
    """
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(main())
