"""One case per route and shape: how to draw fresh inputs, call the route, its reference, its
baseline and a probe that must fall back; and how many bytes a call must move at least.

Default shapes: Qwen3-Next-80B at TP4 as the stand-in for the Qwen3.8 model (hidden 2048; GDN 16
key and 32 value heads of 128 in all, 4 and 8 per GPU at TP4), the projection GEMVs of the issue
and the per-GPU lm_head 37984 x 2048.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import qgate_kernels
from qgate_kernels import reference

Inputs = tuple[Any, ...]
Maker = Callable[[torch.Generator, torch.device], Inputs]

DEFAULT_SHAPES: dict[str, list[dict[str, int]]] = {
    "fp16_gemv": [
        {"n": 2048, "k": 2048},
        {"n": 3072, "k": 2048},
        {"n": 4096, "k": 4096},
        {"n": 2048, "k": 4096},
        {"n": 37984, "k": 2048},
        {"n": 14336, "k": 4096},
    ],
    "fused_hc_fp16": [{"streams": 4, "hidden": 2048}],
    "fused_gdn_input_fp16": [
        {"hidden": 2048, "num_k_heads": 4, "num_v_heads": 8, "head_k_dim": 128, "head_v_dim": 128},
        {"hidden": 2048, "num_k_heads": 16, "num_v_heads": 32, "head_k_dim": 128, "head_v_dim": 128},
    ],
    "qsa_topk": [{"rows": 1, "length": 131072, "k": 2048}, {"rows": 8, "length": 32768, "k": 1024}],
}


@dataclass(frozen=True)
class Case:
    route: str
    shape: dict[str, int]
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

    @property
    def label(self) -> str:
        return "x".join(str(v) for v in self.shape.values())


def _randn(
    gen: torch.Generator, dev: torch.device, *shape: int, dtype: torch.dtype, scale: float = 1.0
) -> Tensor:
    return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)


def gemv_case(n: int, k: int) -> Case:
    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        # weights scaled as in a trained layer so that y stays O(1) whatever k is
        return (
            _randn(gen, dev, n, k, dtype=torch.half, scale=k**-0.5),
            _randn(gen, dev, k, dtype=torch.half),
        )

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        w, _ = make(gen, dev)
        return (w, _randn(gen, dev, 4, k, dtype=torch.half))  # prefill: M = 4

    return Case(
        route="fp16_gemv",
        shape={"n": n, "k": k},
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


def hc_case(streams: int, hidden: int) -> Case:
    n, d = streams, hidden

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        return (
            _randn(gen, dev, n, d, dtype=torch.half),
            (1 + 0.1 * torch.randn(d, generator=gen, device=dev)).half(),
            _randn(gen, dev, n + 1, d, dtype=torch.half, scale=d**-0.5),
            _randn(gen, dev, n, n + 1, dtype=torch.float32, scale=0.5),
            0.05 + 0.5 * torch.rand(1, generator=gen, device=dev),
            _randn(gen, dev, d, dtype=torch.half, scale=d**-0.5),
            1 + 0.1 * torch.randn(n, generator=gen, device=dev),
            0.05 + 0.5 * torch.rand(1, generator=gen, device=dev),
        )

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        args = make(gen, dev)
        return (torch.stack([args[0], args[0].flip(0)]), *args[1:])  # two tokens

    halves = n * d + d + (n + 1) * d + d + d + n * d
    return Case(
        route="fused_hc_fp16",
        shape={"streams": n, "hidden": d},
        make=make,
        kernel=lambda *a: qgate_kernels.fused_hc(*a, 1e-6),
        reference=lambda *a: reference.fused_hc(*a, 1e-6),
        baseline=lambda *a: reference.fused_hc(*a, 1e-6),
        baseline_name="unfused torch sequence (reference.fused_hc)",
        probe=probe,
        probe_reason="m_gt_1",
        bytes_moved=2 * halves + 4 * (n * (n + 1) + 2 * n + 2),
    )


def unfused_gdn(
    x: Tensor, w_qkvz: Tensor, w_ba: Tensor, nk: int, nv: int, dk: int, dv: int
) -> tuple[Tensor, ...]:
    """vLLM's Qwen3-Next sequence: two F.linear, then split / reshape / cat into the GDN layout."""
    r = nv // nk
    x2 = x.view(1, -1)  # [1, hidden]
    qkvz = F.linear(x2, w_qkvz).view(1, nk, 2 * dk + 2 * r * dv)
    ba = F.linear(x2, w_ba).view(1, nk, 2 * r)
    q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=2)
    b, a = torch.split(ba, [r, r], dim=2)
    mixed = torch.cat((q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)), dim=-1)
    return mixed, z.reshape(1, nv, dv), b.reshape(1, nv), a.reshape(1, nv)


