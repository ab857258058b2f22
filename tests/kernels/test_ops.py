"""The qgate::* ops and their Python entry points on the CPU: schemas, opcheck, counted fallbacks."""

from __future__ import annotations

import sys

import pytest
import torch
from kernel_oracles import fresh_generator, randn

import qgate_kernels
from qgate.ops.screen import ulp_distance as ulp_at_magnitude
from qgate_kernels import _library, ops, reference


@pytest.fixture(autouse=True)
def _clean_counts() -> None:
    qgate_kernels.reset_fallback_counts()


def _hc_args(gen: torch.Generator, tokens: int = 1, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """(h, block_output, injection, norm_weight, w_down, w_up) for HC 4 x 64, rank 24."""
    hc, hs, rank = 4, 64, 24
    d = hc * hs
    return (
        randn(gen, tokens, d, dtype=dtype),
        randn(gen, tokens, hs, dtype=dtype),
        randn(gen, tokens, hc, dtype=dtype),
        randn(gen, d, dtype=dtype, scale=0.1),
        randn(gen, reference.hc_down_rows(rank, hc, True), d, dtype=dtype, scale=d**-0.5),
        randn(gen, d, rank, dtype=dtype, scale=rank**-0.5),
    )


HC_KW = {"hc_count": 4, "lora_rank": 24, "eps": 1e-6}


def _gdn_args(
    gen: torch.Generator, nk: int = 2, nv: int = 4, dk: int = 16, dv: int = 8, k: int = 64
) -> tuple:
    return (
        randn(gen, k, dtype=torch.float16),
        randn(gen, 2 * nk * dk + 2 * nv * dv, k, dtype=torch.float16),
        randn(gen, 2 * nv, k, dtype=torch.float16),
        nk,
        nv,
        dk,
        dv,
    )


def _topk_args(gen: torch.Generator, rows: int = 3, length: int = 100) -> tuple:
    logits = randn(gen, rows, length + 8, dtype=torch.float32)[:, :length]  # row stride > L
    visible = torch.randint(0, length + 1, (rows,), generator=gen, dtype=torch.int32)
    return logits, visible


def test_schemas_declared_once_and_agree_with_python_copy() -> None:
    for name, schema in _library.SCHEMAS.items():
        op = getattr(torch.ops.qgate, name).default
        assert str(op._schema) == f"qgate::{schema}"


def test_extension_is_built_here() -> None:
    # The CPU install compiles the C++ schema declarations; a pure-Python install is only a fallback.
    info = qgate_kernels.build_info()
    assert info["extension_loaded"], info["extension_error"]


def test_opcheck_all_ops_on_cpu() -> None:
    gen, seed = fresh_generator()
    h, o, inj, nw, wd, wu = _hc_args(gen)
    logits, visible = _topk_args(gen)
    samples = {
        "gemv": [
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)),
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 1, 64, dtype=torch.float16)),
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16), True),
        ],
        "hc_mix": [(h, nw, wd, wu, 4, 24, 1e-6), (h, nw, wd[:24], wu, 4, 24, 1e-6)],
        "hc_combine_mix": [(h, o, inj, nw, wd, wu, 4, 24, 1e-6), (h, o, None, nw, wd[:24], wu, 4, 24, 1e-6)],
        "gdn_input": [(*_gdn_args(gen), False), (*_gdn_args(gen), True), (*_gdn_args(gen), False, True)],
        "qsa_topk": [(logits, visible, 7, torch.empty(3, 7, dtype=torch.int32))],
    }
    for name, cases in samples.items():
        for args in cases:
            torch.library.opcheck(getattr(torch.ops.qgate, name).default, args)


