"""The operator benchmark: each route against its baseline and what vLLM itself runs for it
(ops/competitors.py), medians of CUDA-graph replays.

Headline condition, the decode step (_decode_step): each call between a producer and a consumer of
other kinds, the same for the route and every competitor, inputs rotated past L2; its ratio to the
best competitor (vs_best) is what the targets judge. Second column, back to back: one graph holds
one call per input set, so a call may overlap the previous call of its own kind (PDL); the sets
together hold at least `rotate_bytes` of distinct inputs (capped at `max_sets`), so that with
rotate_bytes above the L2 size every call reads its weights from device memory, as in decode. A
call's time is a replay's time over the number of sets; the median of `reps` replays is reported,
with the minimum and the maximum. Achieved GB/s is the least bytes a call must move over that time,
set against a device-to-device copy measured in the same run. On the CPU (no graphs) a plain timer is
used: the figures then only exercise the code path. Plain data in, one record out; nothing printed.

Targets are ratios to the best competitor measured in the same run (the baseline and every vLLM
path that could run here): vs_best = best competitor us / route us in the decode step, met at >=
min_vs_best. A vLLM path that cannot run is recorded with its reason, never timed as something else.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import qgate_kernels
from qgate.ops import chains, competitors
from qgate.ops.cases import Case
from qgate.ops.screen import record_header
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK

# Targets on the H200 (benchmark figures, never timed tests), judged in the decode-step condition
# (each call between a producer and a consumer of other kinds, see _decode_step): the route's speed
# over the best competitor of the same run (vLLM's own path or the baseline) at least min_vs_best,
# and where max_us is given the route's decode-step time at most that (every input kind for top-k).
TARGETS: dict[tuple[str, str], dict[str, float]] = {
    (ROUTE_HC, "4x2560x320xbf16xcombine_and_mix"): {"min_vs_best": 1.0, "max_us": 8.0},
    (ROUTE_HC, "4x2560x320xfp16xcombine_and_mix"): {"min_vs_best": 1.0, "max_us": 8.0},
    (ROUTE_HC, "*"): {"min_vs_best": 1.0},
    (ROUTE_GDN, "*"): {"min_vs_best": 1.0},
    (ROUTE_GEMV, "*"): {"min_vs_best": 1.05},
    (ROUTE_TOPK, "*"): {"min_vs_best": 1.15},
}


def target_for(route: str, label: str) -> dict[str, float]:
    return TARGETS.get((route, label)) or TARGETS.get((route, "*"), {})


def _input_bytes(args: tuple[Any, ...]) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, Tensor))


def _time_cuda(calls: list[Callable[[], Any]], warmup: int, reps: int) -> list[float]:
    """Per-call microseconds of each timed replay of one graph that makes all the calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(calls))
    del graph
    return times


def _time_cpu(calls: list[Callable[[], Any]], warmup: int, reps: int) -> list[float]:
    for call in calls[: max(1, warmup)]:
        call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for call in calls:
            call()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    return times


