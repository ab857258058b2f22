"""The C++ CPU kernels of the qgate ops (kernels_ext/csrc/cpu) against the pure-torch reference.

The kernels sum in float32 in their own fixed order (csrc/cpu/row_dot.h), the reference in BLAS's:
- every ISA path (scalar, AVX2, AVX-512) and every thread count gives the same bits;
- against a float64 oracle the error is within one float32 summation bound plus half an output ULP;
- against the reference: at most 1 ULP (the screen's measure), and the same bits on most elements.
Fresh random inputs on every run (the seed is in the failure message), never zeros.
"""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import fresh_generator, gemv64, randn

import qgate_kernels
from qgate.ops.screen import ulp_distance
from qgate_kernels import _library, reference


def _cpu_kernels_built() -> bool:
    """The compiled extension with csrc/cpu (its qgate_cpu::best_isa op exists)."""
    try:
        torch.ops.qgate_cpu.best_isa.default  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return _library.EXTENSION_LOADED


pytestmark = pytest.mark.skipif(
    not _cpu_kernels_built(), reason="compiled extension with CPU kernels not loaded"
)

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512"}
# N odd, K not a multiple of the 32-element chunk, the tiny model's
# projections, a 2048-wide hidden size
SHAPES = [(1, 8), (7, 40), (37, 100), (256, 128), (768, 128), (128, 384), (2048, 128), (515, 2048)]
DTYPES = [torch.float16, torch.bfloat16]


def _isas() -> list[int]:
    return list(range(int(torch.ops.qgate_cpu.best_isa()) + 1))


def _draw(gen: torch.Generator, n: int, k: int, dtype: torch.dtype, m: int | None = None) -> tuple:
    w = randn(gen, n, k, dtype=dtype, scale=k**-0.5)
    x = randn(gen, k, dtype=dtype) if m is None else randn(gen, m, k, dtype=dtype)
    return w, x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemv_paths_give_the_same_bits(n: int, k: int, dtype: torch.dtype) -> None:
    gen, seed = fresh_generator()
    for _ in range(3):
        w, x = _draw(gen, n, k, dtype)
        outs = {ISA_NAMES[i]: torch.ops.qgate_cpu.gemv_isa(w, x, i) for i in _isas()}
        first = outs["scalar"]
        for name, y in outs.items():
            assert torch.equal(y.view(torch.int16), first.view(torch.int16)), f"{name} vs scalar, seed {seed}"
        assert torch.equal(torch.ops.qgate.gemv.default(w, x, False), first), f"seed {seed}"


def test_gemv_bits_do_not_depend_on_the_thread_count() -> None:
    gen, seed = fresh_generator()
    w, x = _draw(gen, 4099, 2048, torch.float16)  # 16 MiB: several tasks
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qgate_kernels.gemv(w, x)
        torch.set_num_threads(max(2, before))
        many = qgate_kernels.gemv(w, x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many), f"seed {seed}"


def _ulp(y: torch.Tensor) -> torch.Tensor:
    """Spacing of the output dtype at |y| (subnormal spacing at the bottom), in float64."""
    mant, tiny = {torch.float16: (10, 2.0**-14), torch.bfloat16: (7, 2.0**-126)}[y.dtype]
    mag = y.double().abs().clamp_min(tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - mant)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemv_error_bound_against_float64(n: int, k: int, dtype: torch.dtype) -> None:
    """|y - y64| <= half an output ULP (the one rounding) + K 2^-24 sum|w x| (float32 sums, any order)."""
    gen, seed = fresh_generator()
    for _ in range(3):
        w, x = _draw(gen, n, k, dtype)
        y = qgate_kernels.gemv(w, x)
        y64 = gemv64(w, x)
        sum_abs = w.double().abs() @ x.double().abs()
        bound = 0.5 * torch.maximum(_ulp(y), _ulp(y64.to(dtype))) + k * 2.0**-24 * sum_abs
        assert bool(((y.double() - y64).abs() <= bound).all()), f"seed {seed}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_within_one_ulp_of_the_reference_and_mostly_bitwise(dtype: torch.dtype) -> None:
    gen, seed = fresh_generator()
    same = total = 0
    for n, k in SHAPES:
        for _ in range(4):
            w, x = _draw(gen, n, k, dtype)
            y, ref = qgate_kernels.gemv(w, x), reference.gemv(w, x)
            assert ulp_distance(y, ref) <= 1.0, f"{n}x{k}, seed {seed}"
            same += int((y.view(torch.int16) == ref.view(torch.int16)).sum())
            total += y.numel()
    assert same / total >= 0.95, f"only {same}/{total} elements bitwise equal, seed {seed}"


