"""One case per route and shape: how to draw fresh inputs, call the route, its reference, its
baseline and a probe that must fall back; and how many bytes a call must move at least.

Default shapes: the production model's (Qwen3.8-Flash-Next), per GPU at TP=4 and then TP=1, derived
from its published config in qgate.ops.shapes: every unquantized decode projection of the GEMV route
(e.g. GDN out 2560 x 1536, QSA qkv + indexer 4224 x 2560, lm_head 62080 x 2560 at TP=4), HC 4 x 2560
with low rank 320, GDN input 16 key / 48 value heads of 128 (4 / 12 a GPU at TP=4), QSA top-k k 512
over 65,536 blocks (and over a random part of them in the other rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import qgate_kernels
from qgate.ops.shapes import DEFAULT_SHAPES, MODEL_CONFIG
from qgate_kernels import reference
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK

Inputs = tuple[Any, ...]
Maker = Callable[[torch.Generator, torch.device], Inputs]
Shape = dict[str, Any]

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    route: str
    shape: Shape
    make: Maker  # fresh random inputs (never zeros)
    kernel: Callable[..., tuple[Tensor, ...]]  # the qgate_kernels entry point
    reference: Callable[..., tuple[Tensor, ...]]
    baseline: Callable[..., Any]  # what the route replaces, for the benchmark
    baseline_name: str
    probe: Maker  # inputs the CUDA kernel does not take: must run the reference, counted
    probe_reason: str
    bytes_moved: int  # each input read once, each output written once
    # optional: "plain" (the route without the static-weight launch), "producer" (a kernel that
    # writes the route's activation input, timed before each call: see ops/bench.py)
    meta: dict[str, Any] = field(default_factory=dict)
    # The arguments that are activations (new contents every call, often in the same buffers: vLLM's
    # persistent inputs under CUDA graphs), not weights: the screen's in-place trial refills them.
    activations: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return "x".join(str(v) for v in self.shape.values())


def _randn(
    gen: torch.Generator, dev: torch.device, *shape: int, dtype: torch.dtype, scale: float = 1.0
) -> Tensor:
    return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)


def gemv_case(n: int, k: int, dtype: str = "fp16") -> Case:
    dt = DTYPES[dtype]

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        # weights scaled as in a trained layer so that y stays O(1) whatever k is
        return (
            _randn(gen, dev, n, k, dtype=dt, scale=k**-0.5),
            _randn(gen, dev, k, dtype=dt),
        )

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        w, _ = make(gen, dev)
        return (w, _randn(gen, dev, 4, k, dtype=dt))  # prefill: M = 4

    return Case(
        activations=(1,),
        route="fp16_gemv",
        shape={"n": n, "k": k} if dtype == "fp16" else {"n": n, "k": k, "dtype": dtype},
        make=make,
        # as the vLLM plugin calls it: a model's weights are static (PDL launch on sm_90)
        kernel=lambda w, x: (qgate_kernels.gemv(w, x, static_weight=True),),
        reference=lambda w, x: (reference.gemv(w, x),),
        baseline=lambda w, x: F.linear(x.view(1, -1), w),
        baseline_name="F.linear (cuBLAS)",
        probe=probe,
        probe_reason="m_gt_1",
        bytes_moved=2 * (n * k + k + n),
        meta={
            "plain": lambda w, x: (qgate_kernels.gemv(w, x),),
            "producer": lambda w, x: x.mul_(1.0),  # a kernel that writes x just before the call
        },
    )


def _hc_make(
    hc: int, hidden: int, rank: int, dtype: torch.dtype, use_combine: bool, tokens: int = 1
) -> Maker:
    d = hc * hidden
    rows = reference.hc_down_rows(rank, hc, use_combine)

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        # weights scaled as in a trained layer: the down and up outputs stay O(1)
        return (
            _randn(gen, dev, tokens, d, dtype=dtype),  # h
            _randn(gen, dev, tokens, hidden, dtype=dtype),  # block_output of the pending block
            _randn(gen, dev, tokens, hc, dtype=dtype),  # its injection logits
            _randn(gen, dev, d, dtype=dtype, scale=0.1),  # norm_weight (per stream: hc_per_branch_norm)
            _randn(gen, dev, rows, d, dtype=dtype, scale=d**-0.5),  # w_down (+ inject rows + pad)
            _randn(gen, dev, d, rank, dtype=dtype, scale=rank**-0.5),  # w_up
        )

    return make


def unfused_hc(
    h: Tensor,
    o: Tensor | None,
    inj: Tensor | None,
    nw: Tensor,
    wd: Tensor,
    wu: Tensor,
    hc: int,
    rank: int,
    eps: float,
) -> tuple[Tensor, ...]:
    """The same math as separate torch ops (what the route replaces): combine, grouped norm, two
    F.linear, silu, sigmoid gate mix."""
    t, d = h.shape
    hs = d // hc
    if o is not None:
        c = 1.0 if inj is None else 2.0 * torch.sigmoid(inj.float() / hc).view(t, hc, 1)
        h = (h.float().view(t, hc, hs) + o.float().view(t, 1, hs) * c).view(t, d).to(h.dtype)
    g = h.float().view(t, hc, hs)
    y = g * torch.rsqrt(g.square().mean(dim=-1, keepdim=True) + eps)
    xn = (y + y * nw.float().view(1, -1, hs)).view(t, d).to(h.dtype)
    down = F.linear(xn, wd)
    lora = F.silu(down[:, :rank].float() / hc).to(h.dtype)
    gate = F.linear(lora, wu).float().view(t, hc, hs)
    block_input = (torch.sigmoid(gate) * xn.float().view(t, hc, hs)).sum(dim=1).div(hc).to(h.dtype)
    injection = down[:, rank : rank + hc] if wd.shape[0] != rank else None
    return tuple(x for x in (h if o is not None else None, block_input, injection) if x is not None)


def hc_case(hc_count: int, hidden: int, lora_rank: int, dtype: str = "bf16", op: str = "mix") -> Case:
    """op: "mix" (GatedResidual.mix), "combine_and_mix" (the pending combine with its injection, then
    mix), "final" (the final mixer: combine_and_mix with use_combine=False, no new injection)."""
    hc, rank, eps = hc_count, lora_rank, float(MODEL_CONFIG["rms_norm_eps"])
    use_combine = op != "final"
    make = _hc_make(hc, hidden, rank, DTYPES[dtype], use_combine)
    kw: dict[str, Any] = {"hc_count": hc, "lora_rank": rank, "eps": eps}

    def kernel(h: Tensor, o: Tensor, inj: Tensor, nw: Tensor, wd: Tensor, wu: Tensor) -> tuple[Tensor, ...]:
        if op == "mix":
            _, block_input, injection = qgate_kernels.hc_mix(h, nw, wd, wu, **kw)
            return (block_input, injection)
        return tuple(
            t for t in qgate_kernels.hc_combine_and_mix(h, o, inj, nw, wd, wu, **kw) if t is not None
        )

    def ref(h: Tensor, o: Tensor, inj: Tensor, nw: Tensor, wd: Tensor, wu: Tensor) -> tuple[Tensor, ...]:
        if op == "mix":
            out: tuple[Tensor, ...] = reference.hc_mix(h, nw, wd, wu, hc, rank, eps)
        else:
            out = reference.hc_combine_mix(h, o, inj, nw, wd, wu, hc, rank, eps)
        return tuple(t for t in out if t.shape[-1] > 0)

    def baseline(h: Tensor, o: Tensor, inj: Tensor, nw: Tensor, wd: Tensor, wu: Tensor) -> tuple[Tensor, ...]:
        return unfused_hc(h, None if op == "mix" else o, inj, nw, wd, wu, hc, rank, eps)

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        return _hc_make(hc, hidden, rank, DTYPES[dtype], use_combine, tokens=2)(gen, dev)  # two tokens

    d = hc * hidden
    weights = reference.hc_down_rows(rank, hc, use_combine) * d + d * rank + d
    acts = d + hidden + (0 if op == "mix" else d + hidden + hc)  # h, block_input (+ o, h', injection)
    return Case(
        activations=(0, 1, 2),
        route="fused_hc_fp16",
        shape={"hc_count": hc, "hidden": hidden, "lora_rank": rank, "dtype": dtype, "op": op},
        make=make,
        kernel=kernel,
        reference=ref,
        baseline=baseline,
        baseline_name="unfused torch sequence (norm, 2x F.linear, silu, sigmoid mix)",
        probe=probe,
        probe_reason="m_gt_1",
        bytes_moved=2 * (weights + acts),
        meta={"eps": eps},
    )


def unfused_gdn(
    x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int, layout: str
) -> tuple[Tensor, ...]:
    """vLLM's Part 1: two F.linear, then the split of the layout (flat: split + chunk, and the
    .contiguous() copies of b and a vLLM makes; interleaved: view / split / reshape / cat)."""
    x2 = x.view(1, -1)  # [1, hidden]
    if layout == "flat":
        mixed, z = F.linear(x2, w_qkvz).split([2 * nk * dk + nv * dv, nv * dv], dim=-1)
        b, a = F.linear(x2, w_ba).chunk(2, dim=-1)
        return mixed, z.reshape(1, -1, dv), b.contiguous(), a.contiguous()
    r = nv // nk
    qkvz = F.linear(x2, w_qkvz).view(1, nk, 2 * dk + 2 * r * dv)
    ba = F.linear(x2, w_ba).view(1, nk, 2 * r)
    q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=2)
    b, a = torch.split(ba, [r, r], dim=2)
    mixed = torch.cat((q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)), dim=-1)
    return mixed, z.reshape(1, nv, dv), b.reshape(1, nv), a.reshape(1, nv)


def gdn_case(
    hidden: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    layout: str = "flat",
    dtype: str = "fp16",
) -> Case:
    heads = (num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    rows_qkvz = 2 * num_k_heads * head_k_dim + 2 * num_v_heads * head_v_dim
    rows = rows_qkvz + 2 * num_v_heads
    dt = DTYPES[dtype]

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        s = hidden**-0.5
        return (
            _randn(gen, dev, hidden, dtype=dt),
            _randn(gen, dev, rows_qkvz, hidden, dtype=dt, scale=s),
            _randn(gen, dev, 2 * num_v_heads, hidden, dtype=dt, scale=s),
        )

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        x, wq, wb = make(gen, dev)
        return (_randn(gen, dev, 3, hidden, dtype=dt), wq, wb)  # prefill: 3 tokens

    return Case(
        activations=(0,),
        route="fused_gdn_input_fp16",
        shape={
            "hidden": hidden,
            "nk": num_k_heads,
            "nv": num_v_heads,
            "dk": head_k_dim,
            "dv": head_v_dim,
            "layout": layout,
            "dtype": dtype,
        },
        make=make,
        kernel=lambda x, wq, wb: qgate_kernels.gdn_input(
            x, wq, wb, *heads, layout=layout, static_weight=True
        ),
        reference=lambda x, wq, wb: reference.gdn_input(x, wq, wb, *heads, layout),
        baseline=lambda x, wq, wb: unfused_gdn(x, wq, wb, *heads, layout),
        baseline_name="2x F.linear + split (vLLM's Part 1)",
        probe=probe,
        probe_reason="m_gt_1",
        bytes_moved=2 * (rows * hidden + hidden + rows),
        meta={
            "plain": lambda x, wq, wb: qgate_kernels.gdn_input(x, wq, wb, *heads, layout=layout),
            "producer": lambda x, wq, wb: x.mul_(1.0),
        },
    )


def masked_topk(logits: Tensor, visible: Tensor, k: int) -> Tensor:
    """vLLM's debug top-k (backend "torch" in model_executor/layers/indexer_topk.py): every column
    past a row's end set to -inf, torch.topk, -1 past the row's length."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    masked = logits.masked_fill(cols.unsqueeze(0) >= visible.unsqueeze(1), float("-inf"))
    kk = min(k, logits.shape[1])
    indices = masked.topk(kk, dim=-1).indices
    in_range = torch.arange(kk, device=logits.device).unsqueeze(0) < visible.unsqueeze(1)
    out = torch.full((logits.shape[0], k), -1, dtype=torch.int32, device=logits.device)
    out[:, :kk] = torch.where(in_range, indices, -1)
    return out


