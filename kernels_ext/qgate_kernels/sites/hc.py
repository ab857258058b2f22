"""The HyperConnection site of the route plugin (Qwen4Exp, vLLM 0.32).

HC (`fused_hc_fp16`): every module of the loaded model whose class is the site's class (`GatedResidual`
by default) and whose projections are unquantized is one site; its role is where it sits: `attn`
(`attn_hyper_connection`: before the attention or GDN block), `moe` (`mlp_hyper_connection`: before the
MoE block) or `final` (`hyper_connection_mixer`, use_combine=False), and hits are counted per role and
method (`attn.mix`, `attn.combine_and_mix`, `moe.combine_and_mix`, `final.combine_and_mix`). The patched
methods call the opaque ops `qgate_routes::hc_mix` / `qgate_routes::hc_combine_mix` under torch.compile
and the ops' bodies directly otherwise; inside, batch-one fp16 / bf16 calls (the module's parameters and
the activations of one dtype: registry.ROUTED_DTYPES) run `ops.hc_mix` / `ops.hc_combine_and_mix` and
everything else vLLM's own method, counted with its reason.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from qgate_kernels import record, registry
from qgate_kernels.sites.fresh import unaliased
from qgate_route_env import ROUTE_HC as HC_ROUTE
from qgate_route_env import SITE_HC_MIX as HC_MIX_IMPL  # the mix implementation is keyed like its site

_ROLE_BY_NAME = (
    ("hyper_connection_mixer", "final"),
    ("mlp_hyper_connection", "moe"),
    ("attn_hyper_connection", "attn"),
)


def hc_role(name: str, use_combine: bool) -> str:
    """The HC site's role from its module name (and use_combine for a final mixer of another name)."""
    last = name.rsplit(".", 1)[-1]
    for key, role in _ROLE_BY_NAME:
        if last == key:
            return role
    return "final" if not use_combine else last or "hc"


class HcSite:
    """One GatedResidual module; `mix` / `combine_and_mix` are the bodies of the qgate_routes ops."""

    route = HC_ROUTE

    def __init__(
        self, module: Any, role: str, w_down: Any, w_up: Any, orig: dict[str, Callable[..., Any]]
    ) -> None:
        self.module = weakref.ref(module)
        self.role = role
        self.hc = int(module.hc_count)
        self.rank = int(module.lora_rank)
        self.hs = int(module.hidden_size)
        self.use_combine = bool(getattr(module, "use_combine", True))
        self.eps = float(module.config.rms_norm_eps)
        self.norm = module.hc_norm.weight.detach()
        dt = self.norm.dtype
        routed = (
            w_down is not None and w_up is not None and w_down.dtype == w_up.dtype == dt
        ) and dt in registry.ROUTED_DTYPES
        self.w_down = w_down if routed else None  # [R + HC + pad, D] (merged down+inject) or [R, D] (final)
        self.w_up = w_up if routed else None  # [D, R]
        self.orig = orig
        self.name = ""

    def reject(self, h: Any, *more: Any) -> str | None:
        if h.dim() != 2 or h.shape[-1] != self.hc * self.hs:
            return "shape"
        if h.shape[0] != 1:
            return "batch_not_1"
        if self.w_down is None or any(t.dtype != self.norm.dtype for t in (h, *more) if t is not None):
            return "dtype"
        if any(t.device != self.norm.device for t in (h, *more) if t is not None):
            return "device"
        return None

    def _kw(self) -> dict[str, Any]:
        return {"hc_count": self.hc, "lora_rank": self.rank, "eps": self.eps}

    def _injection_out(self, h: Any, injection: Any) -> Any:
        return h.new_empty((h.shape[0], 0)) if injection is None else injection  # None: the op's [T, 0]

    def mix(self, h: Any) -> tuple[Any, Any]:
        state = registry.STATE
        reason = self.reject(h)
        if reason is not None:
            state.recorder.fallback(HC_ROUTE, reason)
            _, block_input, injection = self.orig["mix"](self.module(), h)
            return unaliased((h,), (block_input, self._injection_out(h, injection)))
        if record.active():
            record.save(HC_ROUTE, self.name, h, None, None, weights=(self.norm, self.w_down, self.w_up))
        out = registry.invoke(
            HC_ROUTE,
            f"{self.role}.mix",
            h,
            self.norm,
            self.w_down,
            self.w_up,
            impl_key=HC_MIX_IMPL,
            **self._kw(),
        )
        _, block_input, injection = self._checked(out, h, h)
        return unaliased((h,), (block_input, self._injection_out(h, injection)))

    def combine_and_mix(self, h: Any, block_output: Any, injection: Any) -> tuple[Any, Any, Any]:
        state = registry.STATE
        reason = self.reject(h, block_output, injection)
        if reason is not None:
            state.recorder.fallback(HC_ROUTE, reason)
            h_new, block_input, inj = self.orig["combine_and_mix"](self.module(), h, block_output, injection)
            return unaliased((h, block_output, injection), (h_new, block_input, self._injection_out(h, inj)))
        if record.active():
            record.save(
                HC_ROUTE, self.name, h, block_output, injection, weights=(self.norm, self.w_down, self.w_up)
            )
        args = (h, block_output, injection, self.norm, self.w_down, self.w_up)
        out = registry.invoke(HC_ROUTE, f"{self.role}.combine_and_mix", *args, **self._kw())
        h_new, block_input, inj = self._checked(out, h, None)
        return unaliased((h, block_output, injection), (h_new, block_input, self._injection_out(h, inj)))

    def _checked(self, out: Any, h: Any, same_h: Any) -> tuple[Any, Any, Any]:
        h_new, block_input, inj = out
        t = h.shape[0]
        want = [(t, self.hc * self.hs), (t, self.hs), (t, self.hc) if self.use_combine else None]
        got = [tuple(h_new.shape), tuple(block_input.shape), None if inj is None else tuple(inj.shape)]
        if got != want:
            raise RuntimeError(f"qgate fused_hc_fp16 implementation returned shapes {got}, expected {want}")
        if h_new.dtype != h.dtype or block_input.dtype != h.dtype:  # named as such: shapes can be right
            got_dt = [str(d).removeprefix("torch.") for d in (h_new.dtype, block_input.dtype)]
            raise RuntimeError(
                f"qgate fused_hc_fp16 implementation returned dtypes {got_dt} for (h, block input), "
                f"expected {str(h.dtype).removeprefix('torch.')} (the input's)"
            )
        return h_new, block_input.contiguous(), inj


