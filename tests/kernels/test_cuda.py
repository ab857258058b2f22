"""The CUDA kernels against float64 oracles and the references (skipped without a CUDA GPU).

The references are the ops' CPU kernels, which tests/kernels/test_vllm_agreement.py checks against
vLLM's own Qwen4Exp code on the CPU (vLLM is not installed where the GPU is)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from kernel_oracles import (
    acc_bound,
    fp16_close,
    fresh_generator,
    gdn_input64,
    gemv64,
    half_ulp,
    randn,
    topk_oracle,
    ulp_distance,
)

import qgate_kernels
from qgate.ops.screen import ulp_distance as ulp_at_magnitude
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


# bf16 GEMV at the production model's per-GPU shapes (N x K) and two small ones.
GEMV_BF16_SHAPES = [
    (7, 264),
    (24, 2560),
    (320, 2560),
    (2560, 1536),
    (4096, 2560),
    (320, 10240),
    (62080, 2560),
]


@pytest.mark.parametrize(("n", "k"), GEMV_BF16_SHAPES)
def test_gemv_bf16_is_a_kernel_not_a_fallback(n: int, k: int) -> None:
    gen, seed = fresh_generator(DEV)
    w = randn(gen, n, k, dtype=torch.bfloat16, device=DEV, scale=k**-0.5)
    x = randn(gen, 1, k, dtype=torch.bfloat16, device=DEV)
    y = qgate_kernels.gemv(w, x, static_weight=True)
    assert y.dtype == torch.bfloat16 and y.shape == (1, n)
    # one rounding of float32 sums in another order than the reference's: within 1 ULP
    assert ulp_at_magnitude(y.cpu(), reference.gemv(w.cpu(), x.cpu())) <= 1, f"seed {seed}"
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


@pytest.mark.parametrize("layout", ["flat", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("hidden", "nk", "nv", "dk", "dv"), GDN_SHAPES)
def test_gdn_input_matches_float64_and_its_rows(
    hidden: int, nk: int, nv: int, dk: int, dv: int, dtype: torch.dtype, layout: str
) -> None:
    gen, seed = fresh_generator(DEV)
    x = randn(gen, hidden, dtype=dtype, device=DEV)
    wq = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=dtype, device=DEV, scale=hidden**-0.5)
    wb = randn(gen, 2 * nv, hidden, dtype=dtype, device=DEV, scale=hidden**-0.5)
    got = qgate_kernels.gdn_input(x, wq, wb, nk, nv, dk, dv, layout=layout)
    want = gdn_input64(x.cpu(), wq.cpu(), wb.cpu(), nk, nv, dk, dv, layout)
    ref = reference.gdn_input(x.cpu(), wq.cpu(), wb.cpu(), nk, nv, dk, dv, layout)
    for g, w, r in zip(got, want, ref, strict=True):
        assert g.shape == w.shape and g.is_contiguous() and g.dtype == dtype
        # one rounding of the same float32 sums in another order than the CPU reference
        assert ulp_at_magnitude(g.cpu(), r) <= 1, f"seed {seed}"
        if dtype == torch.float16:
            dot_abs = torch.full_like(w, 4.0)  # sum |w x| is about 0.64 sqrt(hidden) here
            assert fp16_close(g.cpu(), w, acc_bound(dot_abs * hidden**0.5, hidden)).all(), f"seed {seed}"
    assert _no_fallbacks()


@pytest.mark.parametrize(("hidden", "nk", "nv", "dk", "dv"), GDN_SHAPES[:2])
def test_gdn_input_fp16_rows_are_the_gemv_bits(hidden: int, nk: int, nv: int, dk: int, dv: int) -> None:
    gen, seed = fresh_generator(DEV)
    x = randn(gen, hidden, dtype=torch.half, device=DEV)
    wq = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.half, device=DEV, scale=hidden**-0.5)
    wb = randn(gen, 2 * nv, hidden, dtype=torch.half, device=DEV, scale=hidden**-0.5)
    got = qgate_kernels.gdn_input(x, wq, wb, nk, nv, dk, dv, layout="flat")
    yq, yb = qgate_kernels.gemv(wq, x), qgate_kernels.gemv(wb, x)
    n_qkv = 2 * nk * dk + nv * dv
    assert torch.equal(got[0][0], yq[:n_qkv]) and torch.equal(got[1].view(-1), yq[n_qkv:]), f"seed {seed}"
    assert torch.equal(got[2][0], yb[:nv]) and torch.equal(got[3][0], yb[nv:]), f"seed {seed}"


def _hc_args(
    gen: torch.Generator, hc: int, hs: int, rank: int, dtype: torch.dtype, use_combine: bool = True
) -> tuple:
    d = hc * hs
    return (
        randn(gen, 1, d, dtype=dtype, device=DEV),
        randn(gen, 1, hs, dtype=dtype, device=DEV),
        randn(gen, 1, hc, dtype=dtype, device=DEV),
        randn(gen, d, dtype=dtype, device=DEV, scale=0.1),
        randn(gen, reference.hc_down_rows(rank, hc, use_combine), d, dtype=dtype, device=DEV, scale=d**-0.5),
        randn(gen, d, rank, dtype=dtype, device=DEV, scale=rank**-0.5),
    )


HC_SHAPES = [(4, 2048, 320), (4, 64, 24), (2, 1024, 512), (8, 256, 8), (3, 136, 40)]


@pytest.mark.parametrize("op", ["mix", "combine_and_mix", "combine_unit", "final"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("hc", "hs", "rank"), HC_SHAPES)
def test_hc_matches_its_reference(hc: int, hs: int, rank: int, dtype: torch.dtype, op: str) -> None:
    """Against the op's reference on the same inputs (on the CPU). The kernel sums squares and GEMM
    rows in another float32 order than the CPU reference, and its exp is not the CPU's: most
    elements are bitwise the reference's (>= 90 % of each output here; H200: 99 %+), and an
    intermediate rounding flipped (down, lora or gate) moves a block_input element where the
    streams cancel by many of its own ULPs: <= 32 at the output's magnitude (floor max / 1024),
    the screen's tolerance (qgate.contract.ops)."""
    gen, seed = fresh_generator(DEV)
    h, o, inj, nw, wd, wu = _hc_args(gen, hc, hs, rank, dtype, use_combine=op != "final")
    kw = {"hc_count": hc, "lora_rank": rank, "eps": 1e-6}
    cpu = [t.cpu() for t in (h, o, inj, nw, wd, wu)]
    if op == "mix":
        _, bi, injection = qgate_kernels.hc_mix(h, nw, wd, wu, **kw)
        got = (bi, injection)
        want = reference.hc_mix(cpu[0], *cpu[3:], hc, rank, 1e-6)
    else:
        inj_in = None if op == "combine_unit" else inj
        got = qgate_kernels.hc_combine_and_mix(h, o, inj_in, nw, wd, wu, **kw)
        want = reference.hc_combine_mix(
            cpu[0], cpu[1], None if inj_in is None else cpu[2], *cpu[3:], hc, rank, 1e-6
        )
    want = tuple(w for w in want if w.shape[-1] > 0)
    got = tuple(g for g in got if g is not None)
    assert len(got) == len(want), f"{len(got)} outputs, want {len(want)}"
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and g.is_contiguous()
        assert ulp_at_magnitude(g.cpu(), w) <= 32, f"seed {seed}"
        same = (g.cpu().view(torch.int16) == w.view(torch.int16)).float().mean()
        assert same >= 0.9 or g.numel() <= 8, f"{same:.3f} bitwise, seed {seed}"
    if op == "combine_unit":
        assert torch.equal(got[0].cpu(), want[0]), f"combined streams, seed {seed}"  # one float32 add each
    again = qgate_kernels.hc_combine_and_mix(h, o, inj, nw, wd, wu, **kw) if op != "mix" else None
    if again is not None and op == "combine_and_mix":
        assert all(torch.equal(p, q) for p, q in zip(got, again, strict=True)), "two calls differ"
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
    (4, 65536, 1024),
    (8, 32768, 1024),
    (3, 257, 257),
    (2, 1000, 1),
    (1, 5000, 4096),
    (2, 16384, 512),
]
TOPK_SHAPES += [(3000, 512, 16), (1, 2**20, 64)]  # more rows than fit at once (one block a row); a long row