def test_gemv_inputs_outside_the_kernel_run_the_reference_math() -> None:
    gen, seed = fresh_generator()
    w, x3 = _draw(gen, 40, 64, torch.float16, m=3)
    op = torch.ops.qgate.gemv.default
    assert torch.equal(op(w, x3, False), reference.gemv(w, x3)), f"M > 1, seed {seed}"
    wf, xf = w.float(), x3[0].float()
    assert torch.equal(op(wf, xf, False), reference.gemv(wf, xf)), f"fp32, seed {seed}"
    # a non-contiguous weight is read through a contiguous copy: the same bits
    wt = w.t().contiguous().t()
    assert torch.equal(op(wt, x3[0], False), op(w, x3[0], False)), f"seed {seed}"


def test_gemv_shapes_2d_and_empty() -> None:
    gen, _ = fresh_generator()
    w, x = _draw(gen, 33, 72, torch.float16)
    y1 = torch.ops.qgate.gemv.default(w, x, True)
    y2 = torch.ops.qgate.gemv.default(w, x.view(1, -1), True)
    assert y1.shape == (33,) and y2.shape == (1, 33) and torch.equal(y1, y2[0])
    empty = torch.ops.qgate.gemv.default(w[:0], x, False)
    assert empty.shape == (0,)


def test_gemv_caller_errors_are_one_line_checks() -> None:
    op = torch.ops.qgate.gemv.default
    with pytest.raises(RuntimeError, match="x must be"):
        op(torch.randn(4, 8).half(), torch.randn(16).half(), False)
    with pytest.raises(RuntimeError, match="weight must be"):
        op(torch.randn(4).half(), torch.randn(4).half(), False)
    with pytest.raises(RuntimeError, match="isa must be"):
        torch.ops.qgate_cpu.gemv_isa(torch.randn(4, 8).half(), torch.randn(8).half(), 7)


def test_opcheck_gemv_cpu_kernel() -> None:
    gen, _ = fresh_generator()
    for dtype in DTYPES:
        for n, k, m in ((48, 64, None), (37, 100, 1), (9, 40, 3)):
            w, x = _draw(gen, n, k, dtype, m)
            torch.library.opcheck(torch.ops.qgate.gemv.default, (w, x, True))


# --- gdn_input -------------------------------------------------------------------------------------

GDN_SHAPES = [(1, 2, 8, 8, 40), (2, 4, 16, 8, 64), (4, 8, 128, 128, 2048)]  # nk, nv, dk, dv, K


def _gdn_draw(gen: torch.Generator, nk: int, nv: int, dk: int, dv: int, k: int, dtype: torch.dtype) -> tuple:
    x = randn(gen, k, dtype=dtype)
    w_qkvz = randn(gen, 2 * nk * dk + 2 * nv * dv, k, dtype=dtype, scale=k**-0.5)
    w_ba = randn(gen, 2 * nv, k, dtype=dtype, scale=k**-0.5)
    return x, w_qkvz, w_ba


def _gdn_layout_of_gemv(x: torch.Tensor, w_qkvz: torch.Tensor, w_ba: torch.Tensor, heads: tuple, layout: str):  # noqa: ANN202
    """The two projections through the gemv op's CPU kernel, laid out by the reference: its split/cat
    applied to those rows as float32 with identity weights (exact, so only the layout acts)."""
    gemv = torch.ops.qgate.gemv.default
    rows = torch.cat([gemv(w_qkvz, x, False), gemv(w_ba, x, False)]).float()  # [R + B]
    eye = torch.eye(rows.numel())
    return reference.gdn_input(rows, eye[: w_qkvz.shape[0]], eye[w_qkvz.shape[0] :], *heads, layout)


