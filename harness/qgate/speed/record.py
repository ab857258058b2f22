"""A speed result checked against its schema and its own run before any figure is computed from it.

`check_speed_result(data, where)` raises ResultError (one line naming the file and the key) for a
record that cannot be what `qgate run speed` wrote; qgate.compare and qgate.night call it on every
speed result they read. What is checked, beyond the header (qgate.record_check):

- the workload's counts are positive integers; every engine start (`launches`) is a record;
- every rep is a record of the right types: index and launch integers, each index once, the launch the
  one its index belongs to (rep i of launch L has L * repetitions <= i < (L + 1) * repetitions, as
  speed.run.missing_reps numbers them) and one the result records an engine start of;
- `token_ids` a list of token ids whose sha256 is the recorded one and whose length is `output_tokens`,
  which is the workload's (exactly, with ignore_eos);
- timings finite and physical: decode tok/s in [1e-3, 1e6], TPOT in [1e-3, 1e6] ms and 1000 / decode
  tok/s within 0.1 % (both are one measurement: speed.workload.rep_record), TTFT in [1e-3, 1e7] ms;
- started_at not before the rep's engine start (less START_SLACK) and in index order (reps of one arm
  run one after the other: a rep copied into another launch, or in from another run, breaks the order);
- schema 2: the rep's run_id is its file's (a rep grafted from another run's file is refused);
- last, the record as its typed model (qgate.records.speed.Speed), in the same one line.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from statistics import NormalDist
from typing import Any

from qgate import records
from qgate.record_check import Check, check_header, check_launches

# The parent stamps an engine start when it reads the child's `engine_ready`, the child stamps each rep:
# on a loaded machine the parent may read the event after the first reps were stamped. A rep from another
# launch or run is minutes off; one of this launch is within this.
START_SLACK = timedelta(seconds=60)
# relative: tpot_ms * decode_tok_s / 1000 - 1; a record rounded to 6 digits is far within it
TPOT_TOLERANCE = 1e-3
FINISH_REASONS = ("length", "stop")  # vLLM's finish of a completed request
MAX_COUNT = 100_000  # repetitions, launches, warmup: far above any contract's
_TIMINGS = (  # key, low, high (inclusive), required
    ("decode_tok_s", 1e-3, 1e6, True),
    ("tpot_ms", 1e-3, 1e6, True),
    ("ttft_ms", 1e-3, 1e7, True),
    ("prefill_ms", 0.0, 1e7, False),
    ("wall_s", 1e-6, 1e6, False),
    ("engine_s", 1e-6, 1e6, False),
    ("harness_overhead_s", -1e6, 1e6, False),
    ("harness_overhead_pct", -1e9, 1e9, False),
)


def check_speed_result(data: dict[str, Any], where: str) -> None:
    """Raise ResultError for a speed result that cannot be what a run wrote (see the module doc)."""
    version = data.get("schema_version")
    c = check_header(data, where, run_id=isinstance(version, int) and version >= 2)
    prompt = c.dict(data.get("prompt"), "prompt")
    workload = c.dict(data.get("workload"), "workload")
    # Bounds far above any run (a contract's own limits are lower): counts that size arrays downstream
    reps_per_launch = c.int(workload.get("repetitions"), "workload.repetitions", 1, MAX_COUNT)
    launches = c.int(workload.get("launches"), "workload.launches", 1, MAX_COUNT)
    output_tokens = c.int(workload.get("output_tokens"), "workload.output_tokens", 1, 10**8)
    c.int(workload.get("warmup", 0), "workload.warmup", 0, MAX_COUNT)
    for key in ("greedy", "ignore_eos", "reset_prefix_cache"):
        if key in workload:
            c.bool(workload[key], f"workload.{key}")
    starts = check_launches(c, data)
    if data.get("sequential") is not None:
        _check_sequential(c, data["sequential"], launches)
    reps = c.list(data.get("reps"), "reps")
    if reps:
        c.sha(prompt.get("sha256"), "prompt.sha256")
    seen: dict[int, int] = {}
    figures: dict[tuple[Any, ...], int] = {}
    timed: list[tuple[int, datetime, str]] = []
    for pos, rep in enumerate(reps):
        key = f"reps[{pos}]"
        rep = c.dict(rep, key)
        index = c.int(rep.get("index"), f"{key}.index", 0, MAX_COUNT * MAX_COUNT)
        if index in seen:
            raise c.fail(
                f"{key}.index", index, f"also the index of reps[{seen[index]}]: each rep is measured once"
            )
        seen[index] = pos
        launch = c.int(rep.get("launch"), f"{key}.launch", 0, launches - 1)
        if index // reps_per_launch != launch:
            raise c.fail(
                f"{key}.launch", launch, f"rep {index} belongs to launch {index // reps_per_launch} "
                f"({reps_per_launch} reps a launch)",
            )  # fmt: skip
        if launch not in starts:
            raise c.fail(f"{key}.launch", launch, "the result records no engine start of this launch")
        if "run_id" in data and rep.get("run_id") != data["run_id"]:
            raise c.fail(
                f"{key}.run_id",
                rep.get("run_id"),
                f"not this file's run_id {data['run_id']!r}: a rep of another run",
            )
        _check_rep(c, rep, key, output_tokens, workload.get("ignore_eos") is True)
        _check_top_k(c, rep, key, workload.get("audit_top_k"))
        stamp = c.time(rep.get("started_at"), f"{key}.started_at")
        if stamp < starts[launch] - START_SLACK:
            raise c.fail(f"{key}.started_at", rep["started_at"], f"before launch {launch}'s engine start")
        timed.append((index, stamp, key))
        body = (rep.get("decode_tok_s"), rep.get("ttft_ms"), rep.get("wall_s"), rep.get("started_at"))
        if body in figures:
            raise c.fail(key, rep, f"a copy of reps[{figures[body]}] (every figure the same)")
        figures[body] = pos
    timed.sort(key=lambda x: x[0])
    for (_, before, _), (index, stamp, key) in zip(timed, timed[1:], strict=False):
        if stamp < before:
            raise c.fail(
                f"{key}.started_at",
                stamp.isoformat(),
                f"earlier than the rep before rep {index}: reps run in index order",
            )
    # Then the typed model (qgate.records.speed): every key of its type, in the same one line.
    records.validate("speed", data, where)


def _check_rep(c: Check, rep: dict[str, Any], key: str, output_tokens: int, ignore_eos: bool) -> None:
    for name, low, high, required in _TIMINGS:
        if required or name in rep:
            c.num(rep.get(name), f"{key}.{name}", low, high)
    tok, tpot = float(rep["decode_tok_s"]), float(rep["tpot_ms"])
    if abs(tok * tpot / 1000.0 - 1.0) > TPOT_TOLERANCE:
        raise c.fail(
            f"{key}.tpot_ms",
            tpot,
            f"not 1000 / decode_tok_s ({1000.0 / tok:.6g}): one measurement gives both",
        )
    c.token_ids(rep, key, "token_ids", "token_ids_sha256", "output_tokens")
    n = int(rep["output_tokens"])
    if n < 2 or (n != output_tokens if ignore_eos else n > output_tokens):
        want = (
            f"{output_tokens} (workload.output_tokens, ignore_eos)" if ignore_eos else f"2 to {output_tokens}"
        )
        raise c.fail(f"{key}.output_tokens", n, f"expected {want}")
    if rep.get("prefix_cache_reset") is not None:
        c.bool(rep["prefix_cache_reset"], f"{key}.prefix_cache_reset")
    if rep.get("finish_reason") not in FINISH_REASONS:
        raise c.fail(f"{key}.finish_reason", rep.get("finish_reason"), "expected 'length' or 'stop'")
    _check_overhead(c, rep, key)


def _check_top_k(c: Check, rep: dict[str, Any], key: str, top_k: Any) -> None:
    """The distribution audit's rows (qgate.speed.dist_audit): one per token, each top_k distinct ids and
    their logprobs, finite, <= 0 and in rank order; a rep of a run that asked none holds none."""
    if "top_ids" not in rep and "top_logprobs" not in rep:
        return
    if not top_k:
        raise c.fail(f"{key}.top_ids", "...", "top-k rows in a run whose workload.audit_top_k is unset")
    k = c.int(top_k, "workload.audit_top_k", 1, 1000)
    ids, lps = (
        c.list(rep.get("top_ids"), f"{key}.top_ids"),
        c.list(rep.get("top_logprobs"), f"{key}.top_logprobs"),
    )
    if len(ids) != len(rep["token_ids"]) or len(lps) != len(ids):
        raise c.fail(
            f"{key}.top_ids", len(ids), f"expected one row per token ({len(rep['token_ids'])}) in both"
        )
    for j, (row, lp) in enumerate(zip(ids, lps, strict=True)):
        row, lp = c.list(row, f"{key}.top_ids[{j}]"), c.list(lp, f"{key}.top_logprobs[{j}]")
        if len(row) != k or len(lp) != k or len(set(map(repr, row))) != k:
            raise c.fail(f"{key}.top_ids[{j}]", row, f"expected {k} distinct ids and {k} logprobs")
        for i, (t, v) in enumerate(zip(row, lp, strict=True)):
            c.int(t, f"{key}.top_ids[{j}][{i}]", 0, 10**9)
            c.num(v, f"{key}.top_logprobs[{j}][{i}]", -1e6, 0.0)
        if any(a < b for a, b in zip(lp, lp[1:], strict=False)):
            raise c.fail(f"{key}.top_logprobs[{j}]", lp, "not in rank order (descending)")


def _check_overhead(c: Check, rep: dict[str, Any], key: str) -> None:
    """The harness overhead is derived (speed.workload.rep_record): wall_s - engine_s; where the rep holds
    all three, it must be that. (Its percentage is display only: the hand-made golden pair rounds it.)"""
    if not all(k in rep for k in ("wall_s", "engine_s", "harness_overhead_s")):
        return
    wall, engine, over = (float(rep[k]) for k in ("wall_s", "engine_s", "harness_overhead_s"))
    if abs(over - (wall - engine)) > 1e-6 + 1e-3 * wall:
        raise c.fail(f"{key}.harness_overhead_s", over, f"not wall_s - engine_s ({wall - engine:.6g})")


def _check_sequential(c: Check, seq: Any, launches: int) -> None:
    """The `sequential` record of a --until-decided run. Compare judges the stopped data at the last
    look's z boundary, so a boundary below the fixed design's z of alpha / 2 (every O'Brien-Fleming
    boundary is above it) is refused: edited lower it would pass what the design does not. (Computing
    the design again to compare takes seconds a look; the contract's alpha is the integrity gate's.)"""
    seq = c.dict(seq, "sequential")
    design = c.dict(seq.get("design"), "sequential.design")
    alpha = c.num(design.get("alpha"), "sequential.design.alpha", 1e-9, 0.5)
    first = c.int(design.get("first_launches"), "sequential.design.first_launches", 2, MAX_COUNT)
    last = c.int(design.get("max_launches"), "sequential.design.max_launches", first, MAX_COUNT)
    planned = list(range(first, last + 1))
    if design.get("planned_launches") != planned:
        raise c.fail(
            "sequential.design.planned_launches", design.get("planned_launches"), f"expected {first}..{last}"
        )
    floor = NormalDist().inv_cdf(1 - alpha / 2)
    z = c.list(design.get("z_boundaries"), "sequential.design.z_boundaries")
    if len(z) != len(planned):
        raise c.fail(
            "sequential.design.z_boundaries", z, f"expected one boundary for each of {len(planned)} looks"
        )
    for i, x in enumerate(z):
        c.num(x, f"sequential.design.z_boundaries[{i}]", floor - 1e-9, 1e3)
    looks = c.list(seq.get("looks"), "sequential.looks")
    if len(looks) > len(planned):
        raise c.fail("sequential.looks", looks, f"more looks than the {len(planned)} planned")
    for i, look in enumerate(looks):
        key = f"sequential.looks[{i}]"
        at = c.int(c.dict(look, key).get("launches"), f"{key}.launches", 0, launches)
        if at != planned[i]:
            raise c.fail(f"{key}.launches", at, f"look {i} is planned at {planned[i]} launches")
