"""Pure-torch references for the qgate routes: the CPU kernels of the ops and the fallback path.

Every function here works on any device and any batch size; it is the definition of what the CUDA
kernels compute. GEMMs accumulate in float32 and round once to the activation dtype; every other
rounding point is the one vLLM 0.32's Qwen4Exp (nvidia variant) has, named where it happens.
"""

from __future__ import annotations

import torch
from torch import Tensor

GDN_LAYOUTS = ("flat", "interleaved")


def gemv(weight: Tensor, x: Tensor) -> Tensor:
    """y = x W^T with float32 accumulation, rounded once to x.dtype.

    weight: [N, K]; x: [K] -> [N], or [M, K] -> [M, N].
    """
    if weight.dim() != 2 or x.dim() not in (1, 2) or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} and x {tuple(x.shape)} do not fit")
    wt = weight.float().t()  # [K, N]
    if x.dim() == 2 and x.shape[0] > 1:
        # Row by row ([1, K] @ [K, N] each): torch's CPU GEMM sums an M > 1 batch in another order
        # than one row (measured: 33 of 300 random fp16 [3, 256] x [40, 256] cases rounded a batch row
        # differently from the same row alone), and token t of a batch must get the single-token bits.
        return torch.cat([x[i : i + 1].float() @ wt for i in range(x.shape[0])]).to(x.dtype)
    return (x.float() @ wt).to(x.dtype)  # [.., K] @ [K, N] -> [.., N]


# --- HyperConnection (Qwen4Exp GatedResidual) ---------------------------------------------------


def hc_pad(lora_rank: int, hc_count: int) -> int:
    """Rows vLLM pads the merged down+inject projection with: (-(R + HC)) mod 16."""
    return (-(lora_rank + hc_count)) % 16


def hc_down_rows(lora_rank: int, hc_count: int, use_combine: bool) -> int:
    """Rows of w_down: R + HC + pad for a combining HC module, R for the final mixer."""
    return lora_rank + hc_count + hc_pad(lora_rank, hc_count) if use_combine else lora_rank


def check_hc_shapes(
    h: Tensor, norm_weight: Tensor, w_down: Tensor, w_up: Tensor, hc_count: int, lora_rank: int
) -> bool:
    """Raises ValueError unless the shapes fit one GatedResidual module; returns use_combine
    (True: w_down is the merged [R + HC + pad, D] down+inject weight; False: the final mixer's [R, D])."""
    if hc_count < 1 or lora_rank < 1 or h.dim() != 2 or h.shape[-1] % hc_count != 0:
        raise ValueError(f"hc: h {tuple(h.shape)} with hc_count={hc_count}, lora_rank={lora_rank} do not fit")
    d = h.shape[-1]
    hs = d // hc_count
    merged = hc_down_rows(lora_rank, hc_count, True)
    if w_down.dim() != 2 or w_down.shape[1] != d or w_down.shape[0] not in (merged, lora_rank):
        raise ValueError(f"hc: w_down {tuple(w_down.shape)}: want [{merged}, {d}] or [{lora_rank}, {d}]")
    if tuple(w_up.shape) != (d, lora_rank) or norm_weight.dim() != 1 or norm_weight.numel() not in (hs, d):
        raise ValueError(
            f"hc: w_up {tuple(w_up.shape)} (want [{d}, {lora_rank}]), norm_weight {tuple(norm_weight.shape)} "
            f"(want [{hs}] or [{d}])"
        )
    return w_down.shape[0] == merged and merged != lora_rank


