"""vLLM general plugin: switch the kernels_ext routes on inside vLLM by env var, and count what ran.

Entry point `vllm.general_plugins: qgate_routes = qgate_kernels.plugin:register`; vLLM calls `register()`
in its front-end, engine-core and worker processes, possibly several times per process (idempotent).
With no route switched on it returns at once: nothing is patched, imported or written.

When a route is on (its switch variable: `qgate_route_env.ROUTES`), at its sites (`sites.DEFAULT_SITES`,
vLLM 0.32's Qwen4Exp call sites, or the ones a contract names through QGATE_SITES):
- fp16_gemv: the unquantized linear layers whose last module name is one of the contract's listed roles
  (`routes: fp16_gemv: roles:`, env QGATE_ROUTE_ROLES), else of `GEMV_ROLES` (Qwen4Exp's decode
  projections outside the GDN and HC routes: out_proj, qkv_proj, o_proj, gate_up_proj, down_proj, the
  router `gate`, shared_expert_gate, lm_head) plus, while the HC route is off, Qwen4Exp's HC projections
  (`HC_PROJ_ROLES`). A listed role that matches no layer of the loaded model fails the engine start
  with one line. Layers whose linear method is a vLLM subclass with its own `apply` (on Hopper with bf16
  vLLM 0.32 swaps the planned layers to `Qwen4ExpLowLatencyLinearMethod`) are taken too: their
  fallbacks run that subclass's apply. Batch-one fp16 or bf16 calls (x [1, K], the weight's dtype) run
  `ops.gemv(weight, x, static_weight=True)` (+ bias); every other call keeps vLLM's path and counts a
  fallback with its reason.
- fused_hc_fp16: Qwen4Exp's `GatedResidual.mix` / `combine_and_mix` (also the final mixer) run
  `ops.hc_mix` / `ops.hc_combine_and_mix` for batch one (sites/hc.py).
(The routes' names say fp16, the SM70 premise; every site routes bf16 as well (registry.ROUTED_DTYPES):
the kernels take it on the CPU and on CUDA, and bf16 is the H200's own dtype and stock Qwen4Exp's.)
- fused_gdn_input_fp16: `QwenGatedDeltaNetAttention.forward_cpu/forward_cuda` Part 1 (the two input
  projections and the split into mixed_qkv, z, b, a) runs `ops.gdn_input(..., layout=...)` for batch
  one, for the flat layout (Qwen3.5, Qwen4Exp) and the interleaved one (Qwen3-Next) (sites/gdn.py).
- qsa_topk: `qwen4_exp/nvidia/ops/qsa_indexer.py::_topk` runs `ops.qsa_topk` (sites/topk.py).
(static_weight: a model's weights are not written during inference, so on sm_90 the kernels may stream
them while the previous kernel finishes; an override gets no such argument.)
A route with no wired site in the loaded model counts `no_site_in_model`, so a switched-on route that
cannot run never looks like a missing plugin, and never passes as a hit. A site missing from the
installed vLLM (another version, a fork) fails the engine start with one line naming the attribute.
Layers of another float dtype (a float32 model) are wired too, keep no weight, and count `dtype`.
Platform shims (qgate_kernels.shims, QGATE_SHIMS) are applied first, in both arms, and never count.

The decision (route or fallback) is made per call inside the custom op `qgate_routes::linear` /
`qgate_routes::gdn_input`: vLLM traces the model once (torch.compile) and would otherwise bake in
whichever branch the trace saw. Outside a trace (enforce_eager, the CPU demo, and vLLM 0.32's Qwen4Exp
on CUDA, which runs CUDA graphs without torch.compile) every site skips the op's dispatcher round trip
(~10 us a call on the CPU) and runs the same per-call decision directly. The set of routes on joins
vLLM's compile-cache key, so no arm reuses another arm's compiled graph. Counts go to `attest.Recorder`
(files in $QGATE_ATTEST_DIR); a routed linear layer counts its hits on its own tally (one integer
increment a call), written with the other counts. Under CUDA graphs the op's body runs at capture only:
graphs.py notes what each graph captured and adds it at every replay, so the written hits are executions
(eager calls + captured calls x replays), with the captures per role beside.

Memory: vLLM's CPU path repacks linear weights and drops `layer.weight`; the route keeps a reference to
the fp16 / bf16 weight taken before the repack, so on the CPU every routed layer's weight is held twice
(vLLM's packed copy + the original). On the GPU nothing is repacked and the reference costs nothing.

This module holds registration and vLLM's patches; each route's routed site is its own module under
sites/ (gemv, hc, gdn, topk), sharing this process's state through registry.py. This module, the site
modules and shims.py import vLLM (inside the functions that patch it).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch  # vLLM has imported it already when it loads plugins

from qgate_kernels import attest, graphs, overrides, registry, shims, sites
from qgate_kernels.sites import gdn, gemv, hc, topk
from qgate_route_env import ATTEST_DIR_ENV, listed_roles
from qgate_route_env import ROUTE_GDN as GDN_ROUTE
from qgate_route_env import ROUTE_GEMV as GEMV_ROUTE
from qgate_route_env import ROUTE_HC as HC_ROUTE
from qgate_route_env import ROUTE_TOPK as TOPK_ROUTE
from qgate_route_env import SITE_HC_MIX as HC_MIX_IMPL  # the mix implementation is keyed like its site

logger = logging.getLogger("qgate_kernels.plugin")

NO_SITE = "no_site_in_model"


_REGISTERED = False


def register() -> None:
    """vLLM's plugin hook: read the switches, resolve implementations, patch vLLM once per process."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    routes_on = overrides.switched_on(os.environ)
    shim_names = shims.requested(os.environ)
    if not routes_on and not shim_names:
        return  # quiet and cheap: the control arm runs vLLM untouched
    recorder = attest.Recorder(
        os.environ.get(ATTEST_DIR_ENV), sorted(routes_on), overrides.overrides_in(os.environ)
    )
    if shim_names:
        _apply_shims(recorder, shim_names)
    if not routes_on:
        recorder.flush(True)
        return
    impls, error = _resolve_impls(routes_on)
    site_specs, site_error = _resolve_sites(routes_on)
    try:
        listed = tuple(listed_roles(os.environ).get(GEMV_ROUTE, ()))
    except ValueError as exc:
        listed, error = (), error or site_error or str(exc)
    error = error or site_error
    overridden = frozenset(overrides.overrides_in(os.environ))
    registry.STATE = registry.State(
        frozenset(routes_on), impls, recorder, error, [], _op_counter(), overridden, site_specs
    )
    registry.STATE.gemv_listed = listed
    if error is not None:
        # vLLM only logs a plugin's exception; the engine must not start half-routed, so the model
        # loader hook raises this message instead (see _after_load).
        logger.error("qgate routes: %s", error)
        recorder.error(error)
    try:
        _define_ops()
        _patch_vllm(routes_on)
        graphs.install()
    except Exception as exc:  # vLLM would only log it: leave the reason in the attestation file too
        recorder.error(f"plugin setup failed: {type(exc).__name__}: {exc}")
        raise
    recorder.flush(True)
    logger.info("qgate routes on: %s (overrides: %s)", sorted(routes_on), recorder.overrides or "none")


