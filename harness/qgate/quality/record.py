"""A quality result checked against its schema before its items are counted.

`check_quality_result(data, where)` raises ResultError (one line naming the file and the key) for a
record that cannot be what `qgate run quality` wrote; qgate.compare and qgate.night call it on every
quality result they read. What it checks: the header's keys are of their types (`contract` a mapping
with a sha256; the others where the record holds them: hand-written reference results may hold only
what the comparison reads), every engine start is a record, and every item:

- a record whose `index` and `seed` are integers, each (seed, index) pair once; quality schema 3: its
  run_id its file's (an item grafted from another run's file is refused);
- the answers' flags true or false, the counts non-negative integers;
- token ids (output and prompt, where recorded) lists of token ids with their recorded sha256 (and the
  output's length its `output_tokens`);
- timings finite and physical where recorded (decode_s >= 0, decode tok/s in [1e-3, 1e6] or null) and
  one measurement: decode_s the span of the token timestamps, decode tok/s (output_tokens - 1) / decode_s;
- last, the record as its typed model (qgate.records.quality.Quality), in the same one line.
"""

from __future__ import annotations

from typing import Any

from qgate import records
from qgate.record_check import Check, check_launches

_FLAGS = (
    "raw_correct", "strict_correct", "natural_stop", "closed_thinking", "length_cap", "invalid",
    "prefix_cache_reset", "thinking_closed_in_prompt",
)  # fmt: skip
_COUNTS = ("output_tokens", "fffd_count", "longest_token_run", "max_window_repeats")
_HEADER = (("env", dict), ("engine_args", dict), ("model", dict), ("routes", dict), ("quality", dict),
           ("dataset", dict), ("summary", dict), ("inherited_env", dict), ("dropped_env", list),
           ("shims", dict), ("seeds", list))  # fmt: skip


def check_quality_result(data: dict[str, Any], where: str) -> None:
    """Raise ResultError for a quality result that cannot be what a run wrote (see the module doc)."""
    c = Check(where)
    if "arm" in data:
        c.str(data["arm"], "arm")
    contract = c.dict(data.get("contract"), "contract")
    c.sha(contract.get("sha256"), "contract.sha256")
    for key, kind in _HEADER:
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise c.fail(key, data[key], f"expected a {'mapping' if kind is dict else 'list'}")
    if data.get("fingerprint") is not None:
        c.dict(data["fingerprint"], "fingerprint")
    section = data.get("quality") or {}
    for key in ("gates", "sampling"):
        if section.get(key) is not None:
            c.dict(section[key], f"quality.{key}")
    for key in ("first_index", "last_index"):
        if section.get(key) is not None:
            c.int(section[key], f"quality.{key}")
    if "complete" in data:
        c.bool(data["complete"], "complete")
    version = data.get("schema_version")
    if isinstance(version, int) and version >= 3:
        c.str(data.get("run_id"), "run_id")
    for i, seed in enumerate(data.get("seeds") or []):
        c.int(seed, f"seeds[{i}]", -(2**63), 2**63 - 1)
    if "launches" in data:
        check_launches(c, data, complete=False)
    seen: dict[tuple[Any, int], int] = {}
    for pos, item in enumerate(c.list(data.get("items"), "items")):
        key = f"items[{pos}]"
        item = c.dict(item, key)
        index = c.int(item.get("index"), f"{key}.index")
        seed = item.get("seed")
        if seed is not None:
            c.int(seed, f"{key}.seed", -(2**63), 2**63 - 1)
        if (seed, index) in seen:
            raise c.fail(
                f"{key}.index", index, f"item {index} of seed {seed} also in items[{seen[seed, index]}]"
            )
        seen[seed, index] = pos
        if "run_id" in data and item.get("run_id") != data["run_id"]:
            raise c.fail(
                f"{key}.run_id", item.get("run_id"), "not this file's run_id: an item of another run"
            )
        _check_item(c, item, key)
    # Then the typed model (qgate.records.quality): every key of its type, in the same one line.
    records.validate("quality", data, where)


def _check_item(c: Check, item: dict[str, Any], key: str) -> None:
    for name in _FLAGS:
        if item.get(name) is not None:
            c.bool(item[name], f"{key}.{name}")
    for name in _COUNTS:
        if name in item:
            c.int(item[name], f"{key}.{name}")
    for name in ("gold", "raw_answer", "strict_answer", "finish_reason", "output", "prompt"):
        if item.get(name) is not None:
            c.str(item[name], f"{key}.{name}", empty=True)
    if "token_ids" in item or "token_ids_sha256" in item:
        c.token_ids(
            item, key, "token_ids", "token_ids_sha256", "output_tokens" if "output_tokens" in item else None
        )
    if "prompt_token_ids" in item:
        c.token_ids(item, key, "prompt_token_ids", "prompt_sha256", None)
    elif item.get("prompt_sha256") is not None:
        c.sha(item["prompt_sha256"], f"{key}.prompt_sha256")
    if "decode_s" in item:
        c.num(item["decode_s"], f"{key}.decode_s", 0.0, 1e6)
    if item.get("decode_tok_s") is not None:
        c.num(item["decode_tok_s"], f"{key}.decode_tok_s", 1e-3, 1e6)
    for name in ("first_token_ts", "last_token_ts"):
        if name in item:
            c.num(item[name], f"{key}.{name}", -1e12, 1e12)
    _check_rate(c, item, key)


def _check_rate(c: Check, item: dict[str, Any], key: str) -> None:
    """decode_s and decode tok/s are one measurement (quality.workload.run_item): where the record holds
    both, they must agree: (output_tokens - 1) / decode_s, within 0.1 %."""
    if "first_token_ts" in item and "last_token_ts" in item and "decode_s" in item:
        span = max(0.0, float(item["last_token_ts"]) - float(item["first_token_ts"]))
        if abs(float(item["decode_s"]) - span) > 1e-6 + 1e-3 * span:
            raise c.fail(
                f"{key}.decode_s", item["decode_s"], f"not last_token_ts - first_token_ts ({span:.6g})"
            )
    rate, seconds, n = item.get("decode_tok_s"), item.get("decode_s"), item.get("output_tokens")
    if rate is not None and isinstance(seconds, (int, float)) and isinstance(n, int):
        if n < 2 or seconds <= 0:
            raise c.fail(f"{key}.decode_tok_s", rate, f"but {n} output tokens in {seconds} s: no decode rate")
        want = (n - 1) / seconds
        if abs(rate / want - 1.0) > 1e-3:
            raise c.fail(f"{key}.decode_tok_s", rate, f"not (output_tokens - 1) / decode_s ({want:.6g})")
