"""Route switches and implementation overrides, shared by the vLLM plugin and qgate's pre-flight check.

A route is switched on by its env var (`VLLM_SM70_QWEN38_FP16_GEMV=1`, ...). An override
`QGATE_ROUTE_IMPL_<ROUTE>=package.module:function` sends the route to any importable function with the
route op's signature (see `ROUTE_OP`: the functions of `qgate_kernels.ops`), e.g. a slowed or faulty
implementation in a test, or an alternative kernel, without a rebuild.

This module imports neither torch nor vLLM at import time: qgate's harness runs `python -m
qgate_kernels.overrides` with an arm's env to check its overrides in the very environment the engine
will see, before any engine starts.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

# The route env's names and its static checks (switch values, override names) live in qgate_route_env,
# shared with the harness; static_problems and switched_on are also read here as overrides.<name>.
from qgate_route_env import (
    ROUTE_GDN,
    ROUTE_GEMV,
    ROUTE_HC,
    ROUTE_TOPK,
    ROUTES,
    override_var,
    split_spec,
)
from qgate_route_env import static_problems as static_problems
from qgate_route_env import switched_on as switched_on

# Route name -> the function of qgate_kernels.ops that implements it (an override must match its signature).
ROUTE_OP: dict[str, str] = {
    ROUTE_GEMV: "gemv",
    ROUTE_HC: "hc_combine_and_mix",  # mix sites call it with a zero block output (plugin)
    ROUTE_GDN: "gdn_input",
    ROUTE_TOPK: "qsa_topk",
}


class OverrideError(ValueError):
    """A route switch or override is unusable; str() is one line naming the variable and the value."""


def parse_spec(var: str, spec: str) -> tuple[str, str]:
    """`package.module:function` -> (module, function); OverrideError naming var for anything else."""
    parts = split_spec(spec)
    if parts is None:
        raise OverrideError(f"{var}={spec!r}: expected 'package.module:function'")
    return parts


def _reference_signature(route: str) -> inspect.Signature:
    from qgate_kernels import ops  # imports torch: only when an override is actually checked

    return inspect.signature(getattr(ops, ROUTE_OP[route]))


def check_signature(route: str, fn: Callable[..., Any], var: str, spec: str) -> None:
    """The override must accept the route op's positional arguments and need nothing more."""
    ref = _reference_signature(route)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ref_params = [p for p in ref.parameters.values() if p.kind in positional]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise OverrideError(f"{var}={spec!r}: cannot read the signature of the function ({exc})") from None
    expected = f"{ROUTE_OP[route]}{ref}"
    # The plugin passes the op's required keyword-only arguments by name (layout=, hc_count=, ...).
    keywords = {
        p.name: object()
        for p in ref.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    }
    try:
        sig.bind(*[object()] * len(ref_params), **keywords)
    except TypeError:
        raise OverrideError(
            f"{var}={spec!r}: signature {fn.__name__}{sig} does not match the route op {expected}"
        ) from None
    # Extra positional parameters with defaults are fine; an extra one without a default is caught by bind.


def resolve(route: str, spec: str) -> Callable[..., Any]:
    """Import and check the override for route; OverrideError (one line) when unusable."""
    var = override_var(route)
    module_name, attr = parse_spec(var, spec)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's spec problem: report it in one line
        raise OverrideError(
            f"{var}={spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OverrideError(f"{var}={spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OverrideError(f"{var}={spec!r}: {attr!r} is not callable")
    check_signature(route, obj, var, spec)
    return obj


def mix_through(combine_and_mix: Callable[..., Any]) -> Callable[..., Any]:
    """An HC override implements combine_and_mix; mix(h) is combine_and_mix(h, 0, None) exactly
    (h_s + 1 * 0 = h_s in any float format), so mix sites call it with a zero block output."""

    def mix(h: Any, norm_weight: Any, w_down: Any, w_up: Any, **kw: Any) -> Any:
        zero = h.new_zeros((h.shape[0], h.shape[1] // kw["hc_count"]))  # [T, HS]
        _, block_input, injection = combine_and_mix(h, zero, None, norm_weight, w_down, w_up, **kw)
        return h, block_input, injection

    return mix


def op_replacements(env: Mapping[str, str]) -> dict[str, Callable[..., Any]]:
    """The functions of qgate_kernels.ops that the overrides in env replace, by op name, as the plugin
    would call them (HC's mix through combine_and_mix): what the operator screen runs for an arm.
    OverrideError (one line) when an override is unusable."""
    ops: dict[str, Callable[..., Any]] = {}
    for route, spec in overrides_in(env).items():
        fn = resolve(route, spec)
        ops[ROUTE_OP[route]] = fn
        if route == ROUTE_HC:
            ops["hc_mix"] = mix_through(fn)
    return ops


def overrides_in(env: Mapping[str, str]) -> dict[str, str]:
    """Route -> override spec, for the override vars set in env (only known routes)."""
    return {r: env[override_var(r)] for r in ROUTES if env.get(override_var(r), "").strip()}


def env_problems(env: Mapping[str, str]) -> list[str]:
    """Every problem with the route env, including overrides that cannot be imported or do not match."""
    problems = static_problems(env)
    if problems:
        return problems
    for route, spec in overrides_in(env).items():
        try:
            resolve(route, spec)
        except OverrideError as exc:
            problems.append(str(exc))
    return problems


def main() -> int:
    """Check this process's env (route switches, overrides, shims, and the sites of the routes on,
    imported as the plugin will); print {"problems": [...]} as one JSON line; exit 1 when any."""
    from qgate_kernels import shims, sites

    problems = env_problems(os.environ) + shims.problems(os.environ)
    if not problems:
        problems = sites.problems(os.environ, switched_on(os.environ))
    sys.stdout.write(json.dumps({"problems": problems}) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
