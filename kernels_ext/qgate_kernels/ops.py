"""Typed entry points of the qgate routes, with counted fallbacks.

Each route is one op, qgate::<name> (schema in csrc/ops_def.cpp): its CPU kernel is the pure-torch
reference (reference.py) and its CUDA kernel is in csrc/*.cu. The functions here decide per call
whether the op can take the inputs; when it cannot (M > 1, another dtype, an unsupported shape or
layout, a device without a compiled kernel) they run the reference instead and count the fallback
under the route's name and a reason. Never a silently wrong result: inputs that fit no definition
(mismatched shapes, k > L) raise ValueError on every path.

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

ROUTE_GEMV = "fp16_gemv"
ROUTE_HC = "fused_hc_fp16"
ROUTE_GDN = "fused_gdn_input_fp16"
ROUTE_TOPK = "qsa_topk"
ROUTES = (ROUTE_GEMV, ROUTE_HC, ROUTE_GDN, ROUTE_TOPK)

# Limits of the CUDA kernels (the op's CUDA kernel checks the same; see csrc/ops_cuda.cpp).
HC_MAX_STREAMS = 8
TOPK_MAX_K = 4096

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


def build_info() -> dict[str, object]:
    """What this process loaded: for result records and error messages."""
    return {
        "extension_loaded": _library.EXTENSION_LOADED,
        "extension_has_cuda": _library.EXTENSION_HAS_CUDA,
        "extension_error": _library.EXTENSION_ERROR,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
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
    """Batch-one FP16 row-GEMV, route `fp16_gemv`: y = x W^T.

    weight: [N, K] fp16 row-major; x: [K] -> y [N], or [M, K] -> y [M, N]. float32 accumulation in
    a fixed order (no atomics: the same bits on every call), one rounding to fp16. The CUDA kernel
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
    if weight.dtype != torch.float16 or x.dtype != torch.float16:
        return "dtype"
    if n == 0 or k == 0 or k % 8 != 0:
        return "shape"
    return _layout_reason((weight, x)) or _device_reason((weight, x))


