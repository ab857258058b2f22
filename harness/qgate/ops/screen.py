"""The operator screen: each route at each shape against its reference, on the current device.

Per case: `trials` fresh random inputs; per trial every dot product the outputs hold judged by its
forward-error bound against a float64 reference (qgate.ops.bound: GEMV's y, GDN input's four outputs,
HC's h' and injection), the HC block_input and the top-k by the route's tolerance (ULPs, exact),
bit equality, max abs diff and max ULP kept as information; per route the sign test of the
deviations from the correctly rounded result; the same inputs twice give the same bits; CUDA-graph replay of
the route on new data in the captured buffers gives the eager bits; a probe the kernel does not
take (M > 1, k too large) falls back, is counted, and equals the reference. Plain data in, one
record out; nothing printed.

With an arm's overrides (`QGATE_ROUTE_IMPL_*`), the overridden routes' ops are replaced by the
override, called as the plugin calls it, so a candidate that swaps a route's implementation is screened
on what it runs; an override counts no fallbacks, so its cases skip the fallback probe.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import torch
from torch import Tensor

import qgate_kernels
from qgate.ops import bound, seen_inputs
from qgate.ops.cases import Case
from qgate.results import current_schema
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC


def ordered_int(t: Tensor) -> Tensor:
    """Floats mapped to int64 so that adjacent representable values differ by one."""
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    width = torch.iinfo(bits).bits
    i = t.contiguous().view(bits).to(torch.int64)
    sign = i < 0
    mag = i & ((1 << (width - 1)) - 1)
    return torch.where(sign, -mag, mag)


def ulp_distance(out: Tensor, ref: Tensor) -> float:
    """Max distance in ULPs of the output dtype, measured at max(|ref|, max|ref| / 1024).

    Integer outputs (indices) count any difference as infinite. NaN where the reference has a
    number (or the reverse) is infinite.
    """
    if out.numel() == 0:
        return 0.0
    if not out.is_floating_point():
        return 0.0 if torch.equal(out, ref) else math.inf
    if not torch.equal(torch.isnan(out), torch.isnan(ref)):
        return math.inf
    keep = ~torch.isnan(ref)
    o, r = out[keep].double(), ref[keep].double()
    if o.numel() == 0:
        return 0.0
    if not torch.equal(torch.isinf(o), torch.isinf(r)) or not torch.equal(
        o[torch.isinf(o)], r[torch.isinf(r)]
    ):
        return math.inf
    finite = ~torch.isinf(r)
    o, r = o[finite], r[finite]
    if o.numel() == 0:
        return 0.0
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[out.dtype]
    tiny = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126, torch.float32: 2.0**-126}[out.dtype]
    floor = max(float(r.abs().max()) / 1024, tiny)
    spacing = torch.exp2(torch.floor(torch.log2(r.abs().clamp_min(floor))) - mant)
    return float(((o - r).abs() / spacing).max())


def bitwise_equal(outs: tuple[Tensor, ...], refs: tuple[Tensor, ...]) -> bool:
    return len(outs) == len(refs) and all(
        o.shape == r.shape and o.dtype == r.dtype and torch.equal(_bits(o), _bits(r))
        for o, r in zip(outs, refs, strict=True)
    )


def _bits(t: Tensor) -> Tensor:
    if not t.is_floating_point():
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _max_abs_diff(outs: tuple[Tensor, ...], refs: tuple[Tensor, ...]) -> float:
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if not o.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(o, r) else math.inf)
            continue
        both = ~(torch.isnan(o) & torch.isnan(r)) & ~(torch.isinf(o) & (o == r))
        diff = (o.double() - r.double())[both].abs()
        if diff.numel():
            worst = max(worst, math.inf if torch.isnan(diff).any() else float(diff.max()))
    return worst


def _fallback_delta(before: dict[str, dict[str, int]], route: str) -> dict[str, int]:
    after = qgate_kernels.fallback_counts()[route]
    return {r: n - before[route].get(r, 0) for r, n in after.items() if n != before[route].get(r, 0)}


def _graph_replay_identical(
    case: Case, gen: torch.Generator, dev: torch.device, replays: int = 3
) -> bool | None:
    """Capture the route on static inputs; replays on fresh data copied in must give the eager bits."""
    if dev.type != "cuda":
        return None
    static = case.make(gen, dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        case.kernel(*static)  # warm up outside capture (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = case.kernel(*static)
    for _ in range(replays):
        fresh = case.make(gen, dev)
        for dst, src in zip(static, fresh, strict=True):
            if isinstance(dst, Tensor):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        if not bitwise_equal(tuple(t.clone() for t in captured), case.kernel(*static)):
            return False
    return True


def screen_case(
    case: Case,
    trials: int,
    tolerance: dict[str, Any],
    gen: torch.Generator,
    dev: torch.device,
    override: str | None = None,
) -> dict:
    """Screen one route at one shape; the record says why it failed, if it did. `override`: the spec
    of the arm's override that runs instead of the route's kernel (no fallback probe then)."""
    before = qgate_kernels.fallback_counts()
    bitwise, max_abs, max_ulp, judged_ulp, deterministic = 0, 0.0, 0.0, 0.0, True
    in_place: bool | None = None
    wrote, aliased = set(), set()
    tally = bound.Tally()
    for trial in range(trials):
        args = case.make(gen, dev)
        pristine = _copies(args) if case.route in _FUNCTIONAL else None
        outs = case.kernel(*args)
        if pristine is not None:  # the reference sees the inputs as they were given
            wrote |= _written(args, pristine)
            aliased |= _aliased(outs, args)
            args = pristine
        refs = case.reference(*args)
        bitwise += bitwise_equal(outs, refs)
        max_abs = max(max_abs, _max_abs_diff(outs, refs))
        ulps = [ulp_distance(o, r) for o, r in zip(outs, refs, strict=True)]
        max_ulp = max(max_ulp, max(ulps))
        judged_ulp = max(judged_ulp, _ulp_judged(case, ulps))
        for what, j in judged(case, args, outs):
            tally.add(j, what)
        if trial == 0:
            deterministic = bitwise_equal(outs, case.kernel(*args))
            in_place = _recomputes_in_place(case, args, gen, dev)
    unexpected = _fallback_delta(before, case.route)
    graph_ok = _graph_replay_identical(case, gen, dev)
    again = seen_inputs.repeat_speedup(case, gen, dev) if case.activations else None

    probe_equal = probe_counted = True
    if override is None:
        before = qgate_kernels.fallback_counts()
        probe = case.probe(gen, dev)
        probe_equal = bitwise_equal(case.kernel(*probe), case.reference(*probe))
        probe_counted = _fallback_delta(before, case.route) == {case.probe_reason: 1}

    failures = []
    if unexpected:
        failures.append(f"fell back instead of running the kernel: {unexpected}")
    if tally.exceeded:
        f = tally.first or {}
        failures.append(
            f"{tally.exceeded}/{tally.outputs} outputs over the forward-error bound (first: {f.get('at')}"
            f"[{f.get('index')}], err/bound {f.get('ratio', 0):.3g})"
        )
    if judged_ulp > tolerance["max_ulp"]:
        failures.append(f"max ULP {judged_ulp:.3g} > {tolerance['max_ulp']}{_ULP_JUDGED.get(case.route, '')}")
    if tolerance.get("max_abs_diff") is not None and max_abs > tolerance["max_abs_diff"]:
        failures.append(f"max abs diff {max_abs:.3g} > {tolerance['max_abs_diff']}")
    if bitwise / trials < tolerance.get("min_bitwise_fraction", 0.0):
        failures.append(f"bitwise equal {bitwise}/{trials} < {tolerance['min_bitwise_fraction']:.0%}")
    if not deterministic:
        failures.append("two calls on the same inputs differ")
    if in_place is False:
        failures.append("new contents at the same addresses gave another result than at fresh addresses")
    if again is not None and seen_inputs.failure(again):
        failures.append(str(seen_inputs.failure(again)))
    if wrote:
        failures.append(f"wrote to its inputs (argument {', '.join(map(str, sorted(wrote)))})")
    if aliased:
        failures.append(
            f"an output shares memory with an input (argument {', '.join(map(str, sorted(aliased)))})"
        )
    if graph_ok is False:
        failures.append("CUDA-graph replay differs from eager")
    if not (probe_equal and probe_counted):
        failures.append(f"probe ({case.probe_reason}) did not fall back to the reference and count it")
    return {
        "route": case.route,
        "shape": case.shape,
        "label": case.label,
        "trials": trials,
        "bitwise_equal": bitwise,
        "max_abs_diff": max_abs,
        "max_ulp": max_ulp,
        "judged_ulp": judged_ulp,
        "bound": tally.as_dict(),
        "deterministic": deterministic,
        "recomputes_in_place": in_place,
        "seen_input_speedup": again,
        "graph_replay_identical": graph_ok,
        "fallback_probe": None
        if override is not None
        else {"reason": case.probe_reason, "counted": probe_counted, "equal_to_reference": probe_equal},
        "override": override,
        "unexpected_fallbacks": unexpected,
        "tolerance": tolerance,
        "passed": not failures,
        "failures": failures,
    }


# The routes whose ops take no output argument (ops_def.cpp: no Tensor(a!)): the screen checks that they
# leave their inputs as given and return fresh memory (a kernel that copies or overwrites an input).
_FUNCTIONAL = (ROUTE_GEMV, ROUTE_GDN, ROUTE_HC)


def _recomputes_in_place(
    case: Case, args: tuple[Any, ...], gen: torch.Generator, dev: torch.device
) -> bool | None:
    """The activations refilled with new contents in their own memory (the same addresses, as vLLM's
    persistent buffers under CUDA graphs; weights kept): the route's output must be the one the same
    contents give at fresh addresses. A result kept by address (a cache keyed by pointers, a stale
    buffer) is not. None: the case names no activation."""
    if not case.activations:
        return None
    own = torch.Generator(device=gen.device)  # its own stream: the trials' inputs stay those of before
    own.manual_seed(gen.initial_seed() + 1)
    fresh = case.make(own, dev)
    for i in case.activations:
        if isinstance(args[i], Tensor) and isinstance(fresh[i], Tensor) and fresh[i].shape == args[i].shape:
            args[i].copy_(fresh[i])  # same storage, new values
    return bitwise_equal(case.kernel(*args), case.kernel(*_copies(args)))


def _copies(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, Tensor) else a for a in args)


def _written(args: tuple[Any, ...], pristine: tuple[Any, ...]) -> set[int]:
    """The positions of the tensor arguments whose bits a call changed."""
    return {
        i
        for i, (a, p) in enumerate(zip(args, pristine, strict=True))
        if isinstance(a, Tensor) and not torch.equal(_bits(a), _bits(p))
    }


def _aliased(outs: tuple[Tensor, ...], args: tuple[Any, ...]) -> set[int]:
    """The positions of the tensor arguments whose storage an output shares."""
    held = {o.untyped_storage().data_ptr() for o in outs if isinstance(o, Tensor) and o.numel()}
    return {
        i
        for i, a in enumerate(args)
        if isinstance(a, Tensor) and a.numel() and a.untyped_storage().data_ptr() in held
    }


# Which outputs the ULP tolerance judges: GEMV and GDN none (their bound judges every output), HC only
# block_input (its h' and injection have their bound), the top-k all (exact).
_ULP_JUDGED = {ROUTE_GEMV: " (none)", ROUTE_GDN: " (none)", ROUTE_HC: " (block_input)"}


def _ulp_judged(case: Case, ulps: list[float]) -> float:
    if case.route in (ROUTE_GEMV, ROUTE_GDN):
        return 0.0
    if case.route == ROUTE_HC:
        return ulps[0 if case.shape["op"] == "mix" else 1]  # block_input
    return max(ulps)


def judged(case: Case, args: tuple[Any, ...], outs: tuple[Tensor, ...]) -> list[tuple[str, bound.Judged]]:
    """The forward-error bound of every dot product a case's outputs hold (qgate.ops.bound)."""
    if case.route == ROUTE_GEMV:
        w, x = args
        return [("y", bound.judge_dot(w, x, outs[0]))]
    if case.route == ROUTE_GDN:
        x, wq, wb = args
        s = case.shape
        heads = (s["nk"], s["nv"], s["dk"], s["dv"])
        return [("gdn", bound.judge_gdn(x, wq, wb, heads, s["layout"], outs))]
    if case.route == ROUTE_HC:
        h, o, inj, nw, wd, _ = args
        s = case.shape
        if s["op"] == "mix":
            o = inj = None
        return bound.judge_hc(h, o, inj, outs, nw, wd, s["hc_count"], s["lora_rank"], case.meta["eps"])
    return []