def _apply_shims(recorder: attest.Recorder, names: list[str]) -> None:
    """Platform shims (qgate_kernels.shims), in both arms alike; never route hits. vLLM only logs a
    plugin's exception, so a shim that cannot be applied is recorded and re-raised: the model import
    or the engine start then fails on the missing bridge."""
    try:
        recorder.shims = shims.apply(names, recorder.shim_call)
    except Exception as exc:
        recorder.error(f"shims: {type(exc).__name__}: {exc}")
        raise
    logger.info("qgate platform shims: %s", recorder.shims)


def _resolve_sites(routes_on: set[str]) -> tuple[dict[str, str], str | None]:
    """The sites of the routes on, each imported once here (after the shims): a missing one is the
    engine start's error, one line naming the attribute."""
    try:
        specs = sites.for_routes(sites.sites_in(os.environ), routes_on)
        for key, spec in specs.items():
            sites.resolve(key, spec)
    except sites.SiteError as exc:
        return {}, str(exc)
    return specs, None


def _resolve_impls(routes_on: set[str]) -> tuple[dict[str, Callable[..., Any]], str | None]:
    problems = overrides.static_problems(os.environ)
    if problems:
        return {}, problems[0]
    try:
        from qgate_kernels import ops
    except Exception as exc:  # a broken extension build must stop the engine, not run vLLM's path
        return {}, f"cannot import qgate_kernels.ops ({type(exc).__name__}: {exc})"
    impls = {r: getattr(ops, overrides.ROUTE_OP[r]) for r in routes_on}
    for r in {GEMV_ROUTE, GDN_ROUTE} & routes_on:
        # A model's weights are not written during inference: the kernel may stream them early (PDL).
        impls[r] = functools.partial(impls[r], static_weight=True)
    if HC_ROUTE in routes_on:
        impls[HC_MIX_IMPL] = ops.hc_mix
    for route, spec in overrides.overrides_in(os.environ).items():
        try:
            impls[route] = overrides.resolve(route, spec)
        except overrides.OverrideError as exc:
            return {}, str(exc)
        if route == HC_ROUTE:
            impls[HC_MIX_IMPL] = overrides.mix_through(impls[route])
    return impls, None