def _fma64(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """float32 fma(a, b, c): the product of two float32 values is exact in float64, so this is one
    rounding of a b + c (up to float64's own rounding, ~2^-29 relative, far below float32's)."""
    return (a.double() * b.double() + c.double()).float()


def _hc_norm(x: Tensor, norm_weight: Tensor, hc_count: int, eps: float) -> Tensor:
    """Grouped Gemma RMSNorm per stream, as vLLM's _grouped_gemma_rmsnorm_kernel: in float32,
    rrms = rsqrt(sum(x^2) / HS + eps), y = x rrms, y = fma(y, w, y); rounded to x.dtype.
    x: [T, D] (already in the activation dtype); norm_weight: [HS] (shared) or [D] (per stream)."""
    t, d = x.shape
    hs = d // hc_count
    g = x.float().view(t, hc_count, hs)  # [T, HC, HS]
    rrms = torch.rsqrt(g.square().sum(dim=-1, keepdim=True) / hs + eps)  # [T, HC, 1]
    y = g * rrms
    w = norm_weight.float().view(1, -1, hs)  # [1, HC or 1, HS]
    return _fma64(y, w.expand_as(y), y).reshape(t, d).to(x.dtype)


def _hc_tail(xn: Tensor, w_down: Tensor, w_up: Tensor, hc_count: int, lora_rank: int, use_combine: bool):  # noqa: ANN202
    """From the normalised streams xn [T, D] to (block_input [T, HS], injection [T, HC] or [T, 0])."""
    t, d = xn.shape
    hs = d // hc_count
    down = gemv(w_down, xn)  # [T, R (+ HC + pad)], one rounding
    lora = down[:, :lora_rank].float() / hc_count
    lora = (lora * torch.sigmoid(lora)).to(xn.dtype)  # silu(d / HC), rounded (vLLM's _hc_silu_kernel)
    gate = gemv(w_up, lora).float().view(t, hc_count, hs)  # [T, HC, HS], rounded by the GEMM
    xs = xn.float().view(t, hc_count, hs)
    acc = torch.zeros(t, hs, dtype=torch.float32, device=xn.device)
    for s in range(hc_count):  # in stream order, as vLLM's _hc_gate_mix_kernel
        acc = _fma64(torch.sigmoid(gate[:, s]), xs[:, s], acc)
    block_input = (acc / hc_count).to(xn.dtype)
    if use_combine:
        injection = down[:, lora_rank : lora_rank + hc_count].clone()
    else:
        injection = xn.new_empty((t, 0))
    return block_input, injection


def hc_mix(
    h: Tensor, norm_weight: Tensor, w_down: Tensor, w_up: Tensor, hc_count: int, lora_rank: int, eps: float
) -> tuple[Tensor, Tensor]:
    """Qwen4Exp GatedResidual.mix (vLLM 0.32, models/qwen4_exp/nvidia/hyperconnection.py).

    h: [T, D] streams (D = HC * HS, stream s is h[:, s HS : (s+1) HS]); norm_weight [HS] or [D];
    w_down: [R + HC + pad, D] (merged down + inject, pad = (-(R + HC)) mod 16) or [R, D] (final
    mixer, use_combine=False); w_up: [D, R]. All in one dtype (fp16 or bf16). In order, with the
    roundings to that dtype vLLM's nvidia kernels have:
        xn    = grouped Gemma RMSNorm(h)           float32, y = fma(y, w, y), rounded  [T, D]
        down  = xn w_down^T                        float32 accumulation, rounded       [T, rows]
        lora  = silu(down[:, :R] / HC)             float32, rounded                    [T, R]
        gate  = lora w_up^T                        float32 accumulation, rounded       [T, D]
        block_input = (sum_s fma(sigmoid(gate_s), xn_s, acc)) / HC  streams in order, rounded [T, HS]
        injection   = down[:, R : R + HC]                     [T, HC] ([T, 0] for the final mixer)
    Returns (block_input, injection); vLLM's mix also returns h itself, unchanged.
    """
    use_combine = check_hc_shapes(h, norm_weight, w_down, w_up, hc_count, lora_rank)
    xn = _hc_norm(h, norm_weight, hc_count, eps)
    return _hc_tail(xn, w_down, w_up, hc_count, lora_rank, use_combine)


def hc_combine_mix(
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
    """Qwen4Exp GatedResidual.combine_and_mix: the pending combine, then mix (see hc_mix).

    h: [T, D]; block_output: [T, HS] (the pending block's output); injection: [T, HC] logits of the
    pending block's mix, or None (unit weight). Per stream s, in float32 (vLLM's
    _hc_combine_norm_kernel):
        c_s   = 2 sigmoid(injection_s / HC)   (1 without injection)
        h'_s  = fma(block_output, c_s, h_s)   (h_s + block_output without injection), rounded
    then hc_mix(h'). Returns (h' [T, D], block_input [T, HS], injection' [T, HC] or [T, 0]).
    """
    use_combine = check_hc_shapes(h, norm_weight, w_down, w_up, hc_count, lora_rank)
    t, d = h.shape
    hs = d // hc_count
    bad_injection = injection is not None and tuple(injection.shape) != (t, hc_count)
    if tuple(block_output.shape) != (t, hs) or bad_injection:
        raise ValueError(
            f"hc: block_output {tuple(block_output.shape)} (want [{t}, {hs}]), injection "
            f"{None if injection is None else tuple(injection.shape)} (want [{t}, {hc_count}] or None)"
        )
    res = h.float().view(t, hc_count, hs)
    out = block_output.float().view(t, 1, hs)
    if injection is None:
        combined = res + out
    else:
        c = 2.0 * torch.sigmoid(injection.float() / hc_count)  # [T, HC]
        combined = _fma64(out.expand_as(res), c.view(t, hc_count, 1).expand_as(res), res)
    h_new = combined.reshape(t, d).to(h.dtype)  # rounded before the norm, as vLLM's fused kernel
    xn = _hc_norm(h_new, norm_weight, hc_count, eps)
    block_input, inj = _hc_tail(xn, w_down, w_up, hc_count, lora_rank, use_combine)
    return h_new, block_input, inj


# --- Gated-DeltaNet input projection ----------------------------------------------------------


def gdn_input(
    x: Tensor,
    w_qkvz: Tensor,
    w_ba: Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    layout: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Part 1 of vLLM's QwenGatedDeltaNetAttention (input projections and their split).

    x: [K] or [T, K]. Returns what vLLM's GDN core takes: mixed_qkv [T, 2*nk*dk + nv*dv] =
    [all q | all k | all v], z [T, nv, dv], b [T, nv], a [T, nv] (T = 1 for a 1-D x); each GEMM
    accumulates in float32 and rounds once to x.dtype.
    layout "flat" (gqa_interleaved_layout=False: Qwen3.5, Qwen4Exp): w_qkvz [2*nk*dk + 2*nv*dv, K]
    rows [q | k | v | z], w_ba [2*nv, K] rows [b | a]; qkvz.split([2 nk dk + nv dv, nv dv]),
    ba.chunk(2).
    layout "interleaved" (Qwen3-Next): rows grouped per key head, w_qkvz [q (dk) | k (dk) | v (r dv)
    | z (r dv)] and w_ba [b (r) | a (r)], r = nv / nk; de-interleaved as
    fix_query_key_value_ordering does.
    """
    nk, nv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    check_gdn_shapes(x, w_qkvz, w_ba, nk, nv, dk, dv, layout)
    x2 = x.reshape(-1, x.shape[-1])  # [T, K]
    t = x2.shape[0]
    qkvz = gemv(w_qkvz, x2)  # [T, 2 nk dk + 2 nv dv]
    ba = gemv(w_ba, x2)  # [T, 2 nv]
    # clones, so that no output aliases another (custom-op outputs must be fresh tensors)
    if layout == "flat":
        mixed_qkv, z = qkvz.split([2 * nk * dk + nv * dv, nv * dv], dim=-1)
        b, a = ba.chunk(2, dim=-1)
        return mixed_qkv.contiguous(), z.reshape(t, nv, dv).contiguous(), b.contiguous(), a.contiguous()
    r = nv // nk
    q, k, v, z = torch.split(qkvz.view(t, nk, 2 * dk + 2 * r * dv), [dk, dk, r * dv, r * dv], dim=2)
    b, a = torch.split(ba.view(t, nk, 2 * r), [r, r], dim=2)
    mixed_qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
    return mixed_qkv, z.reshape(t, nv, dv).clone(), b.reshape(t, nv).clone(), a.reshape(t, nv).clone()


def check_gdn_shapes(
    x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int, layout: str
) -> None:
    if layout not in GDN_LAYOUTS:
        raise ValueError(f"gdn_input: layout {layout!r}: want one of {GDN_LAYOUTS}")
    if min(nk, nv, dk, dv) < 1 or (layout == "interleaved" and nv % nk != 0):
        raise ValueError(f"gdn_input: heads nk={nk} nv={nv} dk={dk} dv={dv} do not fit the {layout} layout")
    hidden = x.shape[-1]
    want_qkvz = (2 * nk * dk + 2 * nv * dv, hidden)
    want_ba = (2 * nv, hidden)
    if x.dim() not in (1, 2) or tuple(w_qkvz.shape) != want_qkvz or tuple(w_ba.shape) != want_ba:
        raise ValueError(
            f"gdn_input: x {tuple(x.shape)}, w_qkvz {tuple(w_qkvz.shape)} (want {want_qkvz}), "
            f"w_ba {tuple(w_ba.shape)} (want {want_ba}) do not fit"
        )


# --- QSA top-k ------------------------------------------------------------------------------------


def _order_keys(logits: Tensor) -> Tensor:
    """The order-preserving 32-bit key of every fp32 value (the kernels' key_of), as int64:
    NaN (any payload) -> 2^32 - 1, above +inf; -0.0 and +0.0 -> 2^31; others monotone."""
    u = logits.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [rows, L] raw bits
    keys = torch.where(u >= 0x80000000, 0xFFFFFFFF - u, u | 0x80000000)
    keys = torch.where((u & 0x7FFFFFFF) == 0, torch.full_like(keys, 0x80000000), keys)
    return torch.where(torch.isnan(logits), torch.full_like(keys, 0xFFFFFFFF), keys)


def qsa_topk(logits: Tensor, visible_blocks: Tensor, k: int) -> Tensor:
    """Block selection of Qwen4Exp's QSA indexer (`_topk` in vLLM's qwen4_exp/nvidia/ops/qsa_indexer.py).

    logits: [rows, L] float32 (any row stride); visible_blocks: [rows] int32, n_r = visible_blocks[r]
    clamped to [0, L]. Only columns 0..n_r-1 of row r are eligible; the rest may hold anything (NaN,
    inf, stale values) and are never read into the result. Returns block_indices [rows, k] int32:
      n_r <= k: 0, 1, ..., n_r - 1, then -1 (increasing index);
      n_r >  k: the set of the k largest eligible values (ties at the k-th value go to the lower
                indices: the first k of a stable sort by value descending), written in increasing
                index order. NaN of any payload ranks above +inf and all NaNs tie; -0.0 == +0.0.
    vLLM's consumer (`expand_qsa_block_indices`) expands the first min(n_r, k) entries block by block
    and needs no order; qsa_topk_by_value gives the same set in the stable sort's order.
    """
    by_value = qsa_topk_by_value(logits, visible_blocks, k)  # [rows, k]; -1 pads rows of n_r < k
    top = torch.iinfo(torch.int32).max  # the padding sorts last and goes back to -1
    ordered = torch.sort(torch.where(by_value < 0, top, by_value), dim=1).values  # [rows, k]
    return torch.where(ordered == top, -1, ordered)


def qsa_topk_by_value(logits: Tensor, visible_blocks: Tensor, k: int) -> Tensor:
    """qsa_topk's set in value order: the first k of a stable sort by value descending (n_r > k), as
    vLLM's debug path and earlier versions of this route order it; rows of n_r <= k as qsa_topk."""
    if logits.dim() != 2 or visible_blocks.shape != (logits.shape[0],) or k < 1:
        raise ValueError(
            f"qsa_topk: logits {tuple(logits.shape)}, visible_blocks {tuple(visible_blocks.shape)}, k={k}: "
            "need [rows, L], [rows] and k >= 1"
        )
    rows, width = logits.shape
    n = visible_blocks.to(torch.int64).clamp(0, width).view(rows, 1)  # [rows, 1]
    cols = torch.arange(width, device=logits.device).view(1, width)  # [1, L]
    # [rows, L]; -1 (below every key) marks the columns that are not eligible
    keys = torch.where(cols < n, _order_keys(logits.float()), torch.full_like(n, -1))
    order = torch.sort(keys, dim=1, descending=True, stable=True).indices  # [rows, L]
    take = min(k, width)
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    slots = torch.arange(k, device=logits.device).view(1, k)
    short = n <= k  # [rows, 1]: the first n indices in increasing order
    out[:, :take] = torch.where(short, cols[:, :take].expand(rows, take), order[:, :take]).to(torch.int32)
    return torch.where(slots < n, out, torch.full_like(out, -1))