def gdn_case(hidden: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int) -> Case:
    heads = (num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    rows_qkvz = 2 * num_k_heads * head_k_dim + 2 * num_v_heads * head_v_dim
    rows = rows_qkvz + 2 * num_v_heads

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        s = hidden**-0.5
        return (
            _randn(gen, dev, hidden, dtype=torch.half),
            _randn(gen, dev, rows_qkvz, hidden, dtype=torch.half, scale=s),
            _randn(gen, dev, 2 * num_v_heads, hidden, dtype=torch.half, scale=s),
        )

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        x, wq, wb = make(gen, dev)
        return (_randn(gen, dev, 3, hidden, dtype=torch.half), wq, wb)  # prefill: 3 tokens

    return Case(
        route="fused_gdn_input_fp16",
        shape={"hidden": hidden, "nk": num_k_heads, "nv": num_v_heads, "dk": head_k_dim, "dv": head_v_dim},
        make=make,
        kernel=lambda x, wq, wb: qgate_kernels.gdn_input(x, wq, wb, *heads, static_weight=True),
        reference=lambda x, wq, wb: reference.gdn_input(x, wq, wb, *heads),
        baseline=lambda x, wq, wb: unfused_gdn(x, wq, wb, *heads),
        baseline_name="2x F.linear + split/reshape/cat (vLLM)",
        probe=probe,
        probe_reason="m_gt_1",
        bytes_moved=2 * (rows * hidden + hidden + rows),
        meta={
            "plain": lambda x, wq, wb: qgate_kernels.gdn_input(x, wq, wb, *heads),
            "producer": lambda x, wq, wb: x.mul_(1.0),
        },
    )


def topk_case(rows: int, length: int, k: int) -> Case:
    counter = {"n": 0}

    def make(gen: torch.Generator, dev: torch.device) -> Inputs:
        scores = torch.randn(rows, length, generator=gen, device=dev)
        counter["n"] += 1
        if counter["n"] % 2 == 0:  # every other draw: heavy ties, both zeros, infinities, NaNs
            scores = torch.round(scores * 4) / 4
            flat = scores.view(-1)
            pos = torch.randint(0, flat.numel(), (8,), generator=gen, device=dev)
            flat[pos[:2]] = float("nan")
            flat[pos[2:4]] = -0.0
            flat[pos[4:6]] = float("inf")
            flat[pos[6:]] = float("-inf")
        return (scores, k)

    def probe(gen: torch.Generator, dev: torch.device) -> Inputs:
        big_k = qgate_kernels.ops.TOPK_MAX_K + 1
        return (torch.randn(1, max(length, big_k), generator=gen, device=dev), big_k)

    return Case(
        route="qsa_topk",
        shape={"rows": rows, "length": length, "k": k},
        make=make,
        kernel=lambda s, kk: qgate_kernels.qsa_topk(s, kk),
        reference=lambda s, kk: reference.qsa_topk(s, kk),
        baseline=lambda s, kk: torch.topk(s, kk),
        baseline_name="torch.topk",
        probe=probe,
        probe_reason="k_too_large",
        bytes_moved=4 * rows * length + rows * k * (4 + 8),
        meta={"input_kind": _topk_input_kind},
    )


def _topk_input_kind(scores: Tensor, k: int) -> str:
    """'ties' for the draws in steps of 0.25 (with NaN, infinities and signed zeros), else
    'continuous' (torch.randn: no row of it is all multiples of 0.25)."""
    finite = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)
    return "ties" if torch.equal(finite, torch.round(finite * 4) / 4) else "continuous"


_BUILDERS: dict[str, Callable[..., Case]] = {
    "fp16_gemv": gemv_case,
    "fused_hc_fp16": hc_case,
    "fused_gdn_input_fp16": gdn_case,
    "qsa_topk": topk_case,
}


def build_cases(
    routes: list[str], shapes: dict[str, list[dict[str, int]]], default_shapes: bool
) -> list[Case]:
    """Cases for the routes, at the default shapes (if asked) and then the given ones, without repeats."""
    cases: list[Case] = []
    for route in routes:
        wanted = (DEFAULT_SHAPES[route] if default_shapes else []) + list(shapes.get(route, []))
        seen: list[dict[str, int]] = []
        for shape in wanted:
            if shape not in seen:
                seen.append(shape)
                cases.append(_BUILDERS[route](**shape))
    return cases
