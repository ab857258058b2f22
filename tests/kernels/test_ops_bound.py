"""The operator screen's forward-error bound, bias test and vLLM-like cast (qgate.ops.bound, qgate.ops.load),
on the CPU: the one-output cancellation case (shared_expert_gate [1, 2560]) passes on the shipped route and
fails, same draw, on a route that accumulates in fp16; the cast counts what vLLM's copy_ does."""

from __future__ import annotations

import math

import torch

import qgate_kernels
from qgate.ops import bound
from qgate.ops.calibration import accumulate_in  # the shipped row-dot order, partial sums in a dtype
from qgate.ops.load import cast_like_vllm, hc_params_dtype
from qgate.ops.screen import ulp_distance
from qgate_kernels.dtypes import route_dtypes


def cancelling_draw() -> tuple[torch.Tensor, torch.Tensor, float]:
    """shared_expert_gate's shape [1, 2560]: sum |w x| ~ 30, the terms cancel to |y| in [5e-5, 2e-4],
    and a correct fp32-accumulating route (the shipped row-dot order, accumulate_in: elementwise IEEE
    steps, the same on every CPU) is more than 2 ULPs (the old bound) from the correctly rounded result.
    The shipped kernel itself is not used to pick the draw: its order of additions depends on the ISA it
    picks at run time (AVX2 here, AVX-512 on the H200's host), so its ULP distance does too."""
    k = 2560
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(1, k, generator=gen) * 0.0184).half()  # sum |w x| = k 0.0184 sqrt(2/pi) ~ 30
    xs = torch.randn(20000, k, generator=gen).half()
    y = xs.double() @ w.double()[0]
    for i in torch.nonzero((y.abs() > 5e-5) & (y.abs() < 2e-4))[:, 0].tolist():
        old_ulp = ulp_distance(accumulate_in(w, xs[i], torch.float32), y[i : i + 1].half())
        if old_ulp > 2:
            return w, xs[i], old_ulp
    raise AssertionError("no cancelling draw past 2 ULP in 20000")


def test_cancellation_passes_the_shipped_route_and_fails_fp16_accumulation() -> None:
    w, x, old_ulp = cancelling_draw()
    s = float(w.double().abs()[0] @ x.double().abs())
    y = float(w.double()[0] @ x.double())
    assert 25 < s < 35 and 5e-5 < abs(y) < 2e-4 and old_ulp > 2  # the old metric: a false FAIL
    fp32_acc = bound.judge_dot(w, x, accumulate_in(w, x, torch.float32))
    assert float(fp32_acc.ratio.max()) < 0.05  # far inside: c u sum|w x| ~ 1.5e-4 against |err| ~ 1e-7
    shipped = bound.judge_dot(w, x, qgate_kernels.gemv(w, x, static_weight=True))
    assert float(shipped.ratio.max()) < 0.05
    fp16_acc = bound.judge_dot(w, x, accumulate_in(w, x, torch.float16))
    assert float(fp16_acc.ratio.max()) > 1.0


def test_the_bound_holds_for_the_shipped_route_and_catches_the_planted_defects() -> None:
    gen = torch.Generator().manual_seed(0)
    for k in (160, 1536, 2560, 10240):
        w = (torch.randn(512, k, generator=gen) * k**-0.5).half()
        x = torch.randn(k, generator=gen).half()
        ok = bound.judge_dot(w, x, qgate_kernels.gemv(w, x, static_weight=True))
        assert float(ok.ratio.max()) <= 1.0, k
        assert (ok.delta.abs() <= 1).all()
        assert float(bound.judge_dot(w, x, accumulate_in(w, x, torch.float16)).ratio.max()) > 1.0
        keep = (k - 1) // 256 * 256  # the last K tile of 256 dropped
        dropped = (
            qgate_kernels.gemv(w[:, :keep].contiguous(), x[:keep].contiguous()) if keep else w.new_zeros(512)
        )
        assert int((bound.judge_dot(w, x, dropped).ratio > 1).sum()) > 400
    up = bound.judge_dot(
        w,
        x,
        (
            qgate_kernels.gemv(w, x).double() + bound.ulp(qgate_kernels.gemv(w, x).double(), torch.float16)
        ).half(),
    )
    assert int((up.delta > 0).sum()) >= 500 and not bound.sign_test(int((up.delta > 0).sum()), 0)["passed"]


def test_round_nearest_is_one_correct_rounding() -> None:
    # 1 + 2^-11 is fp16's midpoint between 1 and 1 + 2^-10: ties to even -> 1; a hair above -> up
    v = torch.tensor([1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-40, 65519.0, 65520.0, 2.0**-25, 2.0**-25 * 1.01],
                     dtype=torch.float64)  # fmt: skip
    r = bound.round_nearest(v, torch.float16)
    assert r.tolist() == [1.0, 1 + 2.0**-10, 65504.0, math.inf, 0.0, 2.0**-24]
    assert bound.ulp(torch.tensor([1.0, 2.0**-20], dtype=torch.float64), torch.float16).tolist() == [
        2.0**-10,
        2.0**-24,
    ]


def test_sign_test_level_and_the_constant() -> None:
    assert bound.sign_test(0, 0)["passed"] and bound.sign_test(50, 50)["passed"]
    assert not bound.sign_test(80, 20)["passed"]
    # scipy.stats.binomtest's two-sided p (the screen computes it without scipy)
    assert math.isclose(bound.sign_test(31, 25)["p_value"], 0.5044037600228255, rel_tol=1e-9)
    assert math.isclose(bound.sign_test(10000, 9700)["p_value"], 0.03314531235812716, rel_tol=1e-6)
    assert 80 < bound.c_of(2560) < 90 and bound.depth(2560) == 92


def test_cast_like_vllm_counts_overflow_flush_and_stored_non_finite() -> None:
    stored = torch.tensor([[1.0, 7.0e4, 1e-9, float("nan")], [-3.0e5, 2.0**-24, 0.0, float("-inf")]]).to(
        torch.bfloat16
    )
    out, c = cast_like_vllm(stored, torch.float16, offset=(10, 0))
    assert out.dtype == torch.float16
    assert (c.stored, c.engine, c.elements) == ("BF16", "F16", 8)
    assert (c.nan_stored, c.inf_stored, c.overflow_to_inf, c.flushed_to_zero) == (1, 1, 2, 1)
    assert c.first_bad == (10, 1) and c.non_finite == 4


def test_hc_parameters_dtype_is_vllms_rule() -> None:
    shim = ("qwen4exp_fp16_cpu",)
    assert hc_params_dtype("bf16", (), "cuda") == "bf16"
    assert hc_params_dtype("fp16", (), "cuda") == "bf16"  # hard-coded bf16 in qwen4_exp/nvidia/model.py
    assert hc_params_dtype("fp16", shim, "cuda") == "bf16"  # the shim applies on the CPU platform only
    assert hc_params_dtype("fp16", shim, "cpu") == "fp16"
    # the fp16 production-shape contracts' shim builds them in the model dtype on any platform
    assert hc_params_dtype("fp16", ("qwen4exp_hc_params_fp16",), "cuda") == "fp16"
    assert hc_params_dtype("bf16", ("qwen4exp_hc_params_fp16",), "cuda") == "bf16"


def test_route_dtypes_come_from_the_ops_dispatch() -> None:
    cpu = route_dtypes("cpu")
    assert cpu["fp16_gemv"] == ("fp16", "bf16")  # the C++ CPU kernel (and the reference) take both
    if qgate_kernels.cuda_kernels_available():
        assert "bf16" in route_dtypes("cuda")["fp16_gemv"]
