"""The CUDA kernels against float64 oracles and the references (skipped without a CUDA GPU)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from kernel_oracles import (
    acc_bound,
    fp16_close,
    fresh_generator,
    fused_hc64,
    gdn_input64,
    gemv64,
    half_ulp,
    randn,
    topk_oracle,
    ulp_distance,
)

import qgate_kernels
from qgate_kernels import ops, reference

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEV = "cuda"


@pytest.fixture(autouse=True)
def _clean_counts() -> None:
    qgate_kernels.reset_fallback_counts()


def _no_fallbacks() -> bool:
    return all(not reasons for reasons in qgate_kernels.fallback_counts().values())


def test_cuda_kernels_are_built() -> None:
    assert qgate_kernels.cuda_kernels_available(), qgate_kernels.build_info()


GEMV_SHAPES = [
    (1, 8),
    (7, 264),
    (33, 2048),
    (2048, 2048),
    (3072, 2048),
    (2048, 4096),
    (512, 8192),
    (300, 16384),
]
GEMV_SHAPES += [(64, 30000), (37984, 2048)]  # x beyond the shared-memory stage; the lm_head


@pytest.mark.parametrize(("n", "k"), GEMV_SHAPES)
def test_gemv_matches_float64_and_reference(n: int, k: int) -> None:
    gen, seed = fresh_generator(DEV)
    w = randn(gen, n, k, dtype=torch.half, device=DEV, scale=k**-0.5)
    for x in (randn(gen, k, dtype=torch.half, device=DEV), randn(gen, 1, k, dtype=torch.half, device=DEV)):
        y = qgate_kernels.gemv(w, x)
        assert y.shape == (*x.shape[:-1], n)
        ref64 = gemv64(w, x)
        dot_abs = x.double().abs() @ w.double().abs().t()
        acc = acc_bound(dot_abs, k)
        assert fp16_close(y, ref64, acc).all(), f"seed {seed}"
        assert _agrees_with_float32_reference(y, reference.gemv(w, x), ref64, acc), f"seed {seed}"
        assert torch.equal(y, qgate_kernels.gemv(w, x)), "two calls differ"
    assert _no_fallbacks()


def _agrees_with_float32_reference(y: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, acc) -> bool:
    """Another float32 summation order (cuBLAS's) rounds to the same fp16 or a neighbour, except
    rarely where cancellation leaves |y| small against the terms (seen: 3 ULP on 1 of 75968
    lm_head outputs, 1 of 512 at K = 8192); such outliers must be few (at most 2 or 0.1 %) and
    within both results' accumulation error."""
    ulps = ulp_distance(y, ref32)
    far = ulps > 1
    within = (y.double() - ref32.double()).abs() <= 2 * (half_ulp(ref64) * 1.001 + acc)
    return bool(int(far.sum()) <= max(2, far.numel() // 1000) and within[far].all())


def test_gemv_takes_offset_rows_but_not_misaligned_ones() -> None:
    gen, _ = fresh_generator(DEV)
    big = randn(gen, 65, 256, dtype=torch.half, device=DEV)
    x = randn(gen, 256, dtype=torch.half, device=DEV)
    assert torch.equal(qgate_kernels.gemv(big[1:], x), qgate_kernels.gemv(big[1:].clone(), x))
    flat = randn(gen, 64 * 256 + 1, dtype=torch.half, device=DEV)
    w_odd = flat[1:].view(64, 256)  # 2-byte offset: no 16-byte loads
    y = qgate_kernels.gemv(w_odd, x)
    assert torch.equal(y, reference.gemv(w_odd, x))
    assert qgate_kernels.fallback_counts()[ops.ROUTE_GEMV] == {"layout": 1}


def test_gemv_prefill_falls_back_to_the_reference() -> None:
    gen, _ = fresh_generator(DEV)
    w, x = randn(gen, 96, 512, dtype=torch.half, device=DEV), randn(gen, 5, 512, dtype=torch.half, device=DEV)
    assert torch.equal(qgate_kernels.gemv(w, x), reference.gemv(w, x))
    assert qgate_kernels.fallback_counts()[ops.ROUTE_GEMV] == {"m_gt_1": 1}


GDN_SHAPES = [(2048, 4, 8, 128, 128), (2048, 16, 32, 128, 128), (64, 2, 4, 16, 8), (136, 1, 3, 8, 24)]


@pytest.mark.parametrize(("hidden", "nk", "nv", "dk", "dv"), GDN_SHAPES)
def test_gdn_input_matches_float64_and_the_gemv_bits(hidden: int, nk: int, nv: int, dk: int, dv: int) -> None:
    gen, seed = fresh_generator(DEV)
    x = randn(gen, hidden, dtype=torch.half, device=DEV)
    wq = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.half, device=DEV, scale=hidden**-0.5)
    wb = randn(gen, 2 * nv, hidden, dtype=torch.half, device=DEV, scale=hidden**-0.5)
    got = qgate_kernels.gdn_input(x, wq, wb, nk, nv, dk, dv)
    want = gdn_input64(x.cpu(), wq.cpu(), wb.cpu(), nk, nv, dk, dv)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.is_contiguous()
        dot_abs = torch.full_like(w, 4.0)  # sum |w x| is about 0.64 sqrt(hidden) here
        assert fp16_close(g.cpu(), w, acc_bound(dot_abs * hidden**0.5, hidden)).all(), f"seed {seed}"
    # The fused kernel's rows are the GEMV kernel's rows, bit for bit, only placed elsewhere.
    r = nv // nk
    yq, yb = qgate_kernels.gemv(wq, x), qgate_kernels.gemv(wb, x)
    q, k, v, z = torch.split(yq.view(nk, -1), [dk, dk, r * dv, r * dv], dim=1)
    b, a = torch.split(yb.view(nk, 2 * r), [r, r], dim=1)
    assert torch.equal(got[0][0], torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)]))
    assert torch.equal(got[1].view(-1), z.reshape(-1))
    assert torch.equal(got[2].view(-1), b.reshape(-1)) and torch.equal(got[3].view(-1), a.reshape(-1))
    assert _no_fallbacks()