def test_supported_calls_use_the_op_and_count_nothing() -> None:
    gen, _ = fresh_generator()
    w, x = randn(gen, 40, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)
    assert torch.equal(qgate_kernels.gemv(w, x), torch.ops.qgate.gemv(w, x))  # the op's CPU kernel
    # The wrappers call the op (its CPU kernel: C++ where csrc/cpu has one, else the reference)
    h, o, inj, nw, wd, wu = _hc_args(gen)
    h_same, bi, injection = qgate_kernels.hc_mix(h, nw, wd, wu, **HC_KW)
    want = torch.ops.qgate.hc_mix(h, nw, wd, wu, 4, 24, 1e-6)
    assert h_same is h and torch.equal(bi, want[0]) and torch.equal(injection, want[1])
    got = qgate_kernels.hc_combine_and_mix(h, o, inj, nw, wd, wu, **HC_KW)
    want = torch.ops.qgate.hc_combine_mix(h, o, inj, nw, wd, wu, 4, 24, 1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    _, _, none = qgate_kernels.hc_combine_and_mix(h, o, None, nw, wd[:24], wu, **HC_KW)
    assert none is None  # the final mixer returns no injection, as vLLM's
    gargs = _gdn_args(gen)
    for layout in ("flat", "interleaved"):
        got = qgate_kernels.gdn_input(*gargs, layout=layout)
        want = torch.ops.qgate.gdn_input(*gargs, layout == "interleaved")
        assert all(torch.equal(g, w_) for g, w_ in zip(got, want, strict=True))
    logits, visible = _topk_args(gen)
    out = torch.full((3, 5), 7, dtype=torch.int32)
    assert qgate_kernels.qsa_topk(logits, visible, 5, out) is out
    assert torch.equal(out, reference.qsa_topk(logits, visible, 5))
    assert all(not reasons for reasons in qgate_kernels.fallback_counts().values())


def test_gemv_fallbacks_are_counted_with_reasons_and_correct() -> None:
    gen, _ = fresh_generator()
    w = randn(gen, 40, 64, dtype=torch.float16)
    x3 = randn(gen, 3, 64, dtype=torch.float16)
    assert torch.equal(qgate_kernels.gemv(w, x3), reference.gemv(w, x3))  # prefill: M > 1
    wf, xf = w.float(), x3[0].float()
    assert torch.equal(qgate_kernels.gemv(wf, xf), reference.gemv(wf, xf))  # fp32
    w_odd, x_odd = randn(gen, 8, 60, dtype=torch.float16), randn(gen, 60, dtype=torch.float16)
    qgate_kernels.gemv(w_odd, x_odd)  # K not a multiple of 8
    qgate_kernels.gemv(w.t().contiguous().t(), x3[0])  # column-major weight
    counts = qgate_kernels.fallback_counts()
    assert counts[ops.ROUTE_GEMV] == {"m_gt_1": 1, "dtype": 1, "shape": 1, "layout": 1}
    assert set(counts) == set(qgate_kernels.ROUTES)
    qgate_kernels.reset_fallback_counts()
    assert qgate_kernels.fallback_counts()[ops.ROUTE_GEMV] == {}


def test_gemv_takes_bf16_without_a_fallback() -> None:
    gen, _ = fresh_generator()
    w, x = randn(gen, 40, 64, dtype=torch.bfloat16), randn(gen, 64, dtype=torch.bfloat16)
    y = qgate_kernels.gemv(w, x)
    assert y.dtype == torch.bfloat16
    assert ulp_at_magnitude(y, reference.gemv(w, x)) <= 1
    qgate_kernels.gemv(w, x.half())  # mixed dtypes: no kernel takes them
    assert qgate_kernels.fallback_counts()[ops.ROUTE_GEMV] == {"dtype": 1}


def test_build_info_names_the_kernel_of_every_route() -> None:
    kernels = qgate_kernels.build_info()["route_kernels"]
    assert set(kernels) == set(qgate_kernels.ROUTES)
    assert all(isinstance(name, str) and name for name in kernels.values())


def test_other_routes_count_their_fallbacks() -> None:
    gen, _ = fresh_generator()
    h, o, inj, nw, wd, wu = _hc_args(gen, tokens=2)  # two tokens: M > 1
    _, bi, injection = qgate_kernels.hc_mix(h, nw, wd, wu, **HC_KW)
    assert bi.shape == (2, 64) and injection is not None and injection.shape == (2, 4)
    hf = [t[:1].float() if t.dim() == 2 and t.shape[0] == 2 else t.float() for t in (h, o, inj, nw, wd, wu)]
    qgate_kernels.hc_combine_and_mix(*hf, **HC_KW)  # fp32
    gargs = list(_gdn_args(gen))
    gargs[0] = torch.stack([gargs[0], gargs[0]])
    mixed_qkv, *_ = qgate_kernels.gdn_input(*gargs, layout="flat")
    assert mixed_qkv.shape[0] == 2
    logits, visible = _topk_args(gen, 2, 5000)
    qgate_kernels.qsa_topk(logits.half(), visible, 5)
    qgate_kernels.qsa_topk(logits, visible.long(), 5)
    big = qgate_kernels.qsa_topk(logits, visible, 4097)
    assert torch.equal(big, reference.qsa_topk(logits, visible, 4097))
    counts = qgate_kernels.fallback_counts()
    assert counts[ops.ROUTE_HC] == {"m_gt_1": 1, "dtype": 1}
    assert counts[ops.ROUTE_GDN] == {"m_gt_1": 1}
    assert counts[ops.ROUTE_TOPK] == {"dtype": 2, "k_not_supported": 1}


def test_inputs_that_fit_no_definition_raise_on_every_path() -> None:
    gen, _ = fresh_generator()
    with pytest.raises(ValueError, match="do not fit"):
        qgate_kernels.gemv(torch.randn(4, 8).half(), torch.randn(16).half())
    with pytest.raises(ValueError, match="k >= 1"):
        qgate_kernels.qsa_topk(torch.randn(1, 8), torch.ones(1, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="want"):
        qgate_kernels.qsa_topk(torch.randn(1, 8), torch.ones(1, dtype=torch.int32), 4, torch.empty(1, 5))
    with pytest.raises(ValueError, match="w_qkvz"):
        qgate_kernels.gdn_input(
            torch.randn(64).half(),
            torch.randn(3, 64).half(),
            torch.randn(8, 64).half(),
            2,
            4,
            16,
            8,
            layout="flat",
        )
    with pytest.raises(TypeError):
        qgate_kernels.gdn_input(*_gdn_args(gen))  # the layout is never guessed
    h, o, inj, nw, wd, wu = _hc_args(gen)
    with pytest.raises(ValueError, match="w_down"):
        qgate_kernels.hc_mix(h, nw, wd[:25], wu, **HC_KW)
    assert all(not reasons for reasons in qgate_kernels.fallback_counts().values())


def test_ops_trace_under_torch_compile() -> None:
    gen, _ = fresh_generator()
    w, x = randn(gen, 40, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)
    logits, visible = _topk_args(gen)
    h, o, inj, nw, wd, wu = _hc_args(gen)

    def f(
        w: torch.Tensor, x: torch.Tensor, logits: torch.Tensor, visible: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        y = torch.ops.qgate.gemv(w, x)
        out = torch.empty(3, 4, dtype=torch.int32)
        torch.ops.qgate.qsa_topk(logits, visible, 4, out)
        h2, bi, injection = torch.ops.qgate.hc_combine_mix(h, o, inj, nw, wd, wu, 4, 24, 1e-6)
        return y * 2, out, h2, bi, injection

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(w, x, logits, visible), f(w, x, logits, visible), strict=True):
        assert torch.equal(got, want)


def test_import_is_light() -> None:
    code = "import sys, qgate_kernels; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("qgate_routes") == "qgate_kernels.plugin:register"


def test_pure_python_install_declares_the_same_ops() -> None:
    # As after `pip install -e kernels_ext` in an isolated build (no torch, so no compiled _C).
    code = (
        "import sys; sys.modules['qgate_kernels._C'] = None\n"
        "import torch, qgate_kernels\n"
        "from qgate_kernels import _library\n"
        "assert not _library.EXTENSION_LOADED\n"
        "for name, schema in _library.SCHEMAS.items():\n"
        "    assert str(getattr(torch.ops.qgate, name).default._schema) == 'qgate::' + schema\n"
        "w, x = torch.randn(8, 16).half(), torch.randn(16).half()\n"
        "assert torch.equal(qgate_kernels.gemv(w, x), qgate_kernels.reference.gemv(w, x))\n"
        "print('ok')\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