def _visible(gen: torch.Generator, rows: int, length: int, k: int) -> torch.Tensor:
    """Row 0: all L columns; the others a random n, some of them at most k (the -1 fill)."""
    vis = torch.randint(0, length + 1, (rows,), generator=gen, device=DEV, dtype=torch.int32)
    vis[0] = length
    if rows > 2:
        vis[1] = min(k, length)
        vis[2] = 0
    return vis


def _with_stride_and_garbage(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """The same values in a buffer 40 columns wider; NaN and inf past each row's n."""
    rows, length = scores.shape
    buf = torch.full((rows, length + 40), float("nan"), device=DEV)
    buf[:, :length] = scores
    cols = torch.arange(length, device=DEV)
    garbage = torch.where(cols % 3 == 0, float("inf"), float("nan"))
    view = buf[:, :length]
    view.copy_(torch.where(cols.unsqueeze(0) >= visible.unsqueeze(1), garbage, view))
    return view


@pytest.mark.parametrize(("rows", "length", "k"), TOPK_SHAPES)
def test_topk_is_the_block_selection(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator(DEV)
    for scores in (torch.randn(rows, length, generator=gen, device=DEV), _tie_heavy(gen, rows, length)):
        visible = _visible(gen, rows, length, k)
        logits = _with_stride_and_garbage(scores, visible)
        got = qgate_kernels.qsa_topk(logits, visible, k)
        assert got.dtype == torch.int32 and got.shape == (rows, k)
        assert torch.equal(got.cpu(), reference.qsa_topk(logits.cpu(), visible.cpu(), k)), f"seed {seed}"
        assert torch.equal(qgate_kernels.qsa_topk(logits, visible, k), got)
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
    integers = torch.randint(0, 64, (rows, length), generator=gen, device=DEV).float()  # 0..63: heavy ties
    full = torch.full((rows,), length, dtype=torch.int32, device=DEV)
    for scores in (_lumpy(gen, rows, length), quarter, integers):
        got = qgate_kernels.qsa_topk(scores, full, k)
        assert torch.equal(got.cpu(), reference.qsa_topk(scores.cpu(), full.cpu(), k)), f"seed {seed}"
    assert _no_fallbacks()


def _relu_sum(gen: torch.Generator, rows: int, length: int) -> torch.Tensor:
    """The production indexer's scores: sum over 4 heads of relu(q . k) / sqrt(128) (~1/16 exactly 0)."""
    q = torch.randn(4, 128, generator=gen, device=DEV)
    keys = torch.randn(rows * length, 128, generator=gen, device=DEV)
    return ((keys @ q.T).relu().sum(-1) / 128**0.5).reshape(rows, length)


@pytest.mark.parametrize(
    ("rows", "length", "k"),
    [(1, 65536, 512), (2, 4096, 512), (2, 16384, 1024), (1, 131072, 2048), (2, 16385, 1024)],
)
def test_topk_on_production_scores_and_short_visible_prefixes(rows: int, length: int, k: int) -> None:
    """ReLU-sum indexer scores, exp(3 N(0,1)) and integers, all columns visible and visible prefixes
    around the one-block limit (16384; on sm_90 a long row's cluster hands such a prefix to one block)."""
    gen, seed = fresh_generator(DEV)
    kinds = (
        _relu_sum(gen, rows, length),
        torch.exp(3 * torch.randn(rows, length, generator=gen, device=DEV)),
        torch.randint(0, 64, (rows, length), generator=gen, device=DEV).float(),
    )
    prefixes = sorted({min(length, n) for n in (length, k + 1, 513, 4096, 16384, 16385)})
    for scores in kinds:
        for n in prefixes:
            visible = torch.full((rows,), n, dtype=torch.int32, device=DEV)
            visible[-1] = max(n - 7, 1)
            logits = _with_stride_and_garbage(scores, visible)
            got = qgate_kernels.qsa_topk(logits, visible, k)
            want = reference.qsa_topk(logits.cpu(), visible.cpu(), k)
            assert torch.equal(got.cpu(), want), f"seed {seed} n {n}"
    assert _no_fallbacks()


@pytest.mark.parametrize(
    ("rows", "length", "k"), [(1, 65536, 512), (1, 4096, 512), (2, 131072, 2048), (3, 700, 512)]
)
def test_topk_writes_the_set_in_increasing_index_order(rows: int, length: int, k: int) -> None:
    """Every row of n > k: strictly increasing indices below n, the same set as the reference's value
    order (the stable sort's first k), on continuous rows and on integer rows (ties at the k-th)."""
    gen, seed = fresh_generator(DEV)
    full = torch.full((rows,), length, dtype=torch.int32, device=DEV)
    for scores in (
        torch.randn(rows, length, generator=gen, device=DEV),
        torch.randint(0, 64, (rows, length), generator=gen, device=DEV).float(),
    ):
        got = qgate_kernels.qsa_topk(scores, full, k).cpu()
        assert bool((got[:, 1:] > got[:, :-1]).all()) and int(got.min()) >= 0 and int(got.max()) < length
        by_value = reference.qsa_topk_by_value(scores.cpu(), full.cpu(), k)
        assert torch.equal(got, torch.sort(by_value, dim=1).values), f"seed {seed}"
    assert _no_fallbacks()


def test_topk_matches_the_python_oracle_on_specials() -> None:
    gen, seed = fresh_generator(DEV)
    scores = _tie_heavy(gen, 4, 3000)
    scores[1, :] = 0.0  # a row of only ties (+0.0, with some -0.0)
    scores[1, ::7] = -0.0
    visible = torch.tensor([3000, 3000, 300, 2999], dtype=torch.int32, device=DEV)
    got = qgate_kernels.qsa_topk(scores, visible, 300)
    assert got.cpu().tolist() == topk_oracle(scores.cpu(), visible.cpu(), 300), f"seed {seed}"


@pytest.mark.parametrize("k", [1, 300, 512])
def test_topk_few_visible_with_specials(k: int) -> None:
    """Visible prefixes of k + 1 .. 1025 keys (on sm_90 a row of at most 1024 is sorted by one block)
    on tie-heavy rows with NaN payloads, signed zeros and infinities, against Python's stable sort."""
    gen, seed = fresh_generator(DEV)
    scores = _tie_heavy(gen, 3, 4096)
    scores[1, :1100] = 0.0  # a prefix of only ties (+0.0 and -0.0)
    scores[1, :1100:7] = -0.0
    for n in sorted({k + 1, 700, 1023, 1024, 1025}):
        visible = torch.tensor([n, n, max(n - 5, k + 1)], dtype=torch.int32, device=DEV)
        logits = _with_stride_and_garbage(scores, visible)
        got = qgate_kernels.qsa_topk(logits, visible, k)
        assert got.cpu().tolist() == topk_oracle(logits.cpu(), visible.cpu(), k), f"seed {seed} n {n}"
    assert _no_fallbacks()


def test_ops_replay_under_cuda_graphs() -> None:
    gen, _ = fresh_generator(DEV)
    w, x = (
        randn(gen, 3072, 2048, dtype=torch.half, device=DEV),
        randn(gen, 2048, dtype=torch.half, device=DEV),
    )
    s = torch.randn(2, 131072 + 64, generator=gen, device=DEV)[:, :131072]
    vis = torch.tensor([131072, 100000], dtype=torch.int32, device=DEV)
    h, o, inj, nw, wd, wu = _hc_args(gen, 4, 2048, 320, torch.bfloat16)
    xg = randn(gen, 1, 2048, dtype=torch.bfloat16, device=DEV)
    wq = randn(gen, 2 * 4 * 128 + 2 * 8 * 128, 2048, dtype=torch.bfloat16, device=DEV, scale=2048**-0.5)
    wb = randn(gen, 16, 2048, dtype=torch.bfloat16, device=DEV, scale=2048**-0.5)
    kw = {"hc_count": 4, "lora_rank": 320, "eps": 1e-6}

    def step() -> list[torch.Tensor]:
        out = [qgate_kernels.gemv(w, x), qgate_kernels.qsa_topk(s, vis, 2048)]
        out += list(qgate_kernels.hc_combine_and_mix(h, o, inj, nw, wd, wu, **kw))
        out += list(qgate_kernels.hc_mix(h, nw, wd, wu, **kw)[1:])
        out += list(qgate_kernels.gdn_input(xg, wq, wb, 4, 8, 128, 128, layout="flat", static_weight=True))
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(3):
        x.copy_(torch.randn(2048, generator=gen, device=DEV).half())
        s.copy_(torch.randn(2, 131072, generator=gen, device=DEV))
        vis.copy_(torch.randint(1000, 131073, (2,), generator=gen, device=DEV).int())
        h.copy_(torch.randn(1, 8192, generator=gen, device=DEV).bfloat16())
        inj.copy_(torch.randn(1, 4, generator=gen, device=DEV).bfloat16())
        xg.copy_(torch.randn(1, 2048, generator=gen, device=DEV).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert all(torch.equal(a, b) for a, b in zip(captured, eager, strict=True))


def test_opcheck_on_cuda() -> None:
    gen, _ = fresh_generator(DEV)
    nk, nv, dk, dv, hidden = 2, 4, 16, 8, 64
    h, o, inj, nw, wd, wu = _hc_args(gen, 4, 64, 24, torch.bfloat16)
    logits = torch.randn(3, 4040, generator=gen, device=DEV)[:, :4000]
    vis = torch.tensor([4000, 20, 3000], dtype=torch.int32, device=DEV)
    cases = {
        "gemv": (
            randn(gen, 48, 64, dtype=torch.half, device=DEV),
            randn(gen, 64, dtype=torch.half, device=DEV),
        ),
        "hc_mix": (h, nw, wd, wu, 4, 24, 1e-6),
        "hc_combine_mix": (h, o, inj, nw, wd, wu, 4, 24, 1e-6),
        "hc_combine_mix_final": (h, o, None, nw, wd[:24], wu, 4, 24, 1e-6),
        "gdn_input": (
            randn(gen, hidden, dtype=torch.half, device=DEV),
            randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.half, device=DEV),
            randn(gen, 2 * nv, hidden, dtype=torch.half, device=DEV),
            nk,
            nv,
            dk,
            dv,
            False,
        ),
        "qsa_topk": (logits, vis, 33, torch.empty(3, 33, dtype=torch.int32, device=DEV)),
    }
    cases["gemv_static"] = (*cases["gemv"], True)  # static_weight=True: the PDL launch on sm_90
    cases["gdn_input_static"] = (*cases["gdn_input"], True)
    for name, args in cases.items():
        op = name.removesuffix("_static").removesuffix("_final")
        torch.library.opcheck(getattr(torch.ops.qgate, op).default, args)


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
    logits and visible_blocks are written by the kernels just before it, under graph replay with
    fresh inputs, must equal the reference chain (a top-k that read them before the previous kernel
    finished would see the last replay's values)."""
    gen, seed = fresh_generator(DEV)
    s = torch.randn(4, 131072, generator=gen, device=DEV)
    vis0 = torch.full((4,), 131072, dtype=torch.int32, device=DEV)

    def chain(top: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        i1 = top(s, vis0, 4096)
        l2 = s.gather(1, i1.long())  # the next logits, written by a torch kernel
        v2 = (i1[:, 0] % 1000 + 1000).to(torch.int32)  # and the next visible_blocks
        i2 = top(l2, v2, 512)
        l3 = l2.gather(1, i2.long().clamp_min(0))
        i3 = top(l3, (v2 % 400 + 32).to(torch.int32), 64)
        return [i1, i2, i3]

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
