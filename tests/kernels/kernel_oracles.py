"""Float64 oracles for the qgate routes, written independently of qgate_kernels.reference
(explicit loops and index arithmetic, no shared helpers), and the fresh random inputs they check."""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor


def fresh_generator(device: str = "cpu") -> tuple[torch.Generator, int]:
    """A generator with a new seed for every check (returned so that a failure can name it)."""
    seed = int.from_bytes(os.urandom(6), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen, seed


def randn(
    gen: torch.Generator, *shape: int, dtype: torch.dtype, device: str = "cpu", scale: float = 1.0
) -> Tensor:
    """Random normal values, never all zero (a zero tensor hides unwritten outputs)."""
    t = torch.randn(*shape, generator=gen, dtype=torch.float32, device=device) * scale
    return t.to(dtype)


def gemv64(weight: Tensor, x: Tensor) -> Tensor:
    return x.double() @ weight.double().t()


def gdn_input64(x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int, layout: str):  # noqa: ANN201
    """Row by row: where each output row lands in (mixed_qkv, z, b, a)."""
    y = gemv64(w_qkvz, x.reshape(-1))
    yba = gemv64(w_ba, x.reshape(-1))
    mixed = torch.empty(2 * nk * dk + nv * dv, dtype=torch.float64)
    z = torch.empty(nv * dv, dtype=torch.float64)
    b = torch.empty(nv, dtype=torch.float64)
    a = torch.empty(nv, dtype=torch.float64)
    if layout == "flat":  # [q | k | v | z] and [b | a]
        for o in range(y.numel()):
            if o < mixed.numel():
                mixed[o] = y[o]
            else:
                z[o - mixed.numel()] = y[o]
        for o in range(2 * nv):
            if o < nv:
                b[o] = yba[o]
            else:
                a[o - nv] = yba[o]
        return mixed[None], z.reshape(1, nv, dv), b[None], a[None]
    r = nv // nk
    per = 2 * dk + 2 * r * dv
    for g in range(nk):
        for o in range(per):
            v = y[g * per + o]
            if o < dk:
                mixed[g * dk + o] = v
            elif o < 2 * dk:
                mixed[nk * dk + g * dk + o - dk] = v
            elif o < 2 * dk + r * dv:
                mixed[2 * nk * dk + g * r * dv + o - 2 * dk] = v
            else:
                z[g * r * dv + o - 2 * dk - r * dv] = v
    for g in range(nk):
        for o in range(2 * r):
            if o < r:
                b[g * r + o] = yba[g * 2 * r + o]
            else:
                a[g * r + o - r] = yba[g * 2 * r + o]
    return mixed[None], z.reshape(1, nv, dv), b[None], a[None]


def topk_oracle(logits: Tensor, visible: Tensor, k: int) -> list[list[int]]:
    """The block selection by Python's stable sort: per row n = clamp(visible, 0, L) eligible columns;
    n <= k: 0..n-1 then -1; else the first k by value descending (NaN (any payload) first, then +inf,
    ..., -inf, -0.0 == +0.0, ties in index order), written in increasing index order."""

    def key(v: float) -> tuple[int, float]:
        if math.isnan(v):
            return (0, 0.0)
        return (1, -(v + 0.0))  # v + 0.0 turns -0.0 into +0.0

    out = []
    for row, vis in zip(logits.double().tolist(), visible.tolist(), strict=True):
        n = max(0, min(int(vis), len(row)))
        if n <= k:
            out.append(list(range(n)) + [-1] * (k - n))
        else:
            out.append(sorted(sorted(range(n), key=lambda i: key(row[i]))[:k]))
    return out


def half_ulp(ref: Tensor) -> Tensor:
    """Half of one fp16 unit in the last place at |ref| (subnormal spacing below 2^-14)."""
    mag = ref.abs().clamp_min(2.0**-14)
    return torch.exp2(torch.floor(torch.log2(mag)) - 10) / 2


def acc_bound(dot_abs: Tensor, n_terms: int) -> Tensor:
    """A generous bound on float32 summation error of n_terms terms whose |values| sum to dot_abs
    (8 sqrt(n) units of 2^-24: far above the error of any fixed summation order on random data)."""
    return 8 * math.sqrt(n_terms) * 2.0**-24 * dot_abs


def fp16_close(out: Tensor, ref: Tensor, acc_err: Tensor) -> Tensor:
    """out is ref rounded once to fp16, up to the float32 accumulation error acc_err."""
    bound = half_ulp(ref) * 1.001 + acc_err + 1e-30
    return (out.double() - ref).abs() <= bound


def ulp_distance(a: Tensor, b: Tensor) -> Tensor:
    """Per-element distance in fp16 units in the last place between two fp16 tensors."""
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    # map sign-magnitude to a monotonic integer line
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return (ia - ib).abs()
