"""The env vocabulary between qgate and its route plugin, in one place: route names, their switches and
override variables, platform shims and route sites, the attestation folder, the prefixes the launcher
keeps per arm, and the one reading of a switch value.

Both sides import this module: the harness (contract checks, the launcher, routes, compare) and the
plugin in kernels_ext (qgate_kernels.overrides, plugin, attest, shims, sites, ops), which runs in vLLM
processes that qgate starts. It is a package of its own, below both (issue 39): the harness imports
qgate_kernels (`qgate run ops`, `bench ops`), so the plugin importing `qgate` made the two packages
import each other; now every arrow points down, qgate -> qgate_kernels -> qgate_route_env and
qgate -> qgate_route_env. It ships with the harness distribution (harness/, beside qgate), not with
qgate_kernels, because the harness must load it without torch or the compiled extension (`import
qgate_kernels` loads both, and `qgate compare` runs where kernels_ext is not installed). It imports
only the standard library, so it can never pull vLLM or torch into the harness or anything into the
plugin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ROUTE_GEMV = "fp16_gemv"
ROUTE_HC = "fused_hc_fp16"
ROUTE_GDN = "fused_gdn_input_fp16"
ROUTE_TOPK = "qsa_topk"
# A route is switched on by SWITCH_PREFIX + ROUTE.upper(): VLLM_SM70_QWEN38_FP16_GEMV=1, ...
SWITCH_PREFIX = "VLLM_SM70_QWEN38_"
# Route name -> the env var that switches it on, in report order.
ROUTES: dict[str, str] = {
    route: SWITCH_PREFIX + route.upper() for route in (ROUTE_GEMV, ROUTE_HC, ROUTE_GDN, ROUTE_TOPK)
}
# QGATE_ROUTE_IMPL_<ROUTE>=package.module:function sends a route to another implementation.
OVERRIDE_PREFIX = "QGATE_ROUTE_IMPL_"

# Where every vLLM process's plugin writes its counts (`<process>-<pid>.json`); the launcher sets it.
ATTEST_DIR_ENV = "QGATE_ATTEST_DIR"

# Platform shims (qgate_kernels.shims) and route sites (qgate_kernels.sites), both arms alike.
SHIMS_ENV = "QGATE_SHIMS"
SITES_ENV = "QGATE_SITES"
SHIM_PIL_IMAGE = "qwen2vl_pil_image_processor"
SHIM_HC_TORCH = "qwen4exp_hc_torch_cpu"
SHIM_FP16_CPU = "qwen4exp_fp16_cpu"
# Engine shims of any platform (CUDA too): the HC parameters in the model dtype when it is fp16 (vLLM
# 0.32's Qwen4Exp builds them bf16), and GDN prefill on Triton where vLLM picks an absent FlashInfer.
SHIM_HC_PARAMS_FP16 = "qwen4exp_hc_params_fp16"
SHIM_GDN_PREFILL_TRITON = "gdn_prefill_triton_fallback"
SHIMS = (SHIM_PIL_IMAGE, SHIM_HC_TORCH, SHIM_FP16_CPU, SHIM_HC_PARAMS_FP16, SHIM_GDN_PREFILL_TRITON)
SITE_HC_MIX = f"{ROUTE_HC}.mix"
SITE_HC_COMBINE = f"{ROUTE_HC}.combine_and_mix"
SITE_GDN_CPU = f"{ROUTE_GDN}.forward_cpu"
SITE_GDN_CUDA = f"{ROUTE_GDN}.forward_cuda"
SITE_TOPK = f"{ROUTE_TOPK}.topk"
SITE_KEYS = (SITE_HC_MIX, SITE_HC_COMBINE, SITE_GDN_CPU, SITE_GDN_CUDA, SITE_TOPK)

# Activation recording for the real-weight operator screen (qgate_kernels.record): a folder, and how
# many batch-one decode calls per site to keep.
RECORD_DIR_ENV = "QGATE_RECORD_DIR"
RECORD_CALLS_ENV = "QGATE_RECORD_CALLS"

# The roles a contract lists per route (`routes: fp16_gemv: roles: [...]`), both arms alike: a JSON
# object {route: [role, ...]}. A role is the last name of a vLLM module (Qwen4ExpForCausalLM's). Unset:
# the GEMV route takes GEMV_DEFAULT_ROLES and nothing checks them; listed: exactly those, each must
# match a layer at engine start and show hits (routes.<route>.ran).
ROLES_ENV = "QGATE_ROUTE_ROLES"
ROLE_ROUTES = (ROUTE_GEMV,)  # the routes whose roles a contract can list
# The unquantized decode projections of Qwen4Exp outside the GDN-input and HC routes (docs/routes.md):
# GDN out, QSA qkv (+ the packed indexer q/k) and o, shared-expert gate_up and down, the MoE router,
# the shared expert's gate, lm_head. qkv_proj / o_proj / gate_up_proj / down_proj are Qwen3's too.
GEMV_DEFAULT_ROLES = (
    "out_proj",
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "gate",
    "shared_expert_gate",
    "lm_head",
)

# Inherited variables in qgate's and kernels_ext's namespaces would change what runs behind the
# contract's back (route switches and overrides, but also the kernels' own knobs: QGATE_HC_IMPL,
# QGATE_HC_PHASE_STOP, ...): the launcher drops every one of them unless the arm sets it, and lists what it
# dropped in the result (`dropped_env`). "VLLM_SM70_" is wider than SWITCH_PREFIX on purpose: any switch
# of the SM70 fork changes what runs. The launcher sets its own QGATE_ variables after the drop.
QGATE_PREFIX = "QGATE_"
SM70_PREFIX = "VLLM_SM70_"
ARM_ENV_PREFIXES = (SM70_PREFIX, QGATE_PREFIX)
# Inherited variables outside those namespaces that can change what vLLM, torch or the kernels do: the
# launcher passes them on (a user's CUDA_VISIBLE_DEVICES or OMP_NUM_THREADS is theirs to set) and records
# them in the result (`inherited_env`); `compare` refuses arms whose records differ in one that neither
# arm's contract env sets (two arms run from different shells).
RECORDED_ENV_PREFIXES = (
    "VLLM_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS", "CUDNN_", "NCCL_", "NVIDIA_", "TRITON_", "OMP_", "KMP_",
    "GOMP_", "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "LD_PRELOAD",
    "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED",
)  # fmt: skip

SWITCH_VALUES = "1 or 0 (also true/false, yes/no, on/off)"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off", ""})


class SwitchError(ValueError):
    """A route switch with a value that is neither on nor off; str() is one line naming it."""


# The route a CUDA kernel of kernels_ext (csrc/) serves, by the C++ name a profiler shows (`void
# qgate::gemv_one_group_kernel<1, 10, qgate::(anonymous namespace)::GdnFlatRows<...> >(...)`): the first
# part found wins (the GDN input and the HC down rows run on the gemv kernels too). qgate.timeline ties
# the kernels of a decode-step timeline to routes with it; tests/kernels/test_kernel_names.py keeps it
# covering every kernel and row type the sources define.
KERNEL_ROUTES = (
    ("Gdn", ROUTE_GDN),  # GdnFlatRows, GdnInterleavedRows
    ("HcDownRows", ROUTE_HC),
    ("qgate::hc_", ROUTE_HC),  # hc_tma_kernel, hc_norm_kernel, hc_up_mix_kernel
    ("qsa_topk", ROUTE_TOPK),  # qsa_topk_push_kernel, qsa_topk_kernel
    ("gemv", ROUTE_GEMV),  # gemv_one_group_kernel, gemv_rows_kernel on GemvRows
)


def kernel_route(name: str) -> str | None:
    """The route of a kernels_ext kernel by its profiler name; None for any other kernel (vLLM's)."""
    if "qgate::" not in name:
        return None
    return next((route for part, route in KERNEL_ROUTES if part in name), None)


def override_var(route: str) -> str:
    """`fp16_gemv` -> `QGATE_ROUTE_IMPL_FP16_GEMV`."""
    return OVERRIDE_PREFIX + route.upper()


def parse_switch(value: object) -> bool | None:
    """True / False for a switch value (1/0, true/false, yes/no, on/off, any case; unset is off),
    None for anything else: the caller decides whether that is an error (it is never on)."""
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    return None


def switch_problems(env: Mapping[str, object]) -> list[str]:
    """One line per route switch in env whose value is neither on nor off."""
    return [
        f"{var}={env[var]!r}: expected {SWITCH_VALUES}"
        for var in ROUTES.values()
        if parse_switch(env.get(var)) is None
    ]


def switched_on(env: Mapping[str, object]) -> set[str]:
    """Route names whose switch is on in env; an invalid value counts as off (switch_problems names it)."""
    return {route for route, var in ROUTES.items() if parse_switch(env.get(var)) is True}


def routes_on(env: Mapping[str, object]) -> list[str]:
    """Route names whose switch is on, in ROUTES order; SwitchError for a value neither on nor off."""
    problems = switch_problems(env)
    if problems:
        raise SwitchError(problems[0])
    return [route for route, var in ROUTES.items() if parse_switch(env.get(var))]


def split_spec(spec: str) -> tuple[str, str] | None:
    """`package.module:function` -> (module, function); None for anything else."""
    module, sep, attr = spec.strip().partition(":")
    names = module.split(".") + attr.split(".")
    if not sep or not module or not attr or not all(n.isidentifier() for n in names):
        return None
    return module, attr


def static_problems(env: Mapping[str, object]) -> list[str]:
    """Problems with the route env visible without importing anything, one line each: switch values,
    unknown override variables, overrides of routes that are off, override specs that are no
    `package.module:function`. Importing and checking the overrides is qgate_kernels.overrides' job."""
    problems = switch_problems(env)
    known = {override_var(r): r for r in ROUTES}
    on = switched_on(env)
    for var in sorted(k for k in env if k.startswith(OVERRIDE_PREFIX)):
        route = known.get(var)
        if route is None:
            problems.append(f"{var}: unknown route override (known: {', '.join(sorted(known))})")
        elif route not in on:
            # An override for a route that is off would silently do nothing: refuse it.
            problems.append(f"{var} is set but the route is off ({ROUTES[route]} is not 1)")
        elif split_spec(str(env[var])) is None:
            problems.append(f"{var}={env[var]!r}: expected 'package.module:function'")
    return problems


def json_object_env(env: Mapping[str, object], name: str) -> dict[str, Any]:
    """The JSON object in env[name] ({} when unset or blank); ValueError, one line, for anything else."""
    raw = str(env.get(name, "") or "").strip()
    if not raw:
        return {}
    try:
        named = json.loads(raw)
    except ValueError:
        named = None
    if not isinstance(named, dict):
        raise ValueError(f"{name}={raw!r}: not a JSON object")
    return named


def listed_roles(env: Mapping[str, object]) -> dict[str, list[str]]:
    """The roles ROLES_ENV lists per route ({} when unset); ValueError, one line, for anything but a
    JSON object of known routes to non-empty lists of distinct identifiers."""
    named = json_object_env(env, ROLES_ENV)
    out: dict[str, list[str]] = {}
    for route, roles in named.items():
        if route not in ROLE_ROUTES:
            raise ValueError(f"routes.{route}: takes no roles (known: {', '.join(ROLE_ROUTES)})")
        if not isinstance(roles, list) or not roles:
            raise ValueError(f"routes.{route}.roles = {roles!r}: expected a non-empty list of module names")
        for role in roles:
            if not isinstance(role, str) or not role.isidentifier():
                raise ValueError(f"routes.{route}.roles: {role!r} is not a module name")
        if len(set(roles)) != len(roles):
            raise ValueError(f"routes.{route}.roles: {roles!r} lists a role twice")
        out[str(route)] = list(roles)
    return out


def platform_env_problem(shims: list[str], sites: Mapping[str, str]) -> str | None:
    """One line for an unknown shim, an unknown site key or a site spec that is not
    'module:Class.method' / 'module:function'; None when both are usable as far as syntax goes."""
    for name in shims:
        if name not in SHIMS:
            return f"shims: {name!r} is not a known shim (known: {', '.join(SHIMS)})"
    for key, spec in sites.items():
        if key not in SITE_KEYS:
            return f"sites.{key}: not a known site (known: {', '.join(SITE_KEYS)})"
        module, sep, qual = str(spec).strip().partition(":")
        names = module.split(".") + qual.split(".")
        if not sep or len(qual.split(".")) > 2 or not all(n.isidentifier() for n in names):
            return f"sites.{key} = {spec!r}: expected 'module:Class.method' or 'module:function'"
    return None


def platform_env(shims: list[str], sites: Mapping[str, str]) -> dict[str, str]:
    """The env that carries a contract's shims and sites to every vLLM process (both arms alike)."""
    env = {}
    if shims:
        env[SHIMS_ENV] = ",".join(shims)
    if sites:
        env[SITES_ENV] = json.dumps(dict(sorted(sites.items())), separators=(",", ":"))
    return env