def _op_counter() -> Callable[[], dict[str, dict[str, int]]] | None:
    try:
        from qgate_kernels import ops
    except Exception:
        return None
    return ops.fallback_counts


# --- custom ops: the per-call decision, opaque to vLLM's torch.compile trace ----------------------

_OPS_DEFINED = False


def _define_ops() -> None:
    global _OPS_DEFINED
    if _OPS_DEFINED:
        return
    _OPS_DEFINED = True
    gemv.define_op()
    gdn.define_op()


# --- patches of vLLM (class level, once per process) ----------------------------------------------


def _stashing_pwal(orig: Callable[..., Any], orig_apply: Callable[..., Any], cls: type) -> Callable[..., Any]:
    def process_weights_after_loading(self: Any, layer: Any) -> None:
        assert registry.STATE is not None
        role = gemv.layer_role(layer)
        weight = getattr(layer, "weight", None)
        keep = weight.detach() if gemv.float_matrix(weight) else None  # before vLLM's CPU repack drops it
        orig(self, layer)
        if keep is None:
            return
        on = registry.STATE.routes_on
        hc_proj = role in gemv.HC_PROJ_ROLES
        if hc_proj and HC_ROUTE in on:
            layer._qgate_weight = keep  # wired per HC module after the load (sites/hc.py wire_hc)
        elif (
            GEMV_ROUTE in on
            and gemv.gemv_role(role, HC_ROUTE in on)
            and not (role in gdn.GDN_ROLES and GDN_ROUTE in on)
        ):
            own_apply = gemv.take_apply(type(self)) if type(self) is not cls else orig_apply
            site = gemv.LinearSite(layer, role, keep, own_apply)
            layer._qgate_site = registry.add_site(site, GEMV_ROUTE, role)
        elif role in gdn.GDN_ROLES and GDN_ROUTE in on:
            layer._qgate_weight = keep  # wired per GDN layer after the load (sites/gdn.py wire_gdn)

    return registry.patched(process_weights_after_loading, orig)


