"""The qgate::* ops and their Python entry points on the CPU: schemas, opcheck, counted fallbacks."""

from __future__ import annotations

import sys

import pytest
import torch
from kernel_oracles import fresh_generator, randn

import qgate_kernels
from qgate_kernels import _library, ops, reference


@pytest.fixture(autouse=True)
def _clean_counts() -> None:
    qgate_kernels.reset_fallback_counts()


def _hc_args(gen: torch.Generator, n: int = 4, d: int = 64) -> tuple:
    return (
        randn(gen, n, d, dtype=torch.float16),
        (1 + 0.1 * randn(gen, d, dtype=torch.float32)).half(),
        randn(gen, n + 1, d, dtype=torch.float16, scale=0.05),
        randn(gen, n, n + 1, dtype=torch.float32),
        torch.tensor([0.3]),
        randn(gen, d, dtype=torch.float16, scale=0.05),
        torch.ones(n),
        torch.tensor([0.2]),
    )


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
    samples = {
        "gemv": [
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)),
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 1, 64, dtype=torch.float16)),
            (randn(gen, 48, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16), True),
        ],
        "fused_hc": [(*_hc_args(gen), 1e-6)],
        "gdn_input": [_gdn_args(gen), (*_gdn_args(gen), True)],
        "qsa_topk": [(randn(gen, 3, 100, dtype=torch.float32), 7)],
    }
    for name, cases in samples.items():
        for args in cases:
            torch.library.opcheck(getattr(torch.ops.qgate, name).default, args)


def test_supported_calls_use_the_op_and_count_nothing() -> None:
    gen, _ = fresh_generator()
    w, x = randn(gen, 40, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)
    # the op's own CPU kernel (csrc/cpu: another float32 summation order than the reference, within
    # the bound tests/kernels/test_cpu_kernels.py checks)
    assert torch.equal(qgate_kernels.gemv(w, x), torch.ops.qgate.gemv.default(w, x, True))
    args = _hc_args(gen)
    for got, want in zip(qgate_kernels.fused_hc(*args), reference.fused_hc(*args, 1e-6), strict=True):
        assert torch.equal(got, want)
    gargs = _gdn_args(gen)
    for got, want in zip(qgate_kernels.gdn_input(*gargs), reference.gdn_input(*gargs), strict=True):
        assert torch.equal(got, want)
    s = randn(gen, 2, 50, dtype=torch.float32)
    assert all(
        torch.equal(a, b) for a, b in zip(qgate_kernels.qsa_topk(s, 5), reference.qsa_topk(s, 5), strict=True)
    )
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


def test_other_routes_count_their_fallbacks() -> None:
    gen, _ = fresh_generator()
    h_args = _hc_args(gen)
    batched = (torch.stack([h_args[0], h_args[0]]),) + h_args[1:]
    li, mixed, b = qgate_kernels.fused_hc(*batched)
    assert li.shape == (2, 64) and mixed.shape == (2, 4, 64)
    nine = _hc_args(gen, n=9)
    qgate_kernels.fused_hc(*nine)
    gargs = list(_gdn_args(gen))
    gargs[0] = torch.stack([gargs[0], gargs[0]])
    mixed_qkv, *_ = qgate_kernels.gdn_input(*gargs)
    assert mixed_qkv.shape[0] == 2
    qgate_kernels.qsa_topk(randn(gen, 2, 50, dtype=torch.float16), 5)
    qgate_kernels.qsa_topk(randn(gen, 1, 5000, dtype=torch.float32), 4097)
    counts = qgate_kernels.fallback_counts()
    assert counts[ops.ROUTE_HC] == {"m_gt_1": 1, "shape": 1}
    assert counts[ops.ROUTE_GDN] == {"m_gt_1": 1}
    assert counts[ops.ROUTE_TOPK] == {"dtype": 1, "k_too_large": 1}


def test_inputs_that_fit_no_definition_raise_on_every_path() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        qgate_kernels.gemv(torch.randn(4, 8).half(), torch.randn(16).half())
    with pytest.raises(ValueError, match="1 <= k <= L"):
        qgate_kernels.qsa_topk(torch.randn(1, 8), 9)
    with pytest.raises(ValueError, match="w_qkvz"):
        qgate_kernels.gdn_input(
            torch.randn(64).half(), torch.randn(3, 64).half(), torch.randn(8, 64).half(), 2, 4, 16, 8
        )
    assert all(not reasons for reasons in qgate_kernels.fallback_counts().values())


def test_ops_trace_under_torch_compile() -> None:
    gen, _ = fresh_generator()
    w, x = randn(gen, 40, 64, dtype=torch.float16), randn(gen, 64, dtype=torch.float16)
    s = randn(gen, 2, 50, dtype=torch.float32)

    def f(w: torch.Tensor, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.ops.qgate.gemv(w, x)
        v, i = torch.ops.qgate.qsa_topk(s, 4)
        return y * 2, v, i

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(w, x, s), f(w, x, s), strict=True):
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
