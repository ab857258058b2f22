"""Pure-torch references for the qgate routes: the CPU kernels of the ops and the fallback path.

Every function here works on any device and any batch size; it is the definition of what the CUDA
kernels compute. Arithmetic is float32 (inputs upcast, one rounding to the output dtype at the end),
so a kernel that accumulates in float32 in another order differs only by rounding of the sums.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gemv(weight: Tensor, x: Tensor) -> Tensor:
    """y = x W^T with float32 accumulation, rounded once to x.dtype.

    weight: [N, K]; x: [K] -> [N], or [M, K] -> [M, N].
    """
    if weight.dim() != 2 or x.dim() not in (1, 2) or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} and x {tuple(x.shape)} do not fit")
    # [.., K] @ [K, N] -> [.., N]
    return (x.float() @ weight.float().t()).to(x.dtype)


def fused_hc(
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
    """Dynamic hyper-connection (Zhu et al. 2024, arXiv 2409.19606) for n residual streams.

    h: [n, d] (or [T, n, d]) streams H; norm_weight: [d]; w_a: [n+1, d]; a_static: [n, n+1];
    scale_a, scale_b: one element each; w_b: [d]; b_static: [n].
        Hn   = H / sqrt(mean(H^2, -1) + eps) * norm_weight          per stream, [n, d]
        A    = a_static + scale_a * tanh(Hn w_a^T)                  width weights, [n, n+1]
        b    = b_static + scale_b * tanh(Hn w_b)                    depth weights, [n]
        out  = A^T H                                                [n+1, d]
        layer_input = out[0]  ([d]);  mixed = out[1:]  ([n, d])
    The caller finishes the block after the layer T: H_next = b^T T(layer_input) + mixed
    (b_static is 1 at initialisation in the paper). Returns (layer_input, mixed, b) with
    layer_input and mixed in h.dtype and b in float32.
    """
    n, d = h.shape[-2], h.shape[-1]
    if w_a.shape != (n + 1, d) or a_static.shape != (n, n + 1) or w_b.shape != (d,):
        raise ValueError(
            f"fused_hc: h {tuple(h.shape)}, w_a {tuple(w_a.shape)}, a_static {tuple(a_static.shape)}, "
            f"w_b {tuple(w_b.shape)} do not fit n={n}, d={d}"
        )
    if norm_weight.shape != (d,) or b_static.shape != (n,) or scale_a.numel() != 1 or scale_b.numel() != 1:
        raise ValueError("fused_hc: norm_weight must be [d], b_static [n], scale_a and scale_b one element")
    hf = h.float()  # [.., n, d]
    rms = torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)  # [.., n, 1]
    hn = hf * rms * norm_weight.float()  # [.., n, d]
    a = a_static.float() + scale_a.float().reshape(()) * torch.tanh(hn @ w_a.float().t())  # [.., n, n+1]
    b = b_static.float() + scale_b.float().reshape(()) * torch.tanh(hn @ w_b.float())  # [.., n]
    out = a.transpose(-1, -2) @ hf  # [.., n+1, d]
    # copies, so that no output aliases another (custom-op outputs must be fresh tensors)
    return out[..., 0, :].to(h.dtype, copy=True), out[..., 1:, :].to(h.dtype, copy=True), b


def gdn_input(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gated-DeltaNet input projection in Qwen3-Next's interleaved layout, de-interleaved.

    x: [K] or [T, K]. w_qkvz: [num_k_heads * (2*dk + 2*r*dv), K], rows grouped per key head as
    [q (dk) | k (dk) | v (r*dv) | z (r*dv)] with r = num_v_heads / num_k_heads; w_ba:
    [num_k_heads * 2r, K], rows grouped per key head as [b (r) | a (r)]. Returns what vLLM's GDN
    core takes: mixed_qkv [T, 2*nk*dk + nv*dv] = [all q | all k | all v], z [T, nv, dv], b [T, nv],
    a [T, nv] (T = 1 for a 1-D x), float32 accumulation, rounded once to x.dtype.
    """
    nk, nv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    _check_gdn_shapes(x, w_qkvz, w_ba, nk, nv, dk, dv)
    r = nv // nk
    x2 = x.reshape(-1, x.shape[-1])  # [T, K]
    t = x2.shape[0]
    qkvz = gemv(w_qkvz, x2).view(t, nk, 2 * dk + 2 * r * dv)  # [T, nk, per-group]
    ba = gemv(w_ba, x2).view(t, nk, 2 * r)  # [T, nk, 2r]
    q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=2)
    b, a = torch.split(ba, [r, r], dim=2)
    mixed_qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
    # clones, so that no output aliases another (custom-op outputs must be fresh tensors)
    return mixed_qkv, z.reshape(t, nv, dv).clone(), b.reshape(t, nv).clone(), a.reshape(t, nv).clone()


def _check_gdn_shapes(x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int) -> None:
    if min(nk, nv, dk, dv) < 1 or nv % nk != 0:
        raise ValueError(f"gdn_input: heads nk={nk} nv={nv} dk={dk} dv={dv}: need nv a multiple of nk")
    hidden = x.shape[-1]
    want_qkvz = (nk * (2 * dk) + 2 * nv * dv, hidden)
    want_ba = (2 * nv, hidden)
    if x.dim() not in (1, 2) or tuple(w_qkvz.shape) != want_qkvz or tuple(w_ba.shape) != want_ba:
        raise ValueError(
            f"gdn_input: x {tuple(x.shape)}, w_qkvz {tuple(w_qkvz.shape)} (want {want_qkvz}), "
            f"w_ba {tuple(w_ba.shape)} (want {want_ba}) do not fit"
        )


def qsa_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k per row: the first k of a stable sort by value descending (ties: lower index first).

    scores: [B, L] float32 -> values [B, k] float32, indices [B, k] int64. NaN (any payload) ranks
    above +inf and all NaNs tie; -0.0 and +0.0 tie. Values are the input elements themselves.
    """
    if scores.dim() != 2 or not 1 <= k <= scores.shape[1]:
        raise ValueError(f"qsa_topk: scores {tuple(scores.shape)} with k={k}: need [B, L] and 1 <= k <= L")
    # torch.sort alone is not enough: CUDA's radix sort orders NaNs by their sign bit and -0.0
    # below +0.0. Sort a canonical copy (every NaN the positive quiet NaN, -0.0 made +0.0), then
    # gather the input elements so that their bits are kept.
    canonical = torch.where(torch.isnan(scores), torch.full_like(scores, float("nan")), scores + 0.0)
    _, order = torch.sort(canonical, dim=1, descending=True, stable=True)
    indices = order[:, :k].contiguous()
    return scores.gather(1, indices), indices
