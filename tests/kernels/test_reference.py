"""The pure-torch references (the CPU kernels and the fallback path) against float64 oracles."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_oracles import (
    acc_bound,
    fp16_close,
    fresh_generator,
    gdn_input64,
    gemv64,
    randn,
    topk_oracle,
)

from qgate_kernels import reference


@pytest.mark.parametrize(("n", "k", "m"), [(64, 256, None), (96, 2048, None), (33, 40, 1), (17, 128, 5)])
def test_gemv_reference_matches_float64(n: int, k: int, m: int | None) -> None:
    gen, seed = fresh_generator()
    w = randn(gen, n, k, dtype=torch.float16)
    x = randn(gen, k, dtype=torch.float16) if m is None else randn(gen, m, k, dtype=torch.float16)
    y = reference.gemv(w, x)
    assert y.dtype == torch.float16 and y.shape == (*x.shape[:-1], n)
    ref = gemv64(w, x)
    dot_abs = x.double().abs() @ w.double().abs().t()
    assert fp16_close(y, ref, acc_bound(dot_abs, k)).all(), f"seed {seed}"


def _hc_inputs(gen: torch.Generator, tokens: int, hc: int, hs: int, rank: int, dtype: torch.dtype) -> tuple:
    d = hc * hs
    return (
        randn(gen, tokens, d, dtype=dtype),
        randn(gen, tokens, hs, dtype=dtype),
        randn(gen, tokens, hc, dtype=dtype),
        randn(gen, d, dtype=dtype, scale=0.1),
        randn(gen, reference.hc_down_rows(rank, hc, True), d, dtype=dtype, scale=d**-0.5),
        randn(gen, d, rank, dtype=dtype, scale=rank**-0.5),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hc_reference_takes_a_token_batch(dtype: torch.dtype) -> None:
    """Token t of a batch is the single-token call on token t (mix and combine_and_mix)."""
    gen, seed = fresh_generator()
    h, o, inj, nw, wd, wu = _hc_inputs(gen, 3, 4, 64, 24, dtype)
    bi, injection = reference.hc_mix(h, nw, wd, wu, 4, 24, 1e-6)
    assert bi.shape == (3, 64) and injection.shape == (3, 4) and bi.dtype == dtype
    h2, bi2, inj2 = reference.hc_combine_mix(h, o, inj, nw, wd, wu, 4, 24, 1e-6)
    for t in range(3):
        one = reference.hc_mix(h[t : t + 1], nw, wd, wu, 4, 24, 1e-6)
        assert torch.equal(one[0], bi[t : t + 1]) and torch.equal(one[1], injection[t : t + 1]), (
            f"seed {seed}"
        )
        one = reference.hc_combine_mix(h[t : t + 1], o[t : t + 1], inj[t : t + 1], nw, wd, wu, 4, 24, 1e-6)
        assert all(torch.equal(a, b[t : t + 1]) for a, b in zip(one, (h2, bi2, inj2), strict=True))


def test_hc_reference_shared_norm_weight_is_the_repeated_one() -> None:
    """norm_weight [HS] (hc_per_branch_norm=False) is the same as that weight repeated per stream."""
    gen, _ = fresh_generator()
    h, o, inj, _, wd, wu = _hc_inputs(gen, 1, 4, 64, 24, torch.bfloat16)
    w = randn(gen, 64, dtype=torch.bfloat16, scale=0.1)
    got = reference.hc_combine_mix(h, o, inj, w, wd, wu, 4, 24, 1e-6)
    want = reference.hc_combine_mix(h, o, inj, w.repeat(4), wd, wu, 4, 24, 1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_hc_reference_final_mixer_and_shapes() -> None:
    gen, _ = fresh_generator()
    h, o, inj, nw, wd, wu = _hc_inputs(gen, 1, 4, 64, 24, torch.float16)
    assert reference.hc_pad(24, 4) == 4 and wd.shape[0] == 32
    h2, bi, injection = reference.hc_combine_mix(h, o, inj, nw, wd[:24], wu, 4, 24, 1e-6)
    assert injection.shape == (1, 0) and bi.shape == (1, 64) and h2.shape == (1, 256)
    with pytest.raises(ValueError, match="w_down"):
        reference.hc_mix(h, nw, wd[:30], wu, 4, 24, 1e-6)
    with pytest.raises(ValueError, match="w_up"):
        reference.hc_mix(h, nw, wd, wu[:, :16], 4, 24, 1e-6)
    with pytest.raises(ValueError, match="block_output"):
        reference.hc_combine_mix(h, o[:, :32], inj, nw, wd, wu, 4, 24, 1e-6)


@pytest.mark.parametrize("layout", ["flat", "interleaved"])
@pytest.mark.parametrize(
    ("nk", "nv", "dk", "dv", "hidden"), [(2, 4, 16, 8, 64), (4, 8, 128, 128, 256), (1, 1, 8, 8, 24)]
)
def test_gdn_input_reference_matches_float64(
    nk: int, nv: int, dk: int, dv: int, hidden: int, layout: str
) -> None:
    gen, seed = fresh_generator()
    x = randn(gen, hidden, dtype=torch.float16)
    w_qkvz = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.float16)
    w_ba = randn(gen, 2 * nv, hidden, dtype=torch.float16)
    got = reference.gdn_input(x, w_qkvz, w_ba, nk, nv, dk, dv, layout)
    want = gdn_input64(x, w_qkvz, w_ba, nk, nv, dk, dv, layout)
    assert [t.shape for t in got] == [t.shape for t in want]
    for g, w in zip(got, want, strict=True):
        dot_abs = torch.full_like(w, float(hidden) * 4)  # E|w x| < 1 per term; 4x margin
        assert fp16_close(g, w, acc_bound(dot_abs, hidden)).all(), f"seed {seed}"
        assert g.is_contiguous()


def test_gdn_input_rejects_shapes_that_do_not_fit() -> None:
    x = torch.randn(64).half()
    with pytest.raises(ValueError, match="w_qkvz"):
        reference.gdn_input(x, torch.randn(10, 64).half(), torch.randn(8, 64).half(), 2, 4, 16, 8, "flat")
    with pytest.raises(ValueError, match="interleaved layout"):
        reference.gdn_input(
            x, torch.randn(10, 64).half(), torch.randn(8, 64).half(), 3, 4, 16, 8, "interleaved"
        )
    with pytest.raises(ValueError, match="layout"):
        reference.gdn_input(x, torch.randn(160, 64).half(), torch.randn(8, 64).half(), 2, 4, 16, 8, "packed")


def _logits_with_specials(gen: torch.Generator, rows: int, length: int) -> torch.Tensor:
    """Many ties (small integers), both zeros, infinities and NaNs with different payloads, in a
    buffer wider than the row (row stride > L)."""
    s = torch.randint(-6, 7, (rows, length + 5), generator=gen).float() / 2
    nan_payload = torch.tensor([0x7FC00001, -0x00400000, 0x7F800001], dtype=torch.int32).view(torch.float32)
    flat = s.view(-1)
    pos = torch.randperm(flat.numel(), generator=gen)
    flat[pos[:3]] = nan_payload
    flat[pos[3:6]] = -0.0
    flat[pos[6:8]] = math.inf
    flat[pos[8:10]] = -math.inf
    return s[:, :length]


@pytest.mark.parametrize(("rows", "length", "k"), [(1, 300, 40), (3, 257, 257), (2, 1000, 1), (4, 64, 63)])
def test_topk_reference_is_the_block_selection(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator()
    for logits in (_logits_with_specials(gen, rows, length), randn(gen, rows, length, dtype=torch.float32)):
        visible = torch.randint(0, length + 1, (rows,), generator=gen, dtype=torch.int32)
        visible[0] = length
        got = reference.qsa_topk(logits, visible, k)
        assert got.dtype == torch.int32 and got.shape == (rows, k)
        assert got.tolist() == topk_oracle(logits, visible, k), f"seed {seed}"


def test_topk_reference_edges() -> None:
    """n = 0, n = k, n = L, n > L (clamped), negative n, garbage past n, ties at the k-th value."""
    gen, seed = fresh_generator()
    length, k = 100, 10
    logits = torch.randn(6, length, generator=gen)
    logits[:, 50:] = float("nan")  # garbage past n = 50 in the rows that have n = 50
    logits[4, :] = torch.randn(length, generator=gen)
    logits[5, :50] = 1.0  # 50 ties: the k-th value is shared by all, the lower indices win
    logits[5, 3] = 2.0
    visible = torch.tensor([0, k, 50, length + 7, -3, 50], dtype=torch.int32)
    got = reference.qsa_topk(logits, visible, k).tolist()
    assert got[0] == [-1] * k
    assert got[1] == list(range(k))
    assert all(0 <= i < 50 for i in got[2]) and len(set(got[2])) == k
    by_value = torch.sort(logits[3], descending=True, stable=True).indices[:k]
    assert got[3] == sorted(by_value.tolist())  # n clamped to L; the set in increasing index order
    assert got[4] == [-1] * k
    assert got[5] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], f"seed {seed}"  # ties at the k-th value: lower indices
    assert got == topk_oracle(logits, visible, k)
    ranked = reference.qsa_topk_by_value(logits, visible, k).tolist()  # the same sets in value order
    assert ranked[3] == by_value.tolist() and ranked[5] == [3, 0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert [sorted(r) if r[0] >= 0 else r for r in ranked] == got  # no row here pads and selects


def test_topk_reference_k_above_the_row() -> None:
    got = reference.qsa_topk(torch.randn(2, 6), torch.tensor([6, 4], dtype=torch.int32), 8)
    assert got.tolist() == [[0, 1, 2, 3, 4, 5, -1, -1], [0, 1, 2, 3, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="k >= 1"):
        reference.qsa_topk(torch.randn(2, 10), torch.ones(2, dtype=torch.int32), 0)
