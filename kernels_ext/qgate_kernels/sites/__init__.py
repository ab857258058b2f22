"""Where each route hooks into vLLM: the built-in Qwen4Exp sites of vLLM 0.32, and sites a contract names.

A site is `module:Class.method` or `module:function`, keyed `<route>.<kind>`. The built-in sites are
vLLM 0.32's own (`DEFAULT_SITES`); a user's vLLM fork may keep a step in another class, so a contract's
`sites:` map (passed to every vLLM process as the JSON env var `QGATE_SITES`, the same for both arms)
replaces any of them. The replacement must take the same arguments and return what vLLM's does, on
modules with the same attributes (e.g. `hc_norm`, `input_mix_weight_up` for HC).

`problems(env)` resolves the sites of the routes env switches on (importing their modules) and gives one
line per site that is not there, naming the missing attribute; qgate runs it before the engine starts
(`python -m qgate_kernels.overrides` with the arm's env), and the plugin resolves the same sites in each
vLLM process and fails the engine start on a missing one.

No torch or vLLM import at module level.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from qgate_route_env import (
    SITE_GDN_CPU,
    SITE_GDN_CUDA,
    SITE_HC_COMBINE,
    SITE_HC_MIX,
    SITE_TOPK,
    json_object_env,
)
from qgate_route_env import SITES_ENV as SITES_ENV  # tests read it as sites.<name>

_HC_MOD = "vllm.models.qwen4_exp.nvidia.hyperconnection"
_GDN_MOD = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
DEFAULT_SITES: dict[str, str] = {
    SITE_HC_MIX: f"{_HC_MOD}:GatedResidual.mix",
    SITE_HC_COMBINE: f"{_HC_MOD}:GatedResidual.combine_and_mix",
    SITE_GDN_CPU: f"{_GDN_MOD}:QwenGatedDeltaNetAttention.forward_cpu",
    SITE_GDN_CUDA: f"{_GDN_MOD}:QwenGatedDeltaNetAttention.forward_cuda",
    SITE_TOPK: "vllm.models.qwen4_exp.nvidia.ops.qsa_indexer:_topk",
}
# The GEMV route's sites are vLLM's UnquantizedLinearMethod / UnquantizedEmbeddingMethod (every linear
# layer of every model), not nameable per model.


class SiteError(ValueError):
    """A site spec that cannot work; str() is one line naming the site, the spec and what is missing."""


def sites_in(env: Mapping[str, str]) -> dict[str, str]:
    """The effective sites: the built-in ones with QGATE_SITES's entries on top. SiteError when the
    variable is not a JSON object of known keys and `module:qualname` strings."""
    sites = dict(DEFAULT_SITES)
    try:
        named = json_object_env(env, SITES_ENV)
    except ValueError as exc:
        raise SiteError(str(exc)) from None
    for key, spec in named.items():
        if key not in DEFAULT_SITES:
            raise SiteError(f"site {key!r}: unknown (known: {', '.join(DEFAULT_SITES)})")
        if not isinstance(spec, str):
            raise SiteError(f"site {key} = {spec!r}: expected 'module:Class.method' or 'module:function'")
        split_spec(key, spec)
        sites[key] = spec
    return sites


def split_spec(key: str, spec: str) -> tuple[str, list[str]]:
    """`pkg.mod:Class.method` -> ('pkg.mod', ['Class', 'method']); SiteError for anything else."""
    module, sep, qual = spec.strip().partition(":")
    parts = qual.split(".")
    names = module.split(".") + parts
    if not sep or not module or not qual or len(parts) > 2 or not all(n.isidentifier() for n in names):
        raise SiteError(f"site {key} = {spec!r}: expected 'module:Class.method' or 'module:function'")
    return module, parts


def resolve(key: str, spec: str) -> tuple[Any, str, Any]:
    """Import the site: (owner, attribute name, current attribute), the owner being the class of
    `module:Class.method` or the module of `module:function`. SiteError naming what is missing."""
    module_name, parts = split_spec(key, spec)
    try:
        owner: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import failure of a site module is reported in one line
        raise SiteError(
            f"site {key} = {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    where = module_name
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise SiteError(f"site {key} = {spec!r}: module {where!r} has no attribute {part!r}")
        owner = getattr(owner, part)
        where = f"{where}.{part}"
    name = parts[-1]
    if not hasattr(owner, name):
        raise SiteError(f"site {key} = {spec!r}: {where!r} has no attribute {name!r}")
    target = getattr(owner, name)
    if not callable(target):
        raise SiteError(f"site {key} = {spec!r}: {where}.{name} is not callable")
    return owner, name, target


def for_routes(sites: Mapping[str, str], routes: set[str] | frozenset[str]) -> dict[str, str]:
    """The sites of the given routes."""
    return {key: spec for key, spec in sites.items() if key.split(".", 1)[0] in routes}


def problems(env: Mapping[str, str], routes_on: set[str]) -> list[str]:
    """One line per site of a switched-on route that is not usable in this interpreter."""
    try:
        sites = sites_in(env)
    except SiteError as exc:
        return [str(exc)]
    out = []
    for key, spec in for_routes(sites, routes_on).items():
        try:
            resolve(key, spec)
        except SiteError as exc:
            out.append(str(exc))
    return out