def fused_hc(
    h: Tensor,
    norm_weight: Tensor,
    w_a: Tensor,
    a_static: Tensor,
    scale_a: Tensor,
    w_b: Tensor,
    b_static: Tensor,
    scale_b: Tensor,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused dynamic hyper-connection for batch one, route `fused_hc_fp16`.

    h: [n, d] fp16 (n residual streams of hidden size d); norm_weight: [d] fp16; w_a: [n+1, d]
    fp16; a_static: [n, n+1] fp32; scale_a: [1] fp32; w_b: [d] fp16; b_static: [n] fp32;
    scale_b: [1] fp32. Returns (layer_input [d] fp16, mixed [n, d] fp16, b [n] fp32) with
        Hn = H / sqrt(mean(H^2, -1) + eps) * norm_weight
        A  = a_static + scale_a * tanh(Hn w_a^T)        [n, n+1]
        b  = b_static + scale_b * tanh(Hn w_b)          [n]
        layer_input = (A^T H)[0],  mixed = (A^T H)[1:]
    all in float32 (Zhu et al. 2024, dynamic hyper-connections; reference.fused_hc has the full
    text). One CUDA kernel for 1 <= n <= 8 and d a multiple of 8; [T, n, d] with T > 1 (reason
    m_gt_1), other dtypes and shapes run the reference and count a fallback.
    """
    args = (h, norm_weight, w_a, a_static, scale_a, w_b, b_static, scale_b)
    reason = _hc_reason(*args)
    if reason is not None:
        _count(ROUTE_HC, reason)
        return reference.fused_hc(*args, eps)
    return torch.ops.qgate.fused_hc.default(*args, eps)


def _hc_reason(
    h: Tensor,
    norm_weight: Tensor,
    w_a: Tensor,
    a_static: Tensor,
    scale_a: Tensor,
    w_b: Tensor,
    b_static: Tensor,
    scale_b: Tensor,
) -> str | None:
    if h.dim() == 3 and h.shape[0] != 1:
        return "m_gt_1"
    if h.dim() != 2:
        return "shape"
    n, d = h.shape
    halves = (h, norm_weight, w_a, w_b)
    floats = (a_static, scale_a, b_static, scale_b)
    if any(t.dtype != torch.float16 for t in halves) or any(t.dtype != torch.float32 for t in floats):
        return "dtype"
    if not 1 <= n <= HC_MAX_STREAMS or d == 0 or d % 8 != 0:
        return "shape"
    return _layout_reason(halves + floats) or _device_reason(halves + floats)


def gdn_input(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    *,
    static_weight: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Gated-DeltaNet input projection (Qwen3-Next layout), route `fused_gdn_input_fp16`.

    x: [K] or [1, K] fp16; w_qkvz: [nk*(2*dk + 2*r*dv), K] fp16, rows per key head
    [q | k | v | z]; w_ba: [2*nv, K] fp16, rows per key head [b | a]; r = nv / nk. One kernel
    computes both GEMVs (float32 accumulation, the same per-row arithmetic as `gemv`, so the bits
    equal gemv's) and writes straight into the de-interleaved outputs vLLM's GDN core takes:
    mixed_qkv [1, 2*nk*dk + nv*dv] = [all q | all k | all v], z [1, nv, dv], b [1, nv], a [1, nv].
    T > 1 rows (m_gt_1), other dtypes, K not a multiple of 8 run the reference, counted.
    static_weight: as for `gemv`.
    """
    reference._check_gdn_shapes(x, w_qkvz, w_ba, num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    heads = (num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    reason = _gdn_reason(x, w_qkvz, w_ba)
    if reason is not None:
        _count(ROUTE_GDN, reason)
        return reference.gdn_input(x, w_qkvz, w_ba, *heads)
    return torch.ops.qgate.gdn_input.default(x, w_qkvz, w_ba, *heads, static_weight)


def _gdn_reason(x: Tensor, w_qkvz: Tensor, w_ba: Tensor) -> str | None:
    if x.dim() == 2 and x.shape[0] != 1:
        return "m_gt_1"
    if any(t.dtype != torch.float16 for t in (x, w_qkvz, w_ba)):
        return "dtype"
    if x.shape[-1] == 0 or x.shape[-1] % 8 != 0:
        return "shape"
    return _layout_reason((x, w_qkvz, w_ba)) or _device_reason((x, w_qkvz, w_ba))


def qsa_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k over fp32 scores, route `qsa_topk`.

    scores: [B, L] fp32 -> (values [B, k] fp32, indices [B, k] int64), ordered as a stable sort
    by value descending (equal values: lower index first). NaN of any payload ranks above +inf
    and all NaNs tie; -0.0 and +0.0 tie; values are the input elements (bits kept). The CUDA
    kernel is a radix select (four 8-bit passes over an order-preserving 32-bit key) followed by
    exact tie compaction by increasing index and a rank-by-count ordering: the same set and order
    on every call. k > 4096, L >= 2^31 or another dtype run the reference, counted.
    """
    if scores.dim() != 2 or not 1 <= k <= scores.shape[1]:
        raise ValueError(f"qsa_topk: scores {tuple(scores.shape)} with k={k}: need [B, L] and 1 <= k <= L")
    reason = _topk_reason(scores, k)
    if reason is not None:
        _count(ROUTE_TOPK, reason)
        return reference.qsa_topk(scores, k)
    return torch.ops.qgate.qsa_topk.default(scores, k)


def _topk_reason(scores: Tensor, k: int) -> str | None:
    if scores.dtype != torch.float32:
        return "dtype"
    if k > TOPK_MAX_K:
        return "k_too_large"
    if scores.shape[0] == 0 or scores.shape[1] >= 2**31:
        return "shape"
    return _layout_reason((scores,)) or _device_reason((scores,))


# --- registrations: the reference is the CPU kernel; fake kernels give shapes to torch.compile ---

_impl_lib = torch.library.Library(_library.NAMESPACE, "IMPL")


def _launch_flag_ignored(ref: Callable[..., Any], n_args: int) -> Callable[..., Any]:
    """The CPU kernel of an op whose last argument, static_weight, only changes how the CUDA kernel
    is launched: the reference (bound now, as the other ops' CPU kernels are) on the other args."""

    def cpu(*args: Any) -> Any:
        return ref(*args[:n_args])

    return cpu


_impl_lib.impl("gemv", _launch_flag_ignored(reference.gemv, 2), "CPU")
_impl_lib.impl("fused_hc", reference.fused_hc, "CPU")
_impl_lib.impl("gdn_input", _launch_flag_ignored(reference.gdn_input, 7), "CPU")
_impl_lib.impl("qsa_topk", reference.qsa_topk, "CPU")


@torch.library.register_fake("qgate::gemv", lib=_impl_lib)
def _gemv_fake(weight: Tensor, x: Tensor, static_weight: bool = False) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("qgate::fused_hc", lib=_impl_lib)
def _fused_hc_fake(
    h: Tensor,
    norm_weight: Tensor,
    w_a: Tensor,
    a_static: Tensor,
    scale_a: Tensor,
    w_b: Tensor,
    b_static: Tensor,
    scale_b: Tensor,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    layer_input = h.new_empty((*h.shape[:-2], h.shape[-1]))
    return layer_input, h.new_empty(h.shape), h.new_empty(h.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("qgate::gdn_input", lib=_impl_lib)
def _gdn_input_fake(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
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
def _qsa_topk_fake(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    b = scores.shape[0]
    return scores.new_empty((b, k)), scores.new_empty((b, k), dtype=torch.int64)
