"""The route plugin's registry: this process's route state and its routed sites, shared by the plugin
(plugin.py: registration and vLLM's patches) and the site modules (one per route, sites/).

`STATE` is None until `plugin.register()` finds a route switched on; every routed site is added here
(`add_site`: its index is what the custom ops carry) and runs its route through `invoke`, which counts a
hit or the op's fallback. Imports neither vLLM nor the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch  # vLLM has imported it already when it loads plugins

from qgate_kernels import attest, sites

# The weight dtypes a routed site takes: those the route ops are defined for (qgate_kernels.ops, fp16
# and bf16: the CPU kernels and the CUDA kernels take both, dtypes.route_dtypes says so per device).
# A call the op's kernel cannot take on its device runs the op's counted fallback (op_<reason>);
# weights of other dtypes (float32) keep vLLM's path on every call, counted `dtype`.
ROUTED_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class State:
    routes_on: frozenset[str]
    impls: dict[str, Callable[..., Any]]
    recorder: attest.Recorder
    error: str | None
    sites: list[Any]
    op_counts: Callable[[], dict[str, dict[str, int]]] | None = None  # ops.fallback_counts
    overridden: frozenset[str] = frozenset()
    site_specs: dict[str, str] | None = None  # "<route>.<kind>" -> "module:qualname" of the routes on
    gemv_listed: tuple[str, ...] = ()  # the contract's roles for the GEMV route (checked); () = defaults


STATE: State | None = None


def add_site(site: Any, route: str, role: str) -> int:
    assert STATE is not None
    STATE.sites.append(site)
    STATE.recorder.site(route, role)
    return len(STATE.sites) - 1


def patched(fn: Callable[..., Any], orig: Callable[..., Any]) -> Callable[..., Any]:
    fn._qgate_orig = orig  # type: ignore[attr-defined]
    fn.__name__ = getattr(orig, "__name__", fn.__name__)
    fn.__doc__ = getattr(orig, "__doc__", None)
    return fn


def unpatched(cls: type, name: str) -> Callable[..., Any]:
    fn = cls.__dict__[name]
    return getattr(fn, "_qgate_orig", fn)


def site_owner(key: str) -> Any:
    assert STATE is not None and STATE.site_specs is not None
    return sites.resolve(key, STATE.site_specs[key])[0]


def invoke(
    route: str, role: str, *args: Any, impl_key: str | None = None, tally: Any = None, **kwargs: Any
) -> Any:
    """Run the route's implementation; count a hit (on `tally` when the site has one), or a fallback
    when the op itself fell back.

    qgate_kernels.ops runs its reference (and counts why) when its kernel cannot take the inputs, e.g.
    no CUDA build or a misaligned row: that call did not run the route's kernel, so it is no hit.
    """
    assert STATE is not None
    impl = STATE.impls[impl_key or route]
    if route in STATE.overridden or STATE.op_counts is None:
        out = impl(*args, **kwargs)
        hit(route, role, tally)
        return out
    before = STATE.op_counts().get(route, {})
    out = impl(*args, **kwargs)
    after = STATE.op_counts().get(route, {})
    if after == before:
        hit(route, role, tally)
        return out
    for reason, n in after.items():
        if n > before.get(reason, 0):
            STATE.recorder.fallback(route, f"op_{reason}", n - before.get(reason, 0))
    return out


def hit(route: str, role: str, tally: Any) -> None:
    assert STATE is not None
    if tally is not None:
        tally.n += 1
        if attest.CAPTURE is not None:  # under graph capture: its replays run it (qgate_kernels.graphs)
            attest.note_capture(attest.HIT, route, role)
    else:
        STATE.recorder.hit(route, role)