@pytest.mark.parametrize("layout", ["flat", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GDN_SHAPES)
def test_gdn_input_rows_equal_gemv_bits_and_reference_layout(
    shape: tuple, dtype: torch.dtype, layout: str
) -> None:
    gen, seed = fresh_generator()
    nk, nv, dk, dv, k = shape
    x, w_qkvz, w_ba = _gdn_draw(gen, *shape, dtype)
    outs = qgate_kernels.gdn_input(x, w_qkvz, w_ba, nk, nv, dk, dv, layout=layout)
    # the same rows through the gemv kernel, laid out by the reference (identity weights, float32: exact)
    want = _gdn_layout_of_gemv(x, w_qkvz, w_ba, (nk, nv, dk, dv), layout)
    for got, w in zip(outs, want, strict=True):
        assert got.dtype == dtype and got.shape == w.shape, f"seed {seed}"
        assert torch.equal(got.float(), w), f"{layout} {dtype}, seed {seed}"
    refs = reference.gdn_input(x, w_qkvz, w_ba, nk, nv, dk, dv, layout)
    assert max(ulp_distance(o, r) for o, r in zip(outs, refs, strict=True)) <= 1.0, f"seed {seed}"
    assert not qgate_kernels.fallback_counts()[qgate_kernels.ROUTE_GDN]


def test_gdn_input_outside_the_kernel_runs_the_reference_math() -> None:
    gen, seed = fresh_generator()
    nk, nv, dk, dv, k = 2, 4, 16, 8, 64
    _, w_qkvz, w_ba = _gdn_draw(gen, nk, nv, dk, dv, k, torch.float16)
    x3 = randn(gen, 3, k, dtype=torch.float16)
    op = torch.ops.qgate.gdn_input.default
    for interleaved in (False, True):
        layout = "interleaved" if interleaved else "flat"
        got = op(x3, w_qkvz, w_ba, nk, nv, dk, dv, interleaved, False)
        want = reference.gdn_input(x3, w_qkvz, w_ba, nk, nv, dk, dv, layout)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"{layout}, seed {seed}"


def test_opcheck_gdn_input_cpu_kernel() -> None:
    gen, _ = fresh_generator()
    for dtype in DTYPES:
        for interleaved in (False, True):
            x, w_qkvz, w_ba = _gdn_draw(gen, 2, 4, 16, 8, 64, dtype)
            args = (x, w_qkvz, w_ba, 2, 4, 16, 8, interleaved, True)
            torch.library.opcheck(torch.ops.qgate.gdn_input.default, args)


# --- hc_mix / hc_combine_mix ---------------------------------------------------------------------

HC_SHAPES = [(4, 64, 16), (2, 128, 32), (4, 512, 64)]  # hc_count, HS, lora_rank
HC_EPS = 1e-6
# Sums of squares, exp and rsqrt round differently from torch's in float32, so a rounding of xn, down,
# lora or gate can flip by one ULP of that intermediate; downstream, an output moves by at most about
# one ULP of its largest magnitude (measured over 200 fresh draws per shape: <= 1.0). On an element
# that cancels to near zero that is many of its own ULPs (13 seen at 4x512 in the screen's measure).
HC_MAX_SCALED_DIFF = 2.0


def _hc_draw(
    gen: torch.Generator,
    hc: int,
    hs: int,
    r: int,
    dtype: torch.dtype,
    combine: bool,
    per_stream: bool,
    t: int = 1,
) -> tuple:
    d = hc * hs
    rows = reference.hc_down_rows(r, hc, combine)
    return (
        randn(gen, t, d, dtype=dtype),
        randn(gen, d if per_stream else hs, dtype=dtype, scale=0.1),
        randn(gen, rows, d, dtype=dtype, scale=d**-0.5),
        randn(gen, d, r, dtype=dtype, scale=r**-0.5),
    )


def _hc_scaled_diff(outs: tuple, refs: tuple) -> float:
    """max |out - ref| over each output in ULPs of that output's largest magnitude."""
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if o.numel():
            worst = max(worst, float((o.double() - r.double()).abs().max() / _ulp(r.abs().max().view(1))[0]))
    return worst


@pytest.mark.parametrize("combine", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", HC_SHAPES)
def test_hc_mix_within_bound_of_the_reference(shape: tuple, dtype: torch.dtype, combine: bool) -> None:
    gen, seed = fresh_generator()
    hc, hs, r = shape
    for per_stream in (True, False):
        h, nw, wd, wu = _hc_draw(gen, hc, hs, r, dtype, combine, per_stream)
        outs = torch.ops.qgate.hc_mix.default(h, nw, wd, wu, hc, r, HC_EPS)
        refs = reference.hc_mix(h, nw, wd, wu, hc, r, HC_EPS)
        assert [o.shape for o in outs] == [x.shape for x in refs], f"seed {seed}"
        assert _hc_scaled_diff(outs, refs) <= HC_MAX_SCALED_DIFF, (
            f"{shape} {dtype} combine={combine}, seed {seed}"
        )


@pytest.mark.parametrize("with_injection", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", HC_SHAPES)
def test_hc_combine_mix_within_bound_of_the_reference(
    shape: tuple, dtype: torch.dtype, with_injection: bool
) -> None:
    gen, seed = fresh_generator()
    hc, hs, r = shape
    h, nw, wd, wu = _hc_draw(gen, hc, hs, r, dtype, True, True)
    block_output = randn(gen, 1, hs, dtype=dtype)
    injection = randn(gen, 1, hc, dtype=dtype) if with_injection else None
    args = (h, block_output, injection, nw, wd, wu, hc, r, HC_EPS)
    outs = torch.ops.qgate.hc_combine_mix.default(*args)
    refs = reference.hc_combine_mix(*args)
    assert _hc_scaled_diff(outs, refs) <= HC_MAX_SCALED_DIFF, f"{shape} {dtype}, seed {seed}"
    # h' is one fma and one rounding: the same bits as the reference
    assert torch.equal(outs[0], refs[0]), f"seed {seed}"


def test_hc_tokens_are_independent() -> None:
    gen, seed = fresh_generator()
    h, nw, wd, wu = _hc_draw(gen, 4, 64, 16, torch.float16, True, True, t=3)
    both = torch.ops.qgate.hc_mix.default(h, nw, wd, wu, 4, 16, HC_EPS)
    for i in range(3):
        one = torch.ops.qgate.hc_mix.default(h[i : i + 1], nw, wd, wu, 4, 16, HC_EPS)
        assert all(torch.equal(a[i : i + 1], b) for a, b in zip(both, one, strict=True)), f"seed {seed}"


def test_hc_caller_errors() -> None:
    h, nw, wd, wu = _hc_draw(torch.Generator().manual_seed(1), 4, 64, 16, torch.float16, True, True)
    with pytest.raises(RuntimeError, match="fp16 or bf16"):
        torch.ops.qgate.hc_mix.default(h.float(), nw.float(), wd.float(), wu.float(), 4, 16, HC_EPS)
    with pytest.raises(RuntimeError, match="w_up must be"):
        torch.ops.qgate.hc_mix.default(h, nw, wd, wu[:, :8], 4, 16, HC_EPS)


def test_opcheck_hc_cpu_kernels() -> None:
    gen, _ = fresh_generator()
    for dtype in DTYPES:
        h, nw, wd, wu = _hc_draw(gen, 2, 64, 16, dtype, True, True)
        torch.library.opcheck(torch.ops.qgate.hc_mix.default, (h, nw, wd, wu, 2, 16, HC_EPS))
        bo, inj = randn(gen, 1, 64, dtype=dtype), randn(gen, 1, 2, dtype=dtype)
        for injection in (inj, None):
            args = (h, bo, injection, nw, wd, wu, 2, 16, HC_EPS)
            torch.library.opcheck(torch.ops.qgate.hc_combine_mix.default, args)