def define_hc_ops() -> None:
    """qgate_routes::hc_mix / hc_combine_mix: the per-call decision, opaque to torch.compile."""

    def site(i: int) -> HcSite:
        return registry.STATE.sites[i]

    @torch.library.custom_op("qgate_routes::hc_mix", mutates_args=())
    def hc_mix(h: torch.Tensor, site_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return site(site_id).mix(h)

    @hc_mix.register_fake
    def _(h: torch.Tensor, site_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = site(site_id)
        return h.new_empty((h.shape[0], s.hs)), h.new_empty((h.shape[0], s.hc if s.use_combine else 0))

    @torch.library.custom_op("qgate_routes::hc_combine_mix", mutates_args=())
    def hc_combine_mix(
        h: torch.Tensor, block_output: torch.Tensor, injection: torch.Tensor | None, site_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return site(site_id).combine_and_mix(h, block_output, injection)

    @hc_combine_mix.register_fake
    def _(
        h: torch.Tensor, block_output: torch.Tensor, injection: torch.Tensor | None, site_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = site(site_id)
        t = h.shape[0]
        return h.new_empty(h.shape), h.new_empty((t, s.hs)), h.new_empty((t, s.hc if s.use_combine else 0))


_is_compiling = torch.compiler.is_compiling


def patch_hc(owner: type, kind: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of GatedResidual.mix (kind 'mix') or .combine_and_mix: the op for wired modules."""
    if kind == "mix":

        def mix(self: Any, hidden_states: Any) -> Any:
            sid = getattr(self, "_qgate_hc_site", None)
            if sid is None:
                return orig(self, hidden_states)
            if _is_compiling():  # the op keeps the per-call decision out of a traced graph
                block_input, inj = torch.ops.qgate_routes.hc_mix(hidden_states, sid)
            else:  # eager (and CUDA-graph capture): no dispatcher round trip (~10 us a call)
                block_input, inj = registry.STATE.sites[sid].mix(hidden_states)
            return hidden_states, block_input, inj if registry.STATE.sites[sid].use_combine else None

        return registry.patched(mix, orig)

    def combine_and_mix(self: Any, hidden_states: Any, prev_block_output: Any, prev_injection: Any) -> Any:
        sid = getattr(self, "_qgate_hc_site", None)
        if sid is None:
            return orig(self, hidden_states, prev_block_output, prev_injection)
        if _is_compiling():
            out = torch.ops.qgate_routes.hc_combine_mix(hidden_states, prev_block_output, prev_injection, sid)
        else:
            out = registry.STATE.sites[sid].combine_and_mix(hidden_states, prev_block_output, prev_injection)
        h_new, block_input, inj = out
        return h_new, block_input, inj if registry.STATE.sites[sid].use_combine else None

    return registry.patched(combine_and_mix, orig)


def wire_hc(model: Any, hc_cls: type, orig: dict[str, Callable[..., Any]]) -> None:
    """One HcSite per unquantized module of the site class in the model (after the load)."""
    for name, module in model.named_modules():
        if not isinstance(module, hc_cls) or getattr(module, "_qgate_hc_site", None) is not None:
            continue
        use_combine = bool(getattr(module, "use_combine", True))
        down = getattr(
            module, "input_mix_weight_down_block_inject" if use_combine else "input_mix_weight_down", None
        )
        up = getattr(module, "input_mix_weight_up", None)
        w_down, w_up = getattr(down, "_qgate_weight", None), getattr(up, "_qgate_weight", None)
        if w_down is None or w_up is None:
            continue  # quantized projections keep vLLM's path
        role = hc_role(name, use_combine)
        site = HcSite(module, role, w_down, w_up, orig)
        site.name = name  # the vLLM module name, for recorded activations (qgate_kernels.record)
        module._qgate_hc_site = registry.add_site(site, HC_ROUTE, role)