def _hc_args(gen: torch.Generator, n: int, d: int) -> tuple:
    return (
        randn(gen, n, d, dtype=torch.half, device=DEV),
        (1 + 0.1 * randn(gen, d, dtype=torch.float32, device=DEV)).half(),
        randn(gen, n + 1, d, dtype=torch.half, device=DEV, scale=d**-0.5),
        randn(gen, n, n + 1, dtype=torch.float32, device=DEV, scale=0.5),
        0.05 + 0.5 * torch.rand(1, generator=gen, device=DEV),
        randn(gen, d, dtype=torch.half, device=DEV, scale=d**-0.5),
        1 + 0.1 * randn(gen, n, dtype=torch.float32, device=DEV),
        0.05 + 0.5 * torch.rand(1, generator=gen, device=DEV),
    )


@pytest.mark.parametrize(("n", "d"), [(4, 2048), (1, 8), (2, 4096), (8, 2048), (3, 2056), (4, 16384)])
def test_fused_hc_matches_float64(n: int, d: int) -> None:
    gen, seed = fresh_generator(DEV)
    args = _hc_args(gen, n, d)
    li, mixed, b = qgate_kernels.fused_hc(*args, 1e-6)
    li64, mixed64, b64 = fused_hc64(*(a.cpu() for a in args), 1e-6)
    a_max = float(args[3].abs().max()) + float(args[4]) + 1
    h_abs = args[0].double().abs().sum(0).cpu()
    assert fp16_close(li.cpu(), li64, acc_bound(a_max * h_abs, n) + 1e-5 * a_max * h_abs).all(), (
        f"seed {seed}"
    )
    bound = acc_bound(a_max * h_abs, n) + 1e-5 * a_max * h_abs
    assert fp16_close(mixed.cpu(), mixed64, bound.expand(n, d)).all(), f"seed {seed}"
    torch.testing.assert_close(b.double().cpu(), b64, rtol=2e-6, atol=2e-6, msg=f"seed {seed}")
    again = qgate_kernels.fused_hc(*args, 1e-6)
    assert all(torch.equal(p, q) for p, q in zip((li, mixed, b), again, strict=True)), "two calls differ"
    assert _no_fallbacks()


def _tie_heavy(gen: torch.Generator, rows: int, length: int) -> torch.Tensor:
    s = torch.round(torch.randn(rows, length, generator=gen, device=DEV) * 2) / 2
    flat = s.view(-1)
    pos = torch.randperm(flat.numel(), generator=gen, device=DEV)[:12]
    nan_bits = torch.tensor([0x7FC00001, -0x00400000, 0x7F800001], dtype=torch.int32, device=DEV)
    flat[pos[:3]] = nan_bits.view(torch.float32)
    flat[pos[3:6]] = -0.0
    flat[pos[6:9]] = float("inf")
    flat[pos[9:]] = float("-inf")
    return s