def topk_case(rows: int, length: int, k: int, visible: int | None = None) -> Case:
    """logits [rows, length] with a row stride of length + 64 (vLLM's buffers are wider than the row),
    `visible` columns (default all) visible in row 0 (the timed row) and a random n in [k/2, length]
    in the others; the columns past n and the stride's padding hold NaN and inf that must never be
    selected. Draws cycle through five kinds: continuous (randn); values in steps of 0.25 (heavy
    ties) with NaN, inf and signed zeros; integers 0..63 (every value shared by ~L/64 keys); the
    production indexer's scores (indexer_scores: relu(q . k) summed over the indexer heads over
    sqrt(head dim); continuous, some exactly 0); exp(3 N(0,1)) (spread over ~26 binades)."""
    counter = {"n": 0}
    stride = length + 64

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        buf = torch.randn(rows, stride, generator=gen, device=dev)
        counter["n"] += 1
        kind = counter["n"] % 5
        if kind == 0:  # integers 0..63
            buf = torch.randint(0, 64, (rows, stride), generator=gen, device=dev).float()
        elif kind == 2:  # heavy ties, both zeros, infinities, NaNs
            buf = torch.round(buf * 4) / 4
            r = torch.randint(0, rows, (8,), generator=gen, device=dev)
            c = torch.randint(0, length, (8,), generator=gen, device=dev)
            specials = [float("nan")] * 2 + [-0.0] * 2 + [float("inf")] * 2 + [float("-inf")] * 2
            buf[r, c] = torch.tensor(specials, device=dev)
        elif kind == 3:  # the indexer's own scores: non-negative, exact zeros, continuous top
            buf = indexer_scores(gen, dev, rows, stride)
        elif kind == 4:  # exp(3 N(0,1))
            buf = torch.exp(3 * buf)
        vis = torch.randint(k // 2, length + 1, (rows,), generator=gen, device=dev).to(torch.int32)
        vis[0] = length if visible is None else visible
        cols = torch.arange(stride, device=dev)
        garbage = torch.where(cols % 2 == 0, float("nan"), float("inf")).expand(rows, stride)
        buf = torch.where(cols.unsqueeze(0) >= vis.unsqueeze(1), garbage, buf)
        return (buf[:, :length], vis, k)

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        big_k = qgate_kernels.ops.TOPK_MAX_K + 1
        return (
            torch.randn(1, length, generator=gen, device=dev),
            torch.full((1,), length, dtype=torch.int32, device=dev),
            big_k,
        )

    return Case(
        activations=(0,),
        route="qsa_topk",
        shape={"rows": rows, "length": length, "k": k, **({} if visible is None else {"visible": visible})},
        make=make,
        kernel=lambda s, vis, kk: (qgate_kernels.qsa_topk(s, vis, kk),),
        reference=lambda s, vis, kk: (reference.qsa_topk(s, vis, kk),),
        baseline=masked_topk,
        baseline_name="masked torch.topk + -1 fill (vLLM's debug path)",
        probe=probe,
        probe_reason="k_not_supported",
        bytes_moved=4 * (rows * length - length + (visible or length)) + 4 * rows + 4 * rows * k,
        meta={"input_kind": _topk_input_kind},
    )


def indexer_scores(
    gen: torch.Generator, dev: torch.device, rows: int, blocks: int, cfg: dict[str, Any] | None = None
) -> Tensor:
    """Block scores drawn the way Qwen4Exp's QSA indexer forms them: per row (a decode token) its
    indexer queries q [H, D] against one compressed key per block k [blocks, D] (indexer_kv_heads 1),
    relu(q k^T) summed over the H heads, over sqrt(D). float32 [rows, blocks]; about half the dot
    products are cut to zero, so low scores tie at exactly 0 and the top is continuous."""
    cfg = cfg or MODEL_CONFIG
    heads, dim = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    q = torch.randn(rows, heads, dim, generator=gen, device=dev)  # [rows, H, D]
    keys = torch.randn(blocks, dim, generator=gen, device=dev)  # [blocks, D]
    return torch.relu(torch.einsum("rhd,bd->rhb", q, keys)).sum(dim=1) / dim**0.5  # [rows, blocks]


def _topk_input_kind(logits: Tensor, visible: Tensor, k: int) -> str:
    """'integers' (0..63), 'ties' (steps of 0.25, with NaN, infinities and signed zeros),
    'relu_sum' (the indexer's scores: none negative, some exactly 0), 'exp3' (all positive, none
    0), else 'continuous' (torch.randn: no row of it is all multiples of 0.25, some negative)."""
    row = logits[0, : int(visible[0])]
    finite = torch.nan_to_num(row, nan=0.0, posinf=0.0, neginf=0.0)
    if torch.equal(finite, torch.round(finite)) and bool((finite >= 0).all()) and bool((finite < 64).all()):
        return "integers"
    if torch.equal(finite, torch.round(finite * 4) / 4):
        return "ties"
    if bool((finite >= 0).all()):
        return "relu_sum" if bool((finite == 0).any()) else "exp3"
    return "continuous"


_BUILDERS: dict[str, Callable[..., Case]] = {
    ROUTE_GEMV: gemv_case,
    ROUTE_HC: hc_case,
    ROUTE_GDN: gdn_case,
    ROUTE_TOPK: topk_case,
}


def build_cases(routes: list[str], shapes: dict[str, list[Shape]], default_shapes: bool) -> list[Case]:
    """Cases for the routes, at the default shapes (if asked) and then the given ones, without repeats."""
    cases: list[Case] = []
    for route in routes:
        wanted = (DEFAULT_SHAPES[route] if default_shapes else []) + list(shapes.get(route, []))
        seen: list[Shape] = []
        for shape in wanted:
            if shape not in seen:
                seen.append(shape)
                cases.append(_BUILDERS[route](**shape))
    return cases
