"""The fused GDN input site of the route plugin: QwenGatedDeltaNetAttention Part 1, both layouts.

Every Gated-DeltaNet layer of the loaded model whose `in_proj_qkvz` / `in_proj_ba` are unquantized is
one site. Its patched `forward_cpu` / `forward_cuda` run Part 1 (the two input projections and their
split into mixed_qkv, z, b, a) as the opaque op `qgate_routes::gdn_input`: batch-one fp16 / bf16 calls
(registry.ROUTED_DTYPES) run `ops.gdn_input(..., layout="flat" | "interleaved")`, everything else vLLM's
own Part 1, counted; Parts 2-3 (the GDN core op, the gated norm and out_proj) are vLLM 0.32's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from qgate_kernels import record, registry
from qgate_kernels.sites.fresh import unaliased
from qgate_route_env import ROUTE_GDN as GDN_ROUTE

GDN_ROLES = ("in_proj_qkvz", "in_proj_ba")


class GdnSite:
    """One Gated-DeltaNet layer (fused GDN input route); `run` is the body of qgate_routes::gdn_input.
    layout: "flat" (gqa_interleaved_layout=False: Qwen3.5, Qwen4Exp) or "interleaved" (Qwen3-Next)."""

    route = GDN_ROUTE
    role = "in_proj_qkvz+in_proj_ba"

    def __init__(self, layer: Any, w_qkvz: Any, w_ba: Any) -> None:
        self.layer = weakref.ref(layer)
        self.layout = "interleaved" if layer.gqa_interleaved_layout else "flat"
        self.k_in = int(w_qkvz.shape[1])
        routed = w_qkvz.dtype == w_ba.dtype and w_qkvz.dtype in registry.ROUTED_DTYPES
        # This rank's shards, fp16 or bf16, kept past vLLM's CPU repack; None for other dtypes (calls
        # fall back, counted `dtype`).
        self.w_qkvz = w_qkvz if routed else None  # [nk * (2 dk + 2 r dv), K]
        self.w_ba = w_ba if routed else None  # [nk * 2 r, K]
        self.nk = layer.num_k_heads // layer.tp_size
        self.nv = layer.num_v_heads // layer.tp_size
        self.dk = layer.head_k_dim
        self.dv = layer.head_v_dim

    def reject(self, h: Any) -> str | None:
        if h.dim() != 2 or h.shape[-1] != self.k_in:
            return "shape"
        if h.shape[0] != 1:
            return "batch_not_1"
        if self.w_qkvz is None or h.dtype != self.w_qkvz.dtype:
            return "dtype"
        if h.device != self.w_qkvz.device:
            return "device"
        return None

    def run(self, h: Any) -> tuple[Any, Any, Any, Any]:
        reason = self.reject(h)
        if reason is not None:
            registry.STATE.recorder.fallback(GDN_ROUTE, reason)
            return gdn_vllm_input(self.layer(), h)
        if record.active():
            name = f"{getattr(self.layer(), 'prefix', '')}.in_proj_qkvz+in_proj_ba"
            record.save(GDN_ROUTE, name, h, weights=(self.w_qkvz, self.w_ba))
        args = (h, self.w_qkvz, self.w_ba, self.nk, self.nv, self.dk, self.dv)
        out = registry.invoke(GDN_ROUTE, self.role, *args, layout=self.layout)
        want = [
            (1, 2 * self.nk * self.dk + self.nv * self.dv),
            (1, self.nv, self.dv),
            (1, self.nv),
            (1, self.nv),
        ]
        got = [tuple(t.shape) for t in out]
        if got != want:
            raise RuntimeError(
                f"qgate fused_gdn_input_fp16 implementation returned shapes {got}, expected {want}"
            )
        return unaliased((h,), out, contiguous=True)


def gdn_vllm_input(layer: Any, h: Any) -> tuple[Any, Any, Any, Any]:
    """vLLM 0.32's own Part 1 of QwenGatedDeltaNetAttention.forward_cpu/forward_cuda, both layouts."""
    mixed_qkvz, _ = layer.in_proj_qkvz(h)
    ba, _ = layer.in_proj_ba(h)
    t = h.shape[0]
    if layer.gqa_interleaved_layout:
        query, key, value, z, b, a = layer.fix_query_key_value_ordering(mixed_qkvz, ba)
        mixed_qkv = torch.cat((query.reshape(t, -1), key.reshape(t, -1), value.reshape(t, -1)), dim=-1)
    else:  # flat [q | k | v | z] and [b | a]
        qkv_size = (layer.key_dim * 2 + layer.value_dim) // layer.tp_size
        z_size = layer.value_dim // layer.tp_size
        mixed_qkv, z = mixed_qkvz.split([qkv_size, z_size], dim=-1)
        z = z.reshape(z.size(0), -1, layer.head_v_dim)
        b, a = layer.split_ba(ba)
    # Views of mixed_qkvz and ba: a custom op's outputs may not share memory, so all but one of each
    # tensor's views are copied (sites/fresh.py).
    return unaliased((h,), (mixed_qkv, z, b, a), contiguous=True)