TOPK_SHAPES = [
    (1, 131072, 2048),
    (4, 131072, 2048),
    (8, 32768, 1024),
    (3, 257, 257),
    (2, 1000, 1),
    (1, 5000, 4096),
]
TOPK_SHAPES += [(3000, 512, 16), (1, 2**20, 64)]  # more rows than fit at once (one block a row); a long row


@pytest.mark.parametrize(("rows", "length", "k"), TOPK_SHAPES)
def test_topk_is_exact_and_stable(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator(DEV)
    for scores in (torch.randn(rows, length, generator=gen, device=DEV), _tie_heavy(gen, rows, length)):
        values, indices = qgate_kernels.qsa_topk(scores, k)
        ref_values, ref_indices = reference.qsa_topk(scores, k)
        assert torch.equal(indices, ref_indices), f"seed {seed}"
        assert torch.equal(values.view(torch.int32), ref_values.view(torch.int32)), f"seed {seed}"
        again = qgate_kernels.qsa_topk(scores, k)
        assert torch.equal(again[1], indices)
    assert _no_fallbacks()


def _lumpy(gen: torch.Generator, rows: int, length: int) -> torch.Tensor:
    """Rows whose top k hold large cells of one key (0.5 % of the row each; 0.15 %) beside a large
    cell of many keys (one byte-2 bin, 0.4 %), above a dense band: the two ways large cells are
    ranked (from the list order; by counting)."""
    pick = torch.randint(0, 10000, (rows, length), generator=gen, device=DEV, dtype=torch.int32)
    low = torch.randint(0, 1 << 23, (rows, length), generator=gen, device=DEV, dtype=torch.int32)
    one = 0x3F800000  # 1.0
    bits = 0x3F000000 | low  # below 1
    bits = torch.where(pick < 8000, one | (low & 0x3FFF), bits)
    bits = torch.where(pick < 155, torch.full_like(bits, one | (0x70 << 8)), bits)
    bits = torch.where(pick < 140, one | (0x50 << 8) | (low & 255), bits)
    bits = torch.where(pick < 100, one | ((0x80 + 0x10 * (pick % 2)) << 8), bits)
    return bits.view(torch.float32)


@pytest.mark.parametrize(("rows", "length", "k"), [(1, 131072, 2048), (3, 65536, 1500), (8, 32768, 1024)])
def test_topk_ranks_large_cells_exactly(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator(DEV)
    quarter = torch.round(torch.randn(rows, length, generator=gen, device=DEV) * 4) / 4  # as the bench draws
    for scores in (_lumpy(gen, rows, length), quarter):
        values, indices = qgate_kernels.qsa_topk(scores, k)
        ref_values, ref_indices = reference.qsa_topk(scores, k)
        assert torch.equal(indices, ref_indices), f"seed {seed}"
        assert torch.equal(values.view(torch.int32), ref_values.view(torch.int32)), f"seed {seed}"
    assert _no_fallbacks()


def test_topk_matches_the_python_oracle_on_specials() -> None:
    gen, seed = fresh_generator(DEV)
    scores = _tie_heavy(gen, 2, 3000)
    scores[1, :] = 0.0  # a row of only ties (+0.0, with some -0.0)
    scores[1, ::7] = -0.0
    values, indices = qgate_kernels.qsa_topk(scores, 300)
    want_values, want_indices = topk_oracle(scores.cpu(), 300)
    assert indices.cpu().tolist() == want_indices, f"seed {seed}"
    assert torch.equal(values.view(torch.int32), scores.gather(1, indices).view(torch.int32))


def test_ops_replay_under_cuda_graphs() -> None:
    gen, _ = fresh_generator(DEV)
    w, x = (
        randn(gen, 3072, 2048, dtype=torch.half, device=DEV),
        randn(gen, 2048, dtype=torch.half, device=DEV),
    )
    s = torch.randn(1, 131072, generator=gen, device=DEV)
    hc = _hc_args(gen, 4, 2048)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        qgate_kernels.gemv(w, x), qgate_kernels.qsa_topk(s, 2048), qgate_kernels.fused_hc(*hc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = qgate_kernels.gemv(w, x)
        values, indices = qgate_kernels.qsa_topk(s, 2048)
        li, mixed, b = qgate_kernels.fused_hc(*hc)
    for _ in range(3):
        x.copy_(torch.randn(2048, generator=gen, device=DEV).half())
        s.copy_(torch.randn(1, 131072, generator=gen, device=DEV))
        hc[0].copy_(torch.randn(4, 2048, generator=gen, device=DEV).half())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, qgate_kernels.gemv(w, x))
        assert torch.equal(indices, qgate_kernels.qsa_topk(s, 2048)[1])
        assert all(
            torch.equal(p, q) for p, q in zip((li, mixed, b), qgate_kernels.fused_hc(*hc), strict=True)
        )


def test_opcheck_on_cuda() -> None:
    gen, _ = fresh_generator(DEV)
    nk, nv, dk, dv, hidden = 2, 4, 16, 8, 64
    cases = {
        "gemv": (
            randn(gen, 48, 64, dtype=torch.half, device=DEV),
            randn(gen, 64, dtype=torch.half, device=DEV),
        ),
        "fused_hc": (*_hc_args(gen, 4, 64), 1e-6),
        "gdn_input": (
            randn(gen, hidden, dtype=torch.half, device=DEV),
            randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.half, device=DEV),
            randn(gen, 2 * nv, hidden, dtype=torch.half, device=DEV),
            nk,
            nv,
            dk,
            dv,
        ),
        "qsa_topk": (torch.randn(3, 4000, generator=gen, device=DEV), 33),
    }
    cases["gemv_static"] = (*cases["gemv"], True)  # static_weight=True: the PDL launch on sm_90
    cases["gdn_input_static"] = (*cases["gdn_input"], True)
    for name, args in cases.items():
        torch.library.opcheck(getattr(torch.ops.qgate, name.removesuffix("_static")).default, args)


@pytest.mark.parametrize(("n", "k"), [(3072, 2048), (4096, 4096), (37984, 2048), (7, 264)])
def test_static_weight_launch_gives_the_same_bits(n: int, k: int) -> None:
    """static_weight=True (PDL on sm_90: weights read before the previous kernel has finished)."""
    gen, seed = fresh_generator(DEV)
    w = randn(gen, n, k, dtype=torch.half, device=DEV, scale=k**-0.5)
    x = randn(gen, k, dtype=torch.half, device=DEV)
    assert torch.equal(qgate_kernels.gemv(w, x, static_weight=True), qgate_kernels.gemv(w, x)), f"seed {seed}"


def test_static_weight_chain_reads_x_after_the_previous_kernel() -> None:
    """A chain where each GEMV's x is written by the kernel just before it (another GEMV or a torch
    kernel), eager and under graph replay: every x must be the finished one, so the chain with PDL
    launches equals the chain with plain launches bit for bit."""
    gen, seed = fresh_generator(DEV)
    ws = [randn(gen, 2048, 2048, dtype=torch.half, device=DEV, scale=2048**-0.5) for _ in range(6)]
    x0 = randn(gen, 2048, dtype=torch.half, device=DEV)

    def chain(static: bool) -> torch.Tensor:
        y = x0
        for i, w in enumerate(ws):
            y = qgate_kernels.gemv(w, y, static_weight=static)
            if i % 2:
                y = torch.tanh(y * 1.5)  # a torch kernel between two GEMVs
        return y

    want = chain(False)
    assert torch.equal(chain(True), want), f"seed {seed}"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    for _ in range(3):
        x0.copy_(torch.randn(2048, generator=gen, device=DEV).half())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, chain(False)), f"seed {seed}"


def test_topk_chain_reads_scores_after_the_previous_kernel() -> None:
    """On sm_90 the top-k launches with programmatic dependent launch: a chain where each top-k's
    scores are the values the top-k just before it wrote, under graph replay with fresh inputs,
    must equal the reference chain (a top-k that read its scores before the previous one finished
    would see the last replay's values)."""
    gen, seed = fresh_generator(DEV)
    s = torch.randn(4, 131072, generator=gen, device=DEV)

    def chain(top: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        v1, i1 = top(s, 4096)
        v2, i2 = top(v1, 512)
        v3, i3 = top(v2, 64)
        return [v3, i1, i2, i3]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(qgate_kernels.qsa_topk)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(qgate_kernels.qsa_topk)
    for _ in range(5):
        s.copy_(torch.randn(4, 131072, generator=gen, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        want = chain(reference.qsa_topk)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True)), f"seed {seed}"
        eager = chain(qgate_kernels.qsa_topk)
        assert all(torch.equal(a, b) for a, b in zip(eager, want, strict=True)), f"seed {seed}"
    assert _no_fallbacks()
