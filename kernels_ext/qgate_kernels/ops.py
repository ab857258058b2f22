"""Typed entry points of the qgate routes, with counted fallbacks.

Each route is one op, qgate::<name> (the HC route two: hc_mix, hc_combine_mix; schemas in
csrc/ops_def.cpp): its CPU kernel is C++ (csrc/cpu/, all but qsa_topk: float32 sums in their own fixed
order, agreeing with the reference within 1 ULP, or for HC within 1 ULP of each output's largest
magnitude; kernels_ext/README.md) or else the pure-torch reference (reference.py, every kernel's
oracle), and its CUDA kernel is in csrc/*.cu. The functions here decide per call
whether the op can take the inputs; when it cannot (M > 1, another dtype, an unsupported shape or
layout, a device without a compiled kernel) they run the reference instead and count the fallback
under the route's name and a reason. Never a silently wrong result: inputs that fit no definition
(mismatched shapes, k < 1) raise ValueError on every path.

Counting happens in Python, once per call of these functions: under CUDA-graph replay the count
is that of the captured calls, not of the replays.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from qgate_kernels import _library, reference
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK

ROUTES = (ROUTE_GEMV, ROUTE_HC, ROUTE_GDN, ROUTE_TOPK)

# Limits of the CUDA kernels (the op's CUDA kernel checks the same; see csrc/ops_cuda.cpp).
HC_MAX_STREAMS = 8
HC_MAX_LORA_RANK = 512
TOPK_MAX_K = 4096
HALF_DTYPES = (torch.float16, torch.bfloat16)

_lock = threading.Lock()
_fallbacks: dict[str, Counter[str]] = {route: Counter() for route in ROUTES}


def fallback_counts() -> dict[str, dict[str, int]]:
    """Fallbacks so far in this process: route -> reason -> count (every route listed)."""
    with _lock:
        return {route: dict(counter) for route, counter in _fallbacks.items()}


def reset_fallback_counts() -> None:
    with _lock:
        for counter in _fallbacks.values():
            counter.clear()


def _count(route: str, reason: str) -> None:
    with _lock:
        _fallbacks[route][reason] += 1


def cuda_kernels_available() -> bool:
    """True when the extension was built with its CUDA kernels and a CUDA device is visible."""
    return _library.EXTENSION_HAS_CUDA and torch.cuda.is_available()


# The kernel each route's op runs, by where it runs (csrc/*.cu: one kernel per route per arch; a
# shape the sm_90 HC launch does not take runs the portable three kernels there too).
_GEMV_ROWS = (
    "gemv_rows: the one-group kernel where K = WPR x G x 256 with G = 6, 8 or 10 (each warp's whole share "
    "of a row loaded at once; K = 1536, 2560, 10240 ...), else the looping rows kernel; x staged in "
    "shared memory up to 48 KiB, else read through L1"
)
KERNELS_SM90 = {
    ROUTE_GEMV: _GEMV_ROWS + "; PDL for static weights",
    ROUTE_HC: "hc_tma_kernel (one launch, bulk-copied weights, tagged partials, PDL)",
    ROUTE_GDN: "gdn_input on gemv_rows (one launch, the split written in place; PDL for static weights)",
    ROUTE_TOPK: (
        "qsa_topk_push_kernel (a thread-block cluster a row, counts and candidates pushed between blocks; "
        "four radix passes, then the ties trimmed by index: the top-k set in increasing index order; a "
        "row of <= 4096 eligible keys by one block on a 4096-bin histogram; PDL)"
    ),
}
KERNELS_PORTABLE = {
    ROUTE_GEMV: _GEMV_ROWS,
    ROUTE_HC: "hc_norm_kernel + gemv_rows + hc_up_mix_kernel",
    ROUTE_GDN: "gdn_input on gemv_rows (one launch, the split written in place)",
    ROUTE_TOPK: (
        "qsa_topk_kernel (grid, cooperative launch: four radix passes, then an index-order compaction: the "
        "top-k set in increasing index order)"
    ),
}
KERNELS_CPU = {
    ROUTE_GEMV: "csrc/cpu gemv",
    ROUTE_HC: "csrc/cpu hc",
    ROUTE_GDN: "csrc/cpu gdn_input",
    ROUTE_TOPK: "reference (torch)",
}


def route_kernels() -> dict[str, str]:
    """Route -> the kernel its op runs on this process's current device (CUDA when available)."""
    if not cuda_kernels_available():
        return dict(KERNELS_CPU) if _library.EXTENSION_LOADED else dict.fromkeys(ROUTES, "reference (torch)")
    major, _ = torch.cuda.get_device_capability()
    return dict(KERNELS_SM90 if major >= 9 else KERNELS_PORTABLE)


