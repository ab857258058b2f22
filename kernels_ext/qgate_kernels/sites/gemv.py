"""The GEMV site of the route plugin: every unquantized linear layer of a routed role (and lm_head).

A layer is wired when vLLM has loaded its weight (plugin.py's patched process_weights_after_loading,
and `wire_lm_head` after the model load); vLLM's UnquantizedLinearMethod.apply (and the embedding
method's, for lm_head) is patched by `routed_apply`: batch-one fp16 / bf16 calls run `ops.gemv(weight, x,
static_weight=True)` (+ bias) through the site, every other call keeps vLLM's path, counted with its
reason. fp16 and bf16 weights are routed (registry.ROUTED_DTYPES), an x of the weight's dtype. Under
torch.compile the call goes through the opaque op `qgate_routes::linear` (`define_op`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch  # vLLM has imported it already when it loads plugins

from qgate_kernels import attest, record, registry
from qgate_route_env import GEMV_DEFAULT_ROLES
from qgate_route_env import ROUTE_GEMV as GEMV_ROUTE
from qgate_route_env import ROUTE_HC as HC_ROUTE

GEMV_ROLES = GEMV_DEFAULT_ROLES
# Qwen4Exp's HyperConnection projections: GEMV roles while the HC route is off (the HC op takes them).
HC_PROJ_ROLES = ("input_mix_weight_down_block_inject", "input_mix_weight_down", "input_mix_weight_up")


class LinearSite:
    """One routed linear layer (GEMV route); `run` is the body of the qgate_routes::linear op.

    The per-call cost is the op's plus ~2 us (issue 28; `qgate bench ops --device cpu` measures it): what
    holds for the whole life of the layer (its weight's dtype, shape, layout and device, whether the op
    has a kernel there) is checked once here, when the site is wired; a call goes straight to the C++
    entry qgate_plugin::gemv_site (csrc/gemv_site.h), which checks x (shape, dtype, device, dense
    16-byte aligned row), runs the kernel and adds 1 to the site's tally cell, or returns None. A None,
    and every call of a site without that entry, takes `_checked_run`: vLLM's path or `ops.gemv` with
    its counted reasons.
    """

    route = GEMV_ROUTE

    def __init__(self, layer: Any, role: str, weight: Any, orig_apply: Callable[..., Any]) -> None:
        assert registry.STATE is not None
        self.layer = weakref.ref(layer)
        self.role = role
        self.n_out, self.k_in = (int(n) for n in weight.shape)
        # [N, K] fp16 or bf16, kept alive past vLLM's CPU repack; None for other dtypes (every call
        # falls back, counted `dtype`).
        self.weight = weight.detach() if weight.dtype in registry.ROUTED_DTYPES else None
        self.orig_apply = orig_apply
        self.tally = registry.STATE.recorder.tally(GEMV_ROUTE, role)
        # The C++ entry, when ops.gemv would run the op for every x that passes its per-call checks.
        self.kernel = self._direct_kernel()
        if self.kernel is not None:
            self.tally.cell = torch.zeros(1, dtype=torch.int64)  # [1] on the CPU: the entry's hits

    def _direct_kernel(self) -> Callable[..., Any] | None:
        assert registry.STATE is not None
        if self.weight is None or GEMV_ROUTE in registry.STATE.overridden or registry.STATE.op_counts is None:
            return None  # an override is called through _invoke (its own checks, its result checked)
        if record.active():
            return None  # recording saves every call's input: the checked path does that
        from qgate_kernels import ops

        if (
            registry.STATE.impls.get(GEMV_ROUTE) is None
            or getattr(registry.STATE.impls[GEMV_ROUTE], "func", None) is not ops.gemv
        ):
            return None
        probe = self.weight.new_empty((1, self.k_in))  # [1, K]: a dense aligned x on the weight's device
        if ops._gemv_reason(self.weight, probe) is not None:
            return None  # the op cannot take this weight: every call takes ops.gemv's counted fallback
        # A pure-Python install has no C++ entry: the checked path then runs the reference op.
        entry = getattr(torch.ops.qgate_plugin, "gemv_site", None)
        return None if entry is None else entry.default

    def reject(self, x: Any) -> str | None:
        if x.dim() != 2 or x.shape[-1] != self.k_in:
            return "shape"
        if x.shape[0] != 1:
            return "batch_not_1"  # prefill, batched decode, speculative verification
        if self.weight is None or x.dtype != self.weight.dtype:
            return "dtype"
        if x.device != self.weight.device:
            return "device"
        return None

    def run(self, x: Any, bias: Any) -> Any:
        kernel = self.kernel
        if kernel is not None:
            y = kernel(self.weight, x, self.tally.cell)  # [1, N], counted; None: not a row it takes
            if y is not None:
                if attest.CAPTURE is not None:  # a graph capture: its replays run the kernel
                    attest.note_capture(attest.HIT, GEMV_ROUTE, self.role)
                return y if bias is None else y + bias
        return self._checked_run(x, bias)

    def _checked_run(self, x: Any, bias: Any) -> Any:
        assert registry.STATE is not None
        layer = self.layer()
        reason = self.reject(x)
        if reason is not None:
            registry.STATE.recorder.fallback(GEMV_ROUTE, reason)
            return self.orig_apply(layer.quant_method, layer, x, bias)
        if record.active():
            record.save(GEMV_ROUTE, str(getattr(layer, "prefix", "") or self.role), x, weights=(self.weight,))
        y = registry.invoke(GEMV_ROUTE, self.role, self.weight, x.contiguous(), tally=self.tally)  # [1, N]
        if tuple(y.shape) != (1, self.n_out) or y.dtype != x.dtype:
            raise RuntimeError(
                f"qgate fp16_gemv implementation returned {tuple(y.shape)} {y.dtype} for {self.role}, "
                f"expected {(1, self.n_out)} {x.dtype}"
            )
        return y if bias is None else y + bias


def layer_role(layer: Any) -> str:
    return str(getattr(layer, "prefix", "") or "").rsplit(".", 1)[-1]


def float_matrix(weight: Any) -> bool:
    """A loaded, unquantized 2-D weight (fp16 / bf16 ones are routed; others are wired to count `dtype`)."""
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.is_floating_point()
        and not weight.is_meta
        and weight.numel() > 0
    )


def define_op() -> None:
    """qgate_routes::linear: a linear layer's routed call under vLLM's torch.compile trace."""

    @torch.library.custom_op("qgate_routes::linear", mutates_args=())
    def routed_linear(x: torch.Tensor, bias: torch.Tensor | None, site: int) -> torch.Tensor:
        assert registry.STATE is not None
        return registry.STATE.sites[site].run(x, bias)

    @routed_linear.register_fake
    def _(x: torch.Tensor, bias: torch.Tensor | None, site: int) -> torch.Tensor:
        assert registry.STATE is not None
        return x.new_empty((*x.shape[:-1], registry.STATE.sites[site].n_out))


_is_compiling = torch.compiler.is_compiling


def routed_apply(orig: Callable[..., Any]) -> Callable[..., Any]:
    def apply(self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
        site = getattr(layer, "_qgate_site", None)
        # type(self).apply is not this one: a taken vLLM subclass routed the call already and its
        # fallback reached here through super().apply
        if site is None or getattr(type(self), "apply", apply) is not apply:
            return orig(self, layer, x, bias)
        if _is_compiling():  # the op keeps the per-call decision out of the traced graph
            return torch.ops.qgate_routes.linear(x, bias, site)
        return registry.STATE.sites[site].run(x, bias)  # type: ignore[union-attr]  # eager: no dispatcher round trip

    return registry.patched(apply, orig)


def take_apply(cls: type) -> Callable[..., Any]:
    """vLLM's own apply for instances of cls (a fallback runs it); a subclass of vLLM's unquantized
    methods with an apply of its own (Qwen4ExpLowLatencyLinearMethod) gets it routed too, once."""
    fn = cls.apply  # type: ignore[attr-defined]
    orig = getattr(fn, "_qgate_orig", None)
    if orig is not None:
        return orig
    cls.apply = routed_apply(fn)  # type: ignore[attr-defined]
    return fn


def gemv_role(role: str, hc_route_on: bool) -> bool:
    assert registry.STATE is not None
    if registry.STATE.gemv_listed:
        return role in registry.STATE.gemv_listed
    return role in GEMV_ROLES or (role in HC_PROJ_ROLES and not hc_route_on)


def wire_lm_head(model: Any) -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or getattr(lm_head, "_qgate_site", None) is not None:
        return  # absent, or an UnquantizedLinearMethod lm_head wired at load already
    if not gemv_role("lm_head", HC_ROUTE in registry.STATE.routes_on):  # type: ignore[union-attr]
        return
    weight = getattr(lm_head, "weight", None)
    method = getattr(lm_head, "quant_method", None)
    unquantized = isinstance(method, UnquantizedEmbeddingMethod)
    if unquantized and float_matrix(weight):
        orig = registry.unpatched(UnquantizedEmbeddingMethod, "apply")
        if type(method) is not UnquantizedEmbeddingMethod:
            orig = take_apply(type(method))  # Qwen4ExpLowLatencyEmbeddingMethod
        site = LinearSite(lm_head, "lm_head", weight, orig)
        lm_head._qgate_site = registry.add_site(site, GEMV_ROUTE, "lm_head")