def _patch_vllm(routes_on: set[str]) -> None:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if "_qgate_orig" in UnquantizedLinearMethod.__dict__["apply"].__dict__:
        return  # patched already (the module was imported twice)
    lin_apply = registry.unpatched(UnquantizedLinearMethod, "apply")
    lin_pwal = registry.unpatched(UnquantizedLinearMethod, "process_weights_after_loading")
    UnquantizedLinearMethod.apply = gemv.routed_apply(lin_apply)
    UnquantizedLinearMethod.process_weights_after_loading = _stashing_pwal(
        lin_pwal, lin_apply, UnquantizedLinearMethod
    )
    emb_apply = registry.unpatched(UnquantizedEmbeddingMethod, "apply")
    UnquantizedEmbeddingMethod.apply = gemv.routed_apply(emb_apply)
    _patch_loaders()
    _patch_compile_factors(routes_on)
    if registry.STATE is None or registry.STATE.error is not None:
        return  # the loaders raise the error; no site is patched
    _patch_sites(routes_on)


def _patch_sites(routes_on: set[str]) -> None:
    """Patch each site of the routes on (resolved in register, so present) with its routed version."""
    assert registry.STATE is not None and registry.STATE.site_specs is not None
    for key, spec in registry.STATE.site_specs.items():
        route, kind = key.split(".", 1)
        owner, name, current = sites.resolve(key, spec)  # a fork's class may inherit the method
        orig = getattr(current, "_qgate_orig", current)
        if route == GDN_ROUTE:
            setattr(owner, name, gdn.gdn_forward(orig, "cpu" if kind == "forward_cpu" else "cuda"))
        elif route == HC_ROUTE:
            _HC_ORIG[kind] = orig
            setattr(owner, name, hc.patch_hc(owner, kind, orig))
        elif route == TOPK_ROUTE:
            where = topk.patch_topk(owner, name, orig)
            logger.info("qgate qsa_topk patched at %s", "; ".join(where))
    if HC_ROUTE in routes_on:
        hc.define_hc_ops()
    if TOPK_ROUTE in routes_on:
        topk.define_topk_op()


_HC_ORIG: dict[str, Callable[..., Any]] = {}


def _patch_compile_factors(routes_on: set[str]) -> None:
    """Give each route set its own torch.compile cache entry.

    vLLM keys its compile caches (the AOT artifact under VLLM_CACHE_ROOT/torch_compile_cache, the
    inductor cache) on vLLM's env vars, the config and the traced source files, not on our switches:
    without this an arm could load another arm's compiled graph (a control running the route ops, or
    a candidate running none, or the sites of another route set).
    """
    import vllm.envs as envs

    orig = getattr(envs.compile_factors, "_qgate_orig", envs.compile_factors)
    tag = ",".join(sorted(routes_on))

    def compile_factors() -> dict[str, object]:
        factors = dict(orig())
        factors["QGATE_ROUTES"] = tag
        return factors

    envs.compile_factors = registry.patched(compile_factors, orig)


def _patch_loaders() -> None:
    import vllm.model_executor.model_loader  # noqa: F401  (defines every loader class)
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    todo, seen = [BaseModelLoader], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if "load_model" in cls.__dict__:
            cls.load_model = _hooked_load(registry.unpatched(cls, "load_model"))


def _hooked_load(orig: Callable[..., Any]) -> Callable[..., Any]:
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        assert registry.STATE is not None
        if registry.STATE.error is not None:
            raise RuntimeError(f"qgate routes: {registry.STATE.error}")
        start = len(registry.STATE.sites)
        model = orig(self, *args, **kwargs)
        if not getattr(model, "_qgate_wired", False):  # a subclass's load_model may call super()'s
            model._qgate_wired = True
            _after_load(model, start)
        return model

    return registry.patched(load_model, orig)