def build_info() -> dict[str, object]:
    """What this process loaded, and which kernel each route runs: for result records and errors."""
    return {
        "extension_loaded": _library.EXTENSION_LOADED,
        "extension_has_cuda": _library.EXTENSION_HAS_CUDA,
        "extension_error": _library.EXTENSION_ERROR,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "route_kernels": route_kernels(),
    }


def _device_reason(tensors: tuple[Tensor, ...]) -> str | None:
    """None when the op has a kernel for these tensors' device (CPU: the reference itself)."""
    dev = tensors[0].device
    if any(t.device != dev for t in tensors):
        raise ValueError(f"tensors on different devices: {sorted({str(t.device) for t in tensors})}")
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        return "device"
    if not cuda_kernels_available():
        return "no_cuda_build"
    if torch.cuda.get_device_capability(dev) < (7, 0):
        return "arch"
    return None


def _layout_reason(tensors: tuple[Tensor, ...]) -> str | None:
    """The kernels read 16-byte vectors from dense rows."""
    for t in tensors:
        if not t.is_contiguous() or t.data_ptr() % 16 != 0:
            return "layout"
    return None


def gemv(weight: Tensor, x: Tensor, *, static_weight: bool = False) -> Tensor:
    """Batch-one row-GEMV, route `fp16_gemv`: y = x W^T, fp16 or bf16.

    weight: [N, K] row-major, fp16 or bf16; x: [K] -> y [N], or [M, K] -> y [M, N], weight's dtype.
    float32 accumulation in a fixed order (no atomics: the same bits on every call), one rounding to
    the dtype. The CUDA kernel
    takes M = 1, K a multiple of 8 and 16-byte aligned dense rows; anything else runs the
    reference and counts a fallback (reasons: m_gt_1, dtype, shape, layout, device, no_cuda_build,
    arch).

    static_weight=True promises that no kernel of the current step writes `weight` (a model's
    weights during inference): on sm_90 the kernel then starts with programmatic dependent launch
    and streams the weights while the previous kernel finishes; x is read only after it has
    completed. The result bits are the same either way.
    """
    if weight.dim() != 2 or x.dim() not in (1, 2) or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} and x {tuple(x.shape)} do not fit")
    reason = _gemv_reason(weight, x)
    if reason is not None:
        _count(ROUTE_GEMV, reason)
        return reference.gemv(weight, x)
    return torch.ops.qgate.gemv.default(weight, x, static_weight)


def _gemv_reason(weight: Tensor, x: Tensor) -> str | None:
    n, k = weight.shape
    if x.dim() == 2 and x.shape[0] != 1:
        return "m_gt_1"
    if weight.dtype not in HALF_DTYPES or x.dtype != weight.dtype:
        return "dtype"
    if n == 0 or k == 0 or k % 8 != 0:
        return "shape"
    return _layout_reason((weight, x)) or _device_reason((weight, x))