def copy_bandwidth(dev: torch.device, nbytes: int = 2**30, reps: int = 20) -> dict[str, float]:
    """Device-to-device copy in GB/s, counting bytes read plus bytes written, two ways: a memcpy
    (under graph capture a copy-engine node) and an elementwise kernel (SMs). The faster is the
    ceiling that GEMV bandwidth is set against."""
    if dev.type != "cuda":
        nbytes = min(nbytes, 2**26)
    src = torch.rand(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    timer = _time_cuda if dev.type == "cuda" else _time_cpu
    # 200 calls first (about 0.1 s): an idle H200 sits at low clocks and ramps up under load.
    memcpy = timer([lambda: dst.copy_(src)], 200, reps)
    kernel = timer([lambda: torch.neg(src, out=dst)], 200, reps)
    timed = {"memcpy": memcpy, "kernel": kernel}
    gb = {name: 2 * nbytes / (statistics.median(t) * 1e-6) / 1e9 for name, t in timed.items()}
    return {**gb, "best": max(gb.values())}


def _stats(times: list[float], nbytes: int) -> dict[str, float]:
    med = statistics.median(times)
    return {"median_us": med, "min_us": min(times), "max_us": max(times), "gb_s": nbytes / (med * 1e-6) / 1e9}


def bench_case(
    case: Case, gen: torch.Generator, dev: torch.device, cfg: dict[str, int], copy_gb_s: float
) -> dict:
    """Time the route and its baseline on the same rotated input sets."""
    first = case.make(gen, dev)
    per_set = max(1, _input_bytes(first))
    n_sets = max(1, min(cfg["max_sets"], math.ceil(cfg["rotate_bytes"] / per_set)))
    sets = [first] + [case.make(gen, dev) for _ in range(n_sets - 1)]
    timer = _time_cuda if dev.type == "cuda" else _time_cpu
    before = qgate_kernels.fallback_counts()[case.route]
    route_t = timer([lambda a=a: case.kernel(*a) for a in sets], cfg["warmup"], cfg["reps"])
    after = qgate_kernels.fallback_counts()[case.route]
    fell_back = {r: n - before.get(r, 0) for r, n in after.items() if n != before.get(r, 0)}
    base_t = timer([lambda a=a: case.baseline(*a) for a in sets], cfg["warmup"], cfg["reps"])
    found = _competitor_fns(case, sets) if dev.type == "cuda" else {}
    rivals = _competitors(case, sets, timer, cfg, found)
    extra = _launch_conditions(case, sets, timer, cfg) if dev.type == "cuda" else {}
    extra.update(_by_input(case, sets, timer, cfg))
    runnable = {name: fn for name, fn in found.items() if not isinstance(fn, str)}
    step = _decode_step(case, sets, timer, cfg, {case.baseline_name: case.baseline, **runnable})
    del sets
    route, base = _stats(route_t, case.bytes_moved), _stats(base_t, case.bytes_moved)
    speedup = base["median_us"] / route["median_us"]
    timed = {case.baseline_name: base["median_us"]}
    timed.update({name: r["median_us"] for name, r in rivals.items() if "median_us" in r})
    best_b2b = min(timed, key=timed.__getitem__)
    vs_best_b2b = timed[best_b2b] / route["median_us"]
    # The headline: the decode step (producer -> op -> consumer), route against every competitor.
    best_name = min(step["competitors_us"], key=step["competitors_us"].__getitem__)
    vs_best = step["competitors_us"][best_name] / step["route_us"] if step["route_us"] > 0 else 0.0
    target = target_for(case.route, case.label)
    met = _target_met(target, step, vs_best, extra) if dev.type == "cuda" else None  # targets are the H200's
    if fell_back:  # the reference was timed, not the route's kernel: never a met target
        met = False if met is not None else None
    return {
        "route": case.route,
        "shape": case.shape,
        "label": case.label,
        "bytes_moved": case.bytes_moved,
        "input_sets": n_sets,
        "rotated_bytes": per_set * n_sets,
        "route_timing": route,
        "baseline": case.baseline_name,
        "baseline_timing": base,
        "speedup": speedup,
        "route_fallbacks": fell_back,
        "competitors": rivals,
        "decode_step": step,
        "best_competitor": best_name,
        "vs_best": vs_best,
        "best_competitor_back_to_back": best_b2b,
        "vs_best_back_to_back": vs_best_b2b,
        "pct_of_copy": 100 * route["gb_s"] / copy_gb_s if copy_gb_s > 0 else None,
        "target": target,
        "target_met": met,
        "raw_us": {"route": route_t, "baseline": base_t},
        **extra,
    }


def _competitor_fns(case: Case, sets: list[tuple[Any, ...]]) -> dict[str, Any]:
    """vLLM's own paths for this case (competitors.py): name -> callable, or name -> why it cannot run."""
    if case.route == ROUTE_GEMV:
        w = sets[0][0]
        return competitors.gemv_competitors(int(w.shape[0]), int(w.shape[1]), w.dtype)
    if case.route == ROUTE_HC:
        return competitors.hc_competitors(case.shape, sets[0])
    if case.route == ROUTE_GDN:
        return competitors.gdn_competitors(case.shape, sets[0])
    if case.route == ROUTE_TOPK:
        return competitors.topk_competitors(*sets[0])
    return {}


def _competitors(
    case: Case,
    sets: list[tuple[Any, ...]],
    timer: Callable[..., list[float]],
    cfg: dict[str, int],
    found: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """vLLM's own paths, back to back: timed on the same sets where they can run, else the reason."""
    out: dict[str, dict[str, Any]] = {}
    for name, fn in found.items():
        if isinstance(fn, str):
            out[name] = {"cannot_run": fn}
        else:
            out[name] = _stats(
                timer([lambda a=a, fn=fn: fn(*a) for a in sets], cfg["warmup"], cfg["reps"]), case.bytes_moved
            )
    return out


# The argument a decode step's producer writes just before the op: the activation input (x of GEMV
# and GDN input, h of the HC mix, the pending block output o of combine_and_mix, the top-k scores).
_PRODUCED_ARG = {ROUTE_GEMV: 1, ROUTE_GDN: 0, ROUTE_TOPK: 0}


def _produced(case: Case, args: tuple[Any, ...]) -> Tensor:
    if case.route == ROUTE_HC:
        return args[0] if case.shape.get("op") == "mix" else args[1]
    return args[_PRODUCED_ARG[case.route]]


def _first_tensor(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else next(t for t in out if isinstance(t, Tensor))


def _decode_step(
    case: Case,
    sets: list[tuple[Any, ...]],
    timer: Callable[..., list[float]],
    cfg: dict[str, int],
    rivals: dict[str, Callable[..., Any]],
) -> dict[str, Any]:
    """Each call as a decode step makes it: right after a producer of another kind (an elementwise
    kernel that rewrites the op's activation input in place, values unchanged, as a norm or an
    activation would) and right before a consumer of another kind (an elementwise kernel that reads
    the op's first output). The same producer and consumer for the route and every competitor, on
    the same rotated sets (weights past L2). An op's time: median of the graph [producer, op,
    consumer] per set minus median of the graph [producer, consumer] per set (glue_us), so that an
    overlap a kernel gets only from a previous call of its own kind (PDL back to back) is not counted."""

    def produce(a: tuple[Any, ...]) -> None:
        x = _produced(case, a)
        x.mul_(1)  # [same shape]: rewritten in place, values unchanged (NaN, inf and -0.0 too)

    def step_calls(fn: Callable[..., Any]) -> list[Callable[[], Any]]:
        return [lambda a=a, fn=fn: (produce(a), torch.neg(_first_tensor(fn(*a)))) for a in sets]

    out_like = _first_tensor(case.kernel(*sets[0]))
    sink = torch.empty_like(out_like)
    glue_t = timer([lambda a=a: (produce(a), torch.neg(sink)) for a in sets], cfg["warmup"], cfg["reps"])
    glue = statistics.median(glue_t)
    route = statistics.median(timer(step_calls(case.kernel), cfg["warmup"], cfg["reps"])) - glue
    comp = {
        name: statistics.median(timer(step_calls(fn), cfg["warmup"], cfg["reps"])) - glue
        for name, fn in rivals.items()
    }
    by_kind: dict[str, float] = {}
    kind_of = case.meta.get("input_kind")
    if kind_of is not None:
        groups: dict[str, list[tuple[Any, ...]]] = {}
        for a in sets:
            groups.setdefault(kind_of(*a), []).append(a)
        if len(groups) > 1:
            for kind, group in sorted(groups.items()):
                glue_calls = [lambda a=a: (produce(a), torch.neg(sink)) for a in group]
                g_glue = statistics.median(timer(glue_calls, cfg["warmup"], cfg["reps"]))
                calls = [lambda a=a: (produce(a), torch.neg(_first_tensor(case.kernel(*a)))) for a in group]
                by_kind[kind] = statistics.median(timer(calls, cfg["warmup"], cfg["reps"])) - g_glue
    return {"route_us": route, "competitors_us": comp, "glue_us": glue, "route_by_input_us": by_kind}


def _launch_conditions(
    case: Case, sets: list[tuple[Any, ...]], timer: Callable[..., list[float]], cfg: dict[str, int]
) -> dict[str, Any]:
    """The route under two more launch conditions, so that an overlap between calls is not mistaken
    for a faster kernel:
    - plain_timing: without the static-weight launch (no PDL), back to back like route_timing;
    - after_producer: each call right after a torch kernel that writes its activation input (as in
      a decode step, where a norm or activation precedes every projection): median of the graph
      [producer, call] per set minus median of the graph [producer] per set, for route and baseline.
    """
    out: dict[str, Any] = {}
    plain, producer = case.meta.get("plain"), case.meta.get("producer")
    if plain is not None:
        out["plain_timing"] = _stats(
            timer([lambda a=a: plain(*a) for a in sets], cfg["warmup"], cfg["reps"]), case.bytes_moved
        )
    if producer is not None:
        only = statistics.median(timer([lambda a=a: producer(*a) for a in sets], cfg["warmup"], cfg["reps"]))
        after: dict[str, Any] = {}
        for name, fn in (("route_us", case.kernel), ("baseline_us", case.baseline)):
            calls = [lambda a=a, fn=fn: (producer(*a), fn(*a)) for a in sets]
            after[name] = statistics.median(timer(calls, cfg["warmup"], cfg["reps"])) - only
        after["producer_us"] = only
        after["route_gb_s"] = (
            case.bytes_moved / (after["route_us"] * 1e-6) / 1e9 if after["route_us"] > 0 else None
        )
        out["after_producer"] = after
    return out


def _by_input(
    case: Case, sets: list[tuple[Any, ...]], timer: Callable[..., list[float]], cfg: dict[str, int]
) -> dict[str, Any]:
    """The route timed on each kind of input the case draws (case.meta["input_kind"] names the kind
    of a set), so that a mixed figure does not hide which inputs are slow. The target is still judged
    on route_timing, over all sets."""
    kind_of = case.meta.get("input_kind")
    if kind_of is None:
        return {}
    groups: dict[str, list[tuple[Any, ...]]] = {}
    for a in sets:
        groups.setdefault(kind_of(*a), []).append(a)
    if len(groups) < 2:
        return {}
    return {
        "by_input": {
            kind: {
                "sets": len(group),
                **_stats(
                    timer([lambda a=a: case.kernel(*a) for a in group], cfg["warmup"], cfg["reps"]),
                    case.bytes_moved,
                ),
            }
            for kind, group in sorted(groups.items())
        }
    }


def _target_met(
    target: dict[str, float], step: dict[str, Any], vs_best: float, extra: dict[str, Any]
) -> bool | None:
    """Judged on the decode step: `step` holds route_us (and route_by_input_us for top-k)."""
    if not target:
        return None
    ok = True
    if "max_us" in target:  # every input kind, and all sets together
        worst = max([step["route_us"], *step.get("route_by_input_us", {}).values()])
        ok &= worst <= target["max_us"]
    if "min_vs_best" in target:
        ok &= vs_best >= target["min_vs_best"]
    return bool(ok)


def run_bench(
    cases: list[Case], cfg: dict[str, int], device: str, seed: int | None = None, contract: dict | None = None
) -> dict[str, Any]:
    """Benchmark every case after measuring the copy bandwidth on the same device."""
    dev = torch.device(device)
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    copy = copy_bandwidth(dev)
    copy_gb_s = copy["best"]
    results = []
    for case in cases:
        results.append(bench_case(case, gen, dev, cfg, copy_gb_s))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    layer_chains = chains.bench_chains(gen, dev, cfg, _time_cuda) if dev.type == "cuda" else {}
    return {
        **record_header("ops_bench", contract, seed, dev),
        "timing": "cuda-graph replay, events" if dev.type == "cuda" else "perf_counter (CPU: code path only)",
        "config": cfg,
        "copy_gb_s": copy_gb_s,
        "copy_detail_gb_s": copy,
        "cases": results,
        "chains": layer_chains,
    }