def gdn_forward(orig: Callable[..., Any], device: str) -> Callable[..., Any]:
    """forward_cpu / forward_cuda with Part 1 replaced by the route op; Parts 2-3 as in vLLM 0.32."""

    def forward(self: Any, hidden_states: Any) -> Any:
        site = getattr(self, "_qgate_gdn_site", None)
        if site is None:
            return orig(self, hidden_states)
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import _encode_layer_name

        num_tokens = hidden_states.size(0)
        if torch.compiler.is_compiling():  # the op keeps the per-call decision out of a traced graph
            mixed_qkv, z, b, a = torch.ops.qgate_routes.gdn_input(hidden_states, site)
        else:  # eager (and CUDA-graph capture): no dispatcher round trip
            mixed_qkv, z, b, a = registry.STATE.sites[site].run(hidden_states)
        core_attn_out = torch.zeros(
            (num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        name = _encode_layer_name(self.prefix)
        if device == "cpu":
            torch.ops.vllm.cpu_gdn_attention_core(mixed_qkv, b, a, core_attn_out, name)
        else:
            torch.ops.vllm.qwen_gdn_attention_core(mixed_qkv, b, a, core_attn_out, layer_name=name)
        return self._output_projection(core_attn_out, z)

    return registry.patched(forward, orig)


def wire_gdn(model: Any) -> None:
    gdn_cls = registry.site_owner(f"{GDN_ROUTE}.forward_cpu")
    for module in model.modules():
        if not isinstance(module, gdn_cls):
            continue
        if not module.gqa_interleaved_layout and getattr(module, "disable_tp_for_ba_proj", False):
            continue  # replicated b/a (Marlin-quantized models): not the op's per-rank layout
        qkvz, ba = getattr(module, "in_proj_qkvz", None), getattr(module, "in_proj_ba", None)
        w_qkvz, w_ba = getattr(qkvz, "_qgate_weight", None), getattr(ba, "_qgate_weight", None)
        for proj in (qkvz, ba):
            if hasattr(proj, "_qgate_weight"):
                del proj._qgate_weight  # the site keeps what it needs
        if w_qkvz is None or w_ba is None:
            continue  # quantized projections keep vLLM's path
        fp16 = w_qkvz.dtype == w_ba.dtype == torch.float16
        if getattr(module, "enable_fused_gdn_spec_decode", False) and not fp16:
            # forward_cuda's own fused bf16 path (speculative decoding on CUDA): Part 1 + core + norm in
            # one packed op that the route's forward would drop; the route never replaces it.
            continue
        module._qgate_gdn_site = registry.add_site(GdnSite(module, w_qkvz, w_ba), GDN_ROUTE, GdnSite.role)


def define_op() -> None:
    """qgate_routes::gdn_input: a GDN layer's Part 1 under vLLM's torch.compile trace."""

    @torch.library.custom_op("qgate_routes::gdn_input", mutates_args=())
    def routed_gdn_input(
        h: torch.Tensor, site: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        assert registry.STATE is not None
        return registry.STATE.sites[site].run(h)

    @routed_gdn_input.register_fake
    def _(h: torch.Tensor, site: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        assert registry.STATE is not None
        s = registry.STATE.sites[site]
        t = h.shape[0]
        return (
            h.new_empty((t, 2 * s.nk * s.dk + s.nv * s.dv)),
            h.new_empty((t, s.nv, s.dv)),
            h.new_empty((t, s.nv)),
            h.new_empty((t, s.nv)),
        )
