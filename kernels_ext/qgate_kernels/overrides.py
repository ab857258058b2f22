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

# Route name -> the env var that switches it on.
ROUTE_ENV: dict[str, str] = {
    "fp16_gemv": "VLLM_SM70_QWEN38_FP16_GEMV",
    "fused_hc_fp16": "VLLM_SM70_QWEN38_FUSED_HC_FP16",
    "fused_gdn_input_fp16": "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16",
    "qsa_topk": "VLLM_SM70_QWEN38_QSA_TOPK",
}
# Route name -> the function of qgate_kernels.ops that implements it (an override must match its signature).
ROUTE_OP: dict[str, str] = {
    "fp16_gemv": "gemv",
    "fused_hc_fp16": "hc_combine_and_mix",  # mix sites call it with a zero block output (plugin)
    "fused_gdn_input_fp16": "gdn_input",
    "qsa_topk": "qsa_topk",
}
OVERRIDE_PREFIX = "QGATE_ROUTE_IMPL_"

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off", ""})


class OverrideError(ValueError):
    """A route switch or override is unusable; str() is one line naming the variable and the value."""


def override_var(route: str) -> str:
    """`fp16_gemv` -> `QGATE_ROUTE_IMPL_FP16_GEMV`."""
    return OVERRIDE_PREFIX + route.upper()


def parse_switch(value: str | None) -> bool | None:
    """True / False for a valid switch value (1/0, true/false, yes/no, on/off), None for anything else."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    return None


def switched_on(env: Mapping[str, str]) -> set[str]:
    """Route names whose switch is on in env (invalid values count as off; `env_problems` reports them)."""
    return {route for route, var in ROUTE_ENV.items() if parse_switch(env.get(var)) is True}


def parse_spec(var: str, spec: str) -> tuple[str, str]:
    """`package.module:function` -> (module, function); OverrideError naming var for anything else."""
    module, sep, attr = spec.strip().partition(":")
    names = module.split(".") + attr.split(".")
    if not sep or not module or not attr or not all(n.isidentifier() for n in names):
        raise OverrideError(f"{var}={spec!r}: expected 'package.module:function'")
    return module, attr


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


def static_problems(env: Mapping[str, str]) -> list[str]:
    """Problems visible without importing anything: switch values, unknown or orphan override vars."""
    problems = []
    for var in ROUTE_ENV.values():
        if parse_switch(env.get(var)) is None:
            problems.append(f"{var}={env[var]!r}: expected 1 or 0 (also true/false, yes/no, on/off)")
    known = {override_var(r): r for r in ROUTE_ENV}
    on = switched_on(env)
    for var in sorted(k for k in env if k.startswith(OVERRIDE_PREFIX)):
        route = known.get(var)
        if route is None:
            problems.append(f"{var}: unknown route override (known: {', '.join(sorted(known))})")
            continue
        if route not in on:
            # An override for a route that is off would silently do nothing: refuse it.
            problems.append(f"{var} is set but the route is off ({ROUTE_ENV[route]} is not 1)")
            continue
        try:
            parse_spec(var, env[var])
        except OverrideError as exc:
            problems.append(str(exc))
    return problems


def overrides_in(env: Mapping[str, str]) -> dict[str, str]:
    """Route -> override spec, for the override vars set in env (only known routes)."""
    return {r: env[override_var(r)] for r in ROUTE_ENV if env.get(override_var(r), "").strip()}


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