def hc_mix(
    h: Tensor,
    norm_weight: Tensor,
    w_down: Tensor,
    w_up: Tensor,
    *,
    hc_count: int,
    lora_rank: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Qwen4Exp `GatedResidual.mix(h)` for batch one, route `fused_hc_fp16` (op qgate::hc_mix).

    h: [T, D] (D = hc_count * HS, stream s = h[:, s HS:(s+1) HS]); norm_weight: [HS] or [D] (vLLM's
    hc_norm.weight; Qwen4Exp has hc_per_branch_norm=True: [D]); w_down: the merged
    input_mix_weight_down_block_inject weight [R + HC + pad, D] (pad = (-(R + HC)) mod 16) or, for
    the final mixer (use_combine=False), input_mix_weight_down [R, D]; w_up: input_mix_weight_up
    [D, R]. One dtype throughout: fp16 (the SM70 premise) or bf16 (stock Qwen4Exp).
    Returns vLLM's triple (h, block_input [T, HS], injection [T, HC] or None for the final mixer);
    h is the input itself. The math and its rounding points: reference.hc_mix.
    The CUDA kernels take T = 1, HC <= 8, HS and R multiples of 8, R <= 512, dense 16-byte aligned
    tensors; anything else runs the reference and counts a fallback (reasons m_gt_1, dtype, shape,
    layout, device, no_cuda_build, arch).
    """
    reference.check_hc_shapes(h, norm_weight, w_down, w_up, hc_count, lora_rank)
    tensors = (h, norm_weight, w_down, w_up)
    reason = _hc_reason(tensors, hc_count, lora_rank)
    if reason is not None:
        _count(ROUTE_HC, reason)
        block_input, injection = reference.hc_mix(h, norm_weight, w_down, w_up, hc_count, lora_rank, eps)
    else:
        block_input, injection = torch.ops.qgate.hc_mix.default(
            h, norm_weight, w_down, w_up, hc_count, lora_rank, eps
        )
    return h, block_input, (injection if injection.shape[-1] else None)


def hc_combine_and_mix(
    h: Tensor,
    block_output: Tensor,
    injection: Tensor | None,
    norm_weight: Tensor,
    w_down: Tensor,
    w_up: Tensor,
    *,
    hc_count: int,
    lora_rank: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Qwen4Exp `GatedResidual.combine_and_mix(h, block_output, injection)` for batch one, route
    `fused_hc_fp16` (op qgate::hc_combine_mix). Also the final mixer (w_down [R, D]).

    h: [T, D]; block_output: [T, HS] (the pending block's output); injection: [T, HC] (the logits
    the pending block's mix returned) or None (unit weight). The pending combine
    h'_s = h_s + 2 sigmoid(injection_s / HC) block_output (float32, one fma, rounded), then mix(h').
    Returns (h' [T, D], block_input [T, HS], injection' [T, HC] or None for the final mixer), as
    vLLM does. Math: reference.hc_combine_mix; kernels and fallbacks as hc_mix.
    """
    reference.check_hc_shapes(h, norm_weight, w_down, w_up, hc_count, lora_rank)
    tensors = (h, block_output, norm_weight, w_down, w_up) + (() if injection is None else (injection,))
    reason = _hc_reason(tensors, hc_count, lora_rank)
    args = (h, block_output, injection, norm_weight, w_down, w_up, hc_count, lora_rank, eps)
    if reason is not None:
        _count(ROUTE_HC, reason)
        h_new, block_input, inj = reference.hc_combine_mix(*args)
    else:
        h_new, block_input, inj = torch.ops.qgate.hc_combine_mix.default(*args)
    return h_new, block_input, (inj if inj.shape[-1] else None)


def _hc_reason(tensors: tuple[Tensor, ...], hc_count: int, lora_rank: int) -> str | None:
    h = tensors[0]
    if h.shape[0] != 1:
        return "m_gt_1"
    if h.dtype not in HALF_DTYPES or any(t.dtype != h.dtype for t in tensors):
        return "dtype"
    hs = h.shape[1] // hc_count
    if not 1 <= hc_count <= HC_MAX_STREAMS or hs % 8 != 0:
        return "shape"
    if lora_rank % 8 != 0 or lora_rank > HC_MAX_LORA_RANK:
        return "shape"
    return _layout_reason(tensors) or _device_reason(tensors)


def gdn_input(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    *,
    layout: str,
    static_weight: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Gated-DeltaNet input projection (Part 1 of vLLM's QwenGatedDeltaNetAttention), route
    `fused_gdn_input_fp16`. `layout` is required: "flat" (gqa_interleaved_layout=False: Qwen3.5,
    Qwen4Exp) or "interleaved" (Qwen3-Next); reference.gdn_input has both weight layouts.

    x: [K] or [1, K] fp16 or bf16; w_qkvz: [2*nk*dk + 2*nv*dv, K]; w_ba: [2*nv, K], x's dtype.
    Returns mixed_qkv [1, 2*nk*dk + nv*dv] = [all q | all k | all v], z [1, nv, dv], b [1, nv],
    a [1, nv], dense. One kernel computes both GEMVs (float32 accumulation in a fixed order, one
    rounding, the same per-row arithmetic as `gemv`) and writes straight into the outputs. T > 1
    rows (m_gt_1), other dtypes, K not a multiple of 8 run the reference, counted.
    static_weight: as for `gemv`.
    """
    heads = (num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    reference.check_gdn_shapes(x, w_qkvz, w_ba, *heads, layout)
    reason = _gdn_reason(x, w_qkvz, w_ba)
    if reason is not None:
        _count(ROUTE_GDN, reason)
        return reference.gdn_input(x, w_qkvz, w_ba, *heads, layout)
    return torch.ops.qgate.gdn_input.default(x, w_qkvz, w_ba, *heads, layout == "interleaved", static_weight)


def _gdn_reason(x: Tensor, w_qkvz: Tensor, w_ba: Tensor) -> str | None:
    if x.dim() == 2 and x.shape[0] != 1:
        return "m_gt_1"
    if x.dtype not in HALF_DTYPES or w_qkvz.dtype != x.dtype or w_ba.dtype != x.dtype:
        return "dtype"
    if x.shape[-1] == 0 or x.shape[-1] % 8 != 0:
        return "shape"
    return _layout_reason((x, w_qkvz, w_ba)) or _device_reason((x, w_qkvz, w_ba))


def qsa_topk(logits: Tensor, visible_blocks: Tensor, k: int, out: Tensor | None = None) -> Tensor:
    """Block selection of Qwen4Exp's QSA indexer with `_topk`'s contract, route `qsa_topk`
    (op qgate::qsa_topk, which writes into block_indices).

    logits: [rows, L] float32, inner stride 1, any row stride >= L (vLLM's logits buffers);
    visible_blocks: [rows] int32; k: vLLM's block_topk (512, 1024 or 2048 in Qwen4Exp; 1..4096
    taken); out: block_indices [rows, k] int32 to write (allocated when None). Returns out.
    Row r uses only its first n = visible_blocks[r] columns (clamped to [0, L]); the rest may hold
    garbage and is never selected. n <= k: 0..n-1 then -1. n > k: the set of the k largest values
    (ties at the k-th value go to the lower indices: deterministic, unlike vLLM's own kernels),
    written in increasing index order (vLLM's expand_qsa_block_indices needs no order). NaN ranks
    above +inf; -0.0 == +0.0. The CUDA kernel: four 8-bit radix passes over an order-preserving key,
    then an exact compaction by increasing index (sm_90: one thread-block cluster a row). Other
    dtypes (dtype), k > 4096 (k_not_supported), L >= 2^31 (shape) run the reference, counted.
    """
    if logits.dim() != 2 or tuple(visible_blocks.shape) != (logits.shape[0],) or k < 1:
        raise ValueError(
            f"qsa_topk: logits {tuple(logits.shape)}, visible_blocks {tuple(visible_blocks.shape)}, k={k}: "
            "need [rows, L], [rows] and k >= 1"
        )
    rows = logits.shape[0]
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    elif tuple(out.shape) != (rows, k) or out.dtype != torch.int32 or out.device != logits.device:
        want = f"[{rows}, {k}] int32 on {logits.device}"
        raise ValueError(f"qsa_topk: out {tuple(out.shape)} {out.dtype} on {out.device}: want {want}")
    reason = _topk_reason(logits, visible_blocks, k, out)
    if reason is not None:
        _count(ROUTE_TOPK, reason)
        out.copy_(reference.qsa_topk(logits, visible_blocks, k))
        return out
    torch.ops.qgate.qsa_topk.default(logits, visible_blocks, k, out)
    return out


def _topk_reason(logits: Tensor, visible_blocks: Tensor, k: int, out: Tensor) -> str | None:
    if logits.dtype != torch.float32 or visible_blocks.dtype != torch.int32:
        return "dtype"
    if k > TOPK_MAX_K:
        return "k_not_supported"
    if logits.shape[0] == 0 or logits.shape[1] == 0 or logits.shape[1] >= 2**31:
        return "shape"
    if logits.stride(1) != 1 or logits.stride(0) < logits.shape[1] or not visible_blocks.is_contiguous():
        return "layout"
    if not out.is_contiguous():
        return "layout"
    return _device_reason((logits, visible_blocks, out))


# --- registrations: the reference is the CPU kernel; fake kernels give shapes to torch.compile ---

_impl_lib = torch.library.Library(_library.NAMESPACE, "IMPL")


def _launch_flag_ignored(ref: Callable[..., Any], n_args: int) -> Callable[..., Any]:
    """The CPU kernel of an op whose last argument, static_weight, only changes how the CUDA kernel
    is launched: the reference (bound now, as the other ops' CPU kernels are) on the other args."""

    def cpu(*args: Any) -> Any:
        return ref(*args[:n_args])

    return cpu


def _topk_cpu(logits: Tensor, visible_blocks: Tensor, k: int, block_indices: Tensor) -> None:
    block_indices.copy_(reference.qsa_topk(logits, visible_blocks, k))


def _gdn_cpu(
    x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int, interleaved: bool, *_: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return reference.gdn_input(x, w_qkvz, w_ba, nk, nv, dk, dv, "interleaved" if interleaved else "flat")


_CPU_REFERENCE_KERNELS: dict[str, Callable[..., Any]] = {
    "gemv": _launch_flag_ignored(reference.gemv, 2),
    "hc_mix": reference.hc_mix,
    "hc_combine_mix": reference.hc_combine_mix,
    "gdn_input": _gdn_cpu,
    "qsa_topk": _topk_cpu,
}
# An op whose C++ CPU kernel the extension registered (csrc/cpu/) keeps it; the others (and every op
# of a pure-Python install) get the reference as their CPU kernel.
for _name, _ref in _CPU_REFERENCE_KERNELS.items():
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{_library.NAMESPACE}::{_name}", "CPU"):
        _impl_lib.impl(_name, _ref, "CPU")


@torch.library.register_fake("qgate::gemv", lib=_impl_lib)
def _gemv_fake(weight: Tensor, x: Tensor, static_weight: bool = False) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _hc_fake_tail(h: Tensor, w_down: Tensor, hc_count: int, lora_rank: int) -> tuple[Tensor, Tensor]:
    t, d = h.shape
    n_inj = hc_count if w_down.shape[0] != lora_rank else 0
    return h.new_empty((t, d // hc_count)), h.new_empty((t, n_inj))


@torch.library.register_fake("qgate::hc_mix", lib=_impl_lib)
def _hc_mix_fake(
    h: Tensor, norm_weight: Tensor, w_down: Tensor, w_up: Tensor, hc_count: int, lora_rank: int, eps: float
) -> tuple[Tensor, Tensor]:
    return _hc_fake_tail(h, w_down, hc_count, lora_rank)


@torch.library.register_fake("qgate::hc_combine_mix", lib=_impl_lib)
def _hc_combine_mix_fake(
    h: Tensor,
    block_output: Tensor,
    injection: Tensor | None,
    norm_weight: Tensor,
    w_down: Tensor,
    w_up: Tensor,
    hc_count: int,
    lora_rank: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    return (h.new_empty(h.shape), *_hc_fake_tail(h, w_down, hc_count, lora_rank))


@torch.library.register_fake("qgate::gdn_input", lib=_impl_lib)
def _gdn_input_fake(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    interleaved: bool,
    static_weight: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    t = 1 if x.dim() == 1 else x.shape[0]
    width = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    return (
        x.new_empty((t, width)),
        x.new_empty((t, num_v_heads, head_v_dim)),
        x.new_empty((t, num_v_heads)),
        x.new_empty((t, num_v_heads)),
    )


@torch.library.register_fake("qgate::qsa_topk", lib=_impl_lib)
def _qsa_topk_fake(logits: Tensor, visible_blocks: Tensor, k: int, block_indices: Tensor) -> None:
    return None
