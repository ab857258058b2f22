"""Issue 44's zoo, benchmark side: GEMVs whose timed call returns before the work is done (another
thread, a pipeline, a lazy result; tests/fixtures/async_routes.py, never shipped) are refused by the
timed-output audit of `qgate bench ops --device cpu`, with a named line; the real kernels pass it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from qgate.cli import app
from qgate.ops import bench_cpu
from qgate.ops.screen import _replaced_ops

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CFG = {"reps": 2, "warmup": 1, "min_sample_us": 300.0}


@pytest.fixture(autouse=True)
def _no_vllm_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's linear is a baseline, not the candidate: tests/test_bench_cpu.py times and audits it; here
    it would only add vLLM's import (tens of seconds on a busy 2-core machine)."""
    monkeypatch.setattr(bench_cpu, "_vllm_linear", lambda _w: (None, "not timed in this test"))


@pytest.fixture(scope="module")
def async_routes():  # noqa: ANN201
    sys.path.insert(0, str(FIXTURES))
    try:
        import async_routes

        yield async_routes
    finally:
        sys.path.remove(str(FIXTURES))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("background_gemv", "timed samples ended before the output was this input's result"),
        ("pipelined_gemv", "timed samples ended before the output was this input's result"),
        ("lazy_gemv", "returned a Lazy, not a tensor"),
    ],
)
def test_the_audit_refuses_a_timed_call_that_returns_before_its_work(
    async_routes,  # noqa: ANN001
    name: str,
    why: str,
) -> None:
    gen = torch.Generator().manual_seed(4)
    with _replaced_ops({"gemv": getattr(async_routes, name)}):
        case = bench_cpu.bench_gemv(512, 256, gen, CFG, tiny=False)
    impls, lines = case["audit"]["implementations"], case["audit_failures"]
    assert case["audit"]["passed"] is False and lines, case["audit"]
    # the real kernels beside it, timed in the same turns, held their own results
    assert all(a["wrong"] == 0 for n, a in impls.items() if n != "route"), impls
    threads = "timed-output audit: Python threads started while timing and still running (async-gemv"
    if name == "background_gemv":
        # The pool's thread can finish the last job before the copy (the GIL passes at torch calls):
        # the wrong-output count varies; the thread, started by the first call, is always named.
        assert any(line.startswith(threads) for line in lines), lines
        assert impls["route"]["wrong"] == 0 or why in lines[0]
    else:  # deterministic: the previous input's result, or no tensor at all
        assert lines[0].startswith("timed-output audit: route: 2/2 timed samples") and why in lines[0], lines


def test_the_real_kernels_pass_the_audit_and_the_refusal_is_exit_1(async_routes, tmp_path: Path) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(5)
    case = bench_cpu.bench_gemv(128, 384, gen, CFG, tiny=True)
    impls = case["audit"]["implementations"]
    assert case["audit_failures"] == [] and set(impls) == {
        "plugin",
        "op",
        "route",
        "torch_linear",
        "reference",
    }
    assert case["audit"]["passed"] and all(a["checked"] == 2 and a["wrong"] == 0 for a in impls.values())
    contract = {
        "name": "zoo-bench",
        "version": 1,
        "model": "tiny",
        "arms": {
            "control": {"env": {}},
            "candidate": {
                "env": {
                    "VLLM_SM70_QWEN38_FP16_GEMV": "1",
                    # deterministic: a background thread can win the race to the copy at this tiny
                    # shape, and the pool's thread exists already (the test above started it)
                    "QGATE_ROUTE_IMPL_FP16_GEMV": "async_routes:pipelined_gemv",
                    "PYTHONPATH": str(FIXTURES),
                }
            },
        },
        "ops": {
            "routes": ["fp16_gemv"],
            "default_shapes": False,
            "shapes": {"fp16_gemv": [{"n": 64, "k": 96}]},
        },
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(contract))
    bench_cpu.TINY_GEMV_SHAPES, saved = [], bench_cpu.TINY_GEMV_SHAPES  # only the listed shape
    wide, bench_cpu.WIDE_GEMV_SHAPES = bench_cpu.WIDE_GEMV_SHAPES, []
    try:
        res = CliRunner().invoke(
            app,
            ["bench", "ops", "--device", "cpu", "-c", str(path), "-o", str(tmp_path / "o"), "--reps", "2",
             "--arm", "candidate"],
        )  # fmt: skip
    finally:
        bench_cpu.TINY_GEMV_SHAPES, bench_cpu.WIDE_GEMV_SHAPES = saved, wide
    assert res.exit_code == 1, res.output
    assert "## Refused: timed-output audit" in res.output
    assert "64x96: timed-output audit: route:" not in res.output  # the markdown lines carry no label prefix
    assert "timed-output audit: route: 2/2 timed samples ended before" in res.output
