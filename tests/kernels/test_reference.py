"""The pure-torch references (the CPU kernels and the fallback path) against float64 oracles."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_oracles import (
    acc_bound,
    fp16_close,
    fresh_generator,
    fused_hc64,
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


def _hc_inputs(gen: torch.Generator, n: int, d: int) -> tuple:
    return (
        randn(gen, n, d, dtype=torch.float16),
        (1 + 0.1 * randn(gen, d, dtype=torch.float32)).half(),
        randn(gen, n + 1, d, dtype=torch.float16, scale=0.05),
        randn(gen, n, n + 1, dtype=torch.float32, scale=0.5),
        torch.rand(1, generator=gen) * 0.5 + 0.05,
        randn(gen, d, dtype=torch.float16, scale=0.05),
        1 + 0.1 * randn(gen, n, dtype=torch.float32),
        torch.rand(1, generator=gen) * 0.5 + 0.05,
    )


@pytest.mark.parametrize(("n", "d"), [(4, 256), (1, 64), (8, 128), (3, 2048)])
def test_fused_hc_reference_matches_float64(n: int, d: int) -> None:
    gen, seed = fresh_generator()
    args = _hc_inputs(gen, n, d)
    layer_input, mixed, b = reference.fused_hc(*args, 1e-6)
    li64, mixed64, b64 = fused_hc64(*args, 1e-6)
    assert layer_input.shape == (d,) and mixed.shape == (n, d) and b.shape == (n,)
    assert layer_input.dtype == torch.float16 and b.dtype == torch.float32
    h_abs = args[0].double().abs().sum(0)  # bound on sum_j |A_j H_j| up to max |A|
    a_max = float(args[3].abs().max()) + float(args[4]) + 1
    assert fp16_close(layer_input, li64, acc_bound(a_max * h_abs, n)).all(), f"seed {seed}"
    assert fp16_close(mixed, mixed64, acc_bound(a_max * h_abs.expand(n, d), n)).all(), f"seed {seed}"
    torch.testing.assert_close(b.double(), b64, rtol=1e-5, atol=1e-6, msg=f"seed {seed}")


def test_fused_hc_reference_takes_a_token_batch() -> None:
    gen, _ = fresh_generator()
    args = _hc_inputs(gen, 4, 64)
    batched = (torch.stack([args[0], args[0].flip(0)]),) + args[1:]
    li, mixed, b = reference.fused_hc(*batched, 1e-6)
    li0, mixed0, b0 = reference.fused_hc(*args, 1e-6)
    assert li.shape == (2, 64) and mixed.shape == (2, 4, 64) and b.shape == (2, 4)
    assert torch.equal(li[0], li0) and torch.equal(mixed[0], mixed0) and torch.equal(b[0], b0)


@pytest.mark.parametrize(
    ("nk", "nv", "dk", "dv", "hidden"), [(2, 4, 16, 8, 64), (4, 8, 128, 128, 256), (1, 1, 8, 8, 24)]
)
def test_gdn_input_reference_matches_float64(nk: int, nv: int, dk: int, dv: int, hidden: int) -> None:
    gen, seed = fresh_generator()
    x = randn(gen, hidden, dtype=torch.float16)
    w_qkvz = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=torch.float16)
    w_ba = randn(gen, 2 * nv, hidden, dtype=torch.float16)
    got = reference.gdn_input(x, w_qkvz, w_ba, nk, nv, dk, dv)
    want = gdn_input64(x, w_qkvz, w_ba, nk, nv, dk, dv)
    assert [t.shape for t in got] == [t.shape for t in want]
    for g, w in zip(got, want, strict=True):
        dot_abs = torch.full_like(w, float(hidden) * 4)  # E|w x| < 1 per term; 4x margin
        assert fp16_close(g, w, acc_bound(dot_abs, hidden)).all(), f"seed {seed}"
        assert g.is_contiguous()


def test_gdn_input_rejects_shapes_that_do_not_fit() -> None:
    x = torch.randn(64).half()
    with pytest.raises(ValueError, match="w_qkvz"):
        reference.gdn_input(x, torch.randn(10, 64).half(), torch.randn(8, 64).half(), 2, 4, 16, 8)
    with pytest.raises(ValueError, match="multiple of nk"):
        reference.gdn_input(x, torch.randn(10, 64).half(), torch.randn(8, 64).half(), 3, 4, 16, 8)


def _scores_with_specials(gen: torch.Generator, rows: int, length: int) -> torch.Tensor:
    """Many ties (small integers), both zeros, infinities and NaNs with different payloads."""
    s = torch.randint(-6, 7, (rows, length), generator=gen).float() / 2
    nan_payload = torch.tensor([0x7FC00001, -0x00400000, 0x7F800001], dtype=torch.int32).view(torch.float32)
    flat = s.view(-1)
    pos = torch.randperm(flat.numel(), generator=gen)
    flat[pos[:3]] = nan_payload
    flat[pos[3:6]] = -0.0
    flat[pos[6:8]] = math.inf
    flat[pos[8:10]] = -math.inf
    return s


@pytest.mark.parametrize(("rows", "length", "k"), [(1, 300, 40), (3, 257, 257), (2, 1000, 1), (4, 64, 63)])
def test_topk_reference_is_the_stable_sort(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator()
    for scores in (_scores_with_specials(gen, rows, length), randn(gen, rows, length, dtype=torch.float32)):
        values, indices = reference.qsa_topk(scores, k)
        want_values, want_indices = topk_oracle(scores, k)
        assert indices.dtype == torch.int64 and values.shape == (rows, k)
        assert indices.tolist() == want_indices, f"seed {seed}"
        # the values are the input elements, bit for bit (NaN payloads and the sign of zero kept)
        assert torch.equal(values.view(torch.int32), scores.gather(1, indices).view(torch.int32))


def test_topk_reference_rejects_k_out_of_range() -> None:
    with pytest.raises(ValueError, match="1 <= k <= L"):
        reference.qsa_topk(torch.randn(2, 10), 11)
    with pytest.raises(ValueError, match="1 <= k <= L"):
        reference.qsa_topk(torch.randn(2, 10), 0)