def _after_load(model: Any, start: int) -> None:
    """Wire the model-level sites (lm_head, GDN layers); count routes that found nowhere to run."""
    assert registry.STATE is not None
    if GEMV_ROUTE in registry.STATE.routes_on:
        gemv.wire_lm_head(model)
    if GDN_ROUTE in registry.STATE.routes_on:
        gdn.wire_gdn(model)
    if HC_ROUTE in registry.STATE.routes_on:
        hc.wire_hc(model, registry.site_owner(f"{HC_ROUTE}.mix"), _HC_ORIG)
    registry.STATE.recorder.counters.models_loaded += 1
    # the worker's tensor parallel rank, set up by vLLM before the load: qgate asks each rank for hits
    registry.STATE.recorder.rank = attest.parallel_rank() or (0, 1)
    _check_listed_roles(model, start)
    wired = {site.route for site in registry.STATE.sites[start:]}
    if TOPK_ROUTE in registry.STATE.routes_on:
        if topk.model_has_qsa(model):
            wired.add(TOPK_ROUTE)
            registry.STATE.recorder.site(TOPK_ROUTE, "topk")
    for route in sorted(registry.STATE.routes_on - wired):
        registry.STATE.recorder.fallback(route, NO_SITE)
    registry.STATE.recorder.flush(True)


def _check_listed_roles(model: Any, start: int) -> None:
    """A contract's GEMV role that matches no routed layer of this model fails the engine start, in
    one line naming it and the model's linear layer names."""
    assert registry.STATE is not None
    if GEMV_ROUTE not in registry.STATE.routes_on or not registry.STATE.gemv_listed:
        return
    wired = {s.role for s in registry.STATE.sites[start:] if s.route == GEMV_ROUTE}
    missing = [r for r in registry.STATE.gemv_listed if r not in wired]
    if not missing:
        return
    names = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and hasattr(m, "quant_method")}
    )
    message = (
        f"routes.{GEMV_ROUTE}.roles: {', '.join(missing)} match no unquantized linear layer of "
        f"{type(model).__name__} (its linear layers: {', '.join(names)})"
    )
    registry.STATE.recorder.error(message)
    registry.STATE.recorder.flush(True)
    raise RuntimeError(f"qgate routes: {message}")


# --- the routed call outside vLLM: `qgate bench ops --device cpu` times it against the op alone ----


class _StandaloneLayer:
    """What a routed linear layer needs from vLLM's layer object (weakly referenced by its site)."""

    quant_method = None


def standalone_linear(weight: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], attest.Tally]:
    """(call, tally): `call(x)` is a routed linear layer on `weight` [N, K] called as vLLM's eager decode
    calls it (UnquantizedLinearMethod.apply as patched here -> the site -> the op, counted on `tally`).

    For the microbenchmark of the plugin's per-call cost only: it installs a GEMV-only plugin state
    (no attestation file, no override) in a process where the plugin is not registered, and refuses
    to run inside a vLLM process that registered it.
    """
    if _REGISTERED:
        raise RuntimeError("standalone_linear: the route plugin is registered in this process (vLLM)")
    from qgate_kernels import ops

    if registry.STATE is None:
        impls = {GEMV_ROUTE: functools.partial(ops.gemv, static_weight=True)}
        recorder = attest.Recorder(None, [GEMV_ROUTE], {})
        registry.STATE = registry.State(
            frozenset({GEMV_ROUTE}), impls, recorder, None, [], ops.fallback_counts
        )
    _define_ops()  # a traced call (torch.compile) runs the op, as inside vLLM
    graphs.install()  # a call captured into a CUDA graph counts at every replay, as inside vLLM

    def fallback(_method: Any, _layer: Any, x: torch.Tensor, bias: Any) -> torch.Tensor:
        return torch.nn.functional.linear(x, weight, bias)

    layer = _StandaloneLayer()
    site = gemv.LinearSite(layer, "standalone", weight, fallback)
    layer._qgate_site = registry.add_site(site, GEMV_ROUTE, "standalone")  # type: ignore[attr-defined]
    apply = gemv.routed_apply(fallback)

    def call(x: torch.Tensor) -> torch.Tensor:
        return apply(layer.quant_method, layer, x, None)

    return call, site.tally