def _screen_or_error(
    case: Case,
    trials: int,
    tolerance: dict[str, Any],
    gen: torch.Generator,
    dev: torch.device,
    override: str | None = None,
) -> dict:
    """A kernel that raises (a failed launch, a failed capture) fails its case, with the error."""
    try:
        return screen_case(case, trials, tolerance, gen, dev, override)
    except (RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {
            "route": case.route,
            "shape": case.shape,
            "label": case.label,
            "trials": trials,
            "tolerance": tolerance,
            "override": override,
            "passed": False,
            "failures": [f"error: {type(exc).__name__}: {first}"],
        }


def device_info(dev: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(dev), "torch": torch.__version__, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
        )
    info["qgate_kernels"] = qgate_kernels.build_info()
    return info


def record_header(kind: str, contract: dict[str, Any] | None, seed: int, dev: torch.device) -> dict[str, Any]:
    """The fields every operator record (screen, CUDA bench, CPU bench) starts with; the schema version
    is the registry's (qgate.results.SCHEMAS), so a record always loads with load_result."""
    return {
        "kind": kind,
        "schema_version": current_schema(kind),
        "contract": contract,
        "started_at": datetime.now(timezone.utc).isoformat(),
        "seed": seed,
        "device": device_info(dev),
    }


def run_screen(
    cases: list[Case],
    trials: int,
    tolerances: dict[str, dict[str, Any]],
    device: str,
    seed: int | None = None,
    contract: dict[str, Any] | None = None,
    arm: str | None = None,
    overrides: Mapping[str, str] | None = None,
    replacements: Mapping[str, Callable[..., Any]] | None = None,
) -> dict[str, Any]:
    """Screen every case; the record passes only if every case passes. `arm`: the contract arm screened;
    `overrides` its route -> override spec, `replacements` the qgate_kernels ops they replace
    (qgate_kernels.overrides.op_replacements)."""
    dev = torch.device(device)
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    overrides = dict(overrides or {})
    with _replaced_ops(replacements or {}):
        results = [
            _screen_or_error(c, trials, tolerances[c.route], gen, dev, overrides.get(c.route)) for c in cases
        ]
    bias = _sign_tests(results)
    return {
        **record_header("ops", contract, seed, dev),
        "arm": arm,
        "overrides": overrides,
        "cases": results,
        "bias": bias,
        "passed": bool(results) and all(r["passed"] for r in results) and all(b["passed"] for b in bias),
    }


def _sign_tests(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per route with judged outputs: the sign test of the deviations from the correctly rounded result."""
    counts: dict[str, list[int]] = {}
    for r in results:
        if r.get("bound", {}).get("outputs"):
            c = counts.setdefault(r["route"], [0, 0])
            c[0] += r["bound"]["above_rn"]
            c[1] += r["bound"]["below_rn"]
    return [{"route": route, **bound.sign_test(up, down)} for route, (up, down) in counts.items()]


def _as_the_plugin_calls(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The cases call the ops with their keyword options (static_weight=, layout=, ...); the plugin
    passes an override only the keywords its signature takes."""
    params = inspect.signature(fn).parameters
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def call(*args: Any, **kw: Any) -> Any:
        return fn(*args, **{k: v for k, v in kw.items() if any_kw or k in params})

    return call


@contextmanager
def _replaced_ops(replacements: Mapping[str, Callable[..., Any]]) -> Iterator[None]:
    """qgate_kernels.<op> replaced for the screen (the cases look the ops up on the package per call)."""
    saved = {name: getattr(qgate_kernels, name) for name in replacements}
    try:
        for name, fn in replacements.items():
            setattr(qgate_kernels, name, _as_the_plugin_calls(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(qgate_kernels, name, fn)
