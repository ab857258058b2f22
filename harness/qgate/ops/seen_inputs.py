"""Is a route faster on an input it has seen? MLPerf's TEST04 at the op, in the operator screen.

A route that remembers results by its input's contents (a memo: bit-exact, so no output check sees
it) costs a hash where the route costs its work, whenever an input comes again; decoding repeats
inputs (every recurrence of a token feeds the first layer the same bytes), so such a route buys
engine speed the kernel does not have. Here each pair times the route on fresh inputs, then on a copy
of the same contents at other addresses (an address-keyed cache is the in-place trial's: qgate.ops.
screen): an honest route costs the same twice. The screen FAILs a shape where the fastest fresh call over
the fastest repeat exceeds MAX_SPEEDUP and the fresh call is long enough (MIN_FRESH_US) for a hash to be
cheaper than the work; below it a memo cannot gain much and is not looked for.

The pairs run on their own random stream: the screen's trials keep their inputs.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from qgate.ops.cases import Case

PAIRS = 12
MAX_SPEEDUP = 3.0
MIN_FRESH_US = 50.0


def _timed(case: Case, args: tuple[Any, ...], dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter_ns()
    case.kernel(*args)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return (time.perf_counter_ns() - t0) / 1000.0


def _copy(args: tuple[Any, ...], activations: tuple[int, ...]) -> tuple[Any, ...]:
    """The activations copied to other addresses, the weights the same tensors (a model's are static)."""
    return tuple(
        a.clone() if i in activations and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)
    )


def repeat_speedup(case: Case, gen: torch.Generator, dev: torch.device, pairs: int = PAIRS) -> dict[str, Any]:
    """{fresh_us, repeat_us: the fastest of the pairs' calls of each kind (another process's load only
    adds time: the minimum is the call's own cost), speedup: their ratio, judged: whether the fresh call
    is long enough to judge}. The weights are the first call's in every pair (a model's are static):
    only the activations' contents come again."""
    own = torch.Generator(device=gen.device)
    own.manual_seed(gen.initial_seed() + 2)
    base = case.make(own, dev)
    _timed(case, base, dev)  # first-call costs (allocation, lazy init) out of the pairs
    new = case.make(own, dev)  # fresh contents: a memo's miss costs what its work does
    first = _timed(case, tuple(new[i] if i in case.activations else a for i, a in enumerate(base)), dev)
    if first < MIN_FRESH_US:  # too short for a hash to gain: not looked for (and no pairs' time spent)
        return {"fresh_us": first, "repeat_us": None, "speedup": None, "judged": False}
    # Every input and its copy made before any timing: between the timed calls nothing else runs (a
    # call after other torch work waits for its threads to wake, on a loaded machine for milliseconds).
    fresh = []
    for _ in range(pairs):
        new = case.make(own, dev)
        fresh.append(tuple(new[i] if i in case.activations else a for i, a in enumerate(base)))
    again = [_copy(args, case.activations) for args in fresh]
    fresh_us, repeat_us = [], []
    for args, same in zip(fresh, again, strict=True):
        fresh_us.append(_timed(case, args, dev))
        repeat_us.append(_timed(case, same, dev))
    f, r = min(fresh_us), min(repeat_us)
    return {"fresh_us": f, "repeat_us": r, "speedup": f / max(r, 1e-3), "judged": f >= MIN_FRESH_US}


def failure(probe: dict[str, Any]) -> str | None:
    """The screen's failure line for a route faster on inputs it has seen, or None."""
    if not probe["judged"] or probe["speedup"] is None or probe["speedup"] <= MAX_SPEEDUP:
        return None
    return (
        f"{probe['speedup']:.1f}x faster on an input it has seen ({probe['fresh_us']:.0f} us fresh, "
        f"{probe['repeat_us']:.0f} us again; fastest of {PAIRS} pairs each, fails above {MAX_SPEEDUP:g}x): "
        "a result cache"
    )
