"""qgate_plugin::gemv_site, the route plugin's C++ entry for a routed GEMV call (csrc/gemv_site.h):
it runs the op's kernel and counts the hit only for the batch-one row the kernel takes, and returns None
(an undefined tensor) without counting for anything else, which the plugin then sends down its checked
path (vLLM's own linear or ops.gemv's counted fallback)."""

from __future__ import annotations

import pytest
import torch

from qgate_kernels import _library, attest

pytestmark = pytest.mark.skipif(not _library.EXTENSION_LOADED, reason="the C++ extension is not built here")


def _devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() and _library.EXTENSION_HAS_CUDA else ["cpu"]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_taken_row_runs_the_op_and_counts_once(device: str, dtype: torch.dtype) -> None:
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the CPU GEMV kernel is fp16")
    gen = torch.Generator().manual_seed(28)
    w = (torch.randn(96, 64, generator=gen) * 0.125).to(device, dtype)  # [N, K]
    x = torch.randn(1, 64, generator=gen).to(device, dtype)  # [1, K]
    hits = torch.zeros(1, dtype=torch.int64)  # [1] on the CPU, as the plugin keeps it
    entry = torch.ops.qgate_plugin.gemv_site.default
    for i in range(3):
        y = entry(w, x, hits)
        assert y is not None and tuple(y.shape) == (1, 96) and y.dtype == dtype
        assert torch.equal(y, torch.ops.qgate.gemv.default(w, x, True))  # the same kernel, bitwise
        assert int(hits[0]) == i + 1


@pytest.mark.parametrize("device", _devices())
def test_any_other_input_returns_none_and_is_not_counted(device: str) -> None:
    w = torch.randn(96, 64).half().to(device)  # [N, K]
    hits = torch.zeros(1, dtype=torch.int64)
    entry = torch.ops.qgate_plugin.gemv_site.default
    buf = torch.randn(65).half().to(device)
    wide = torch.randn(1, 128).half().to(device)
    others = {
        "batch of 2": torch.randn(2, 64).half().to(device),
        "1-d": torch.randn(64).half().to(device),
        "wrong K": torch.randn(1, 32).half().to(device),
        "dtype": torch.randn(1, 64).to(device),
        "strided": wide[:, ::2],  # [1, 64] with stride 2
        "misaligned": buf[1:].view(1, 64),  # dense, 2 bytes past a 16-byte boundary
    }
    if torch.cuda.is_available() and _library.EXTENSION_HAS_CUDA:
        # x and the weight on different devices: the dispatcher sends the call to the CUDA entry (one
        # CUDA tensor is enough), which must refuse it rather than launch on the weight's device.
        other = "cpu" if device == "cuda" else "cuda"
        others["other device"] = torch.randn(1, 64).half().to(other)
    assert others["misaligned"].data_ptr() % 16 != 0 and not others["strided"].is_contiguous()
    for name, x in others.items():
        assert entry(w, x, hits) is None, name
    assert int(hits[0]) == 0


def test_a_tally_with_a_cell_reads_and_resets_through_n() -> None:
    t = attest.Tally("fp16_gemv", "qkv_proj")
    t.n += 2  # counted in Python before the cell was attached
    t.cell = torch.zeros(1, dtype=torch.int64)
    t.cell[0] += 5  # what the C++ entry does per hit
    assert t.n == 7
    t.n = 0  # the reset a forked child makes
    assert t.n == 0
    t.cell[0] += 1
    assert t.n == 1
