"""The paths of each route give the same bits: GEMV rows (default: the one-load-group kernel for K =
2048..16384) against the general rows kernel (QGATE_GEMV_GENERAL=1) and the opt-in sm_90 bulk-copy
GEMV (QGATE_GEMV_IMPL=bulk); top-k by thread-block clusters (the default on sm_90) against the
portable grid path (QGATE_TOPK_IMPL=grid, the default before sm_90), both with per-row
visible_blocks. The switches are read once per
process, so the other paths run in a child process on the same inputs (skipped without a GPU; on a
GPU before sm_90 both sides take the portable paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_oracles import fresh_generator, randn

import qgate_kernels

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEV = "cuda"
GEMV_SHAPES = [
    (1, 8),
    (7, 264),
    (2048, 2048),
    (3072, 2048),
    (4096, 4096),
    (2048, 4096),
    (37984, 2048),
    (1000, 6144),
    (100, 8192),
    (65, 16384),
]
TOPK_SHAPES = [
    (1, 131072, 2048),
    (4, 131072, 2048),
    (8, 32768, 1024),
    (3, 257, 257),
    (3000, 512, 16),
    (5, 10001, 777),
    (2, 4099, 4096),
    (1, 200000, 2048),
    (1, 2**20, 64),
    (1, 2**20, 4096),
]
NAN_BITS = [0x7FC00000, -0x00400000, 0x7F800001, -0x007EDCBB, 0x7FFFFFFF]  # int32 views: +/- payloads

_CHILD = """
import sys, torch, qgate_kernels
cases = torch.load(sys.argv[1])
out = {}
for name, args in cases.items():
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    fn = qgate_kernels.gemv if name.startswith("gemv") else qgate_kernels.qsa_topk
    res = fn(*args)
    out[name] = [r.cpu() for r in res] if isinstance(res, tuple) else [res.cpu()]
torch.save(out, sys.argv[2])
"""


def _cases(gen: torch.Generator) -> dict[str, list]:
    cases: dict[str, list] = {}
    for n, k in GEMV_SHAPES:
        w = randn(gen, n, k, dtype=torch.half, device=DEV, scale=k**-0.5)
        cases[f"gemv_{n}x{k}"] = [w, randn(gen, k, dtype=torch.half, device=DEV)]
    for rows, length, k in TOPK_SHAPES:
        s = torch.randn(rows, length, generator=gen, device=DEV)
        cases[f"topk_{rows}x{length}_{k}"] = [s, _visible(s, gen, k), k]
        cases[f"topk_ties_{rows}x{length}_{k}"] = [_hard(s, gen), _visible(s, gen, k), k]
    n = 131072
    equal = torch.full((2, n), 1.5, device=DEV)  # one cell holds all k: ties by index only
    ramp = (torch.arange(n, device=DEV) // 3).float().mul(0.25).sub(100.0)  # top-k in the last block
    zeros = torch.zeros(1, n, device=DEV)
    zeros[:, torch.rand(n, generator=gen, device=DEV) < 0.5] = -0.0
    full = torch.full((1,), n, dtype=torch.int32, device=DEV)
    cases["topk_equal"] = [equal, full.repeat(2), 4096]
    cases["topk_ascending"] = [ramp[None].clone(), full, 4096]
    cases["topk_descending"] = [ramp.flip(0)[None].clone(), full, 2048]
    cases["topk_zeros"] = [zeros, full, 3000]
    return cases


def _visible(s: torch.Tensor, gen: torch.Generator, k: int) -> torch.Tensor:
    """Row 0 all visible, the others a random n in [0, L] (some of them <= k: the -1 fill)."""
    rows, length = s.shape
    vis = torch.randint(0, length + 1, (rows,), generator=gen, device=DEV, dtype=torch.int32)
    vis[0] = length
    return vis


def _hard(s: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Heavy ties across block and cluster boundaries, NaNs of several payloads, both zeros, infinities."""
    t = torch.round(s * 2) / 2
    flat = t.view(-1)
    stride = max(1, t.shape[1] // 7)
    nan_pos = torch.arange(0, flat.numel(), stride, device=t.device)
    bits = torch.tensor(NAN_BITS, dtype=torch.int32, device=t.device)
    flat.view(torch.int32)[nan_pos] = bits[torch.arange(nan_pos.numel(), device=t.device) % len(NAN_BITS)]
    for value in (0.0, -0.0, float("inf"), float("-inf")):
        flat[torch.randint(0, flat.numel(), (64,), generator=gen, device=t.device)] = value
    return t


OTHER_PATHS = [
    {"QGATE_GEMV_IMPL": "bulk", "QGATE_TOPK_IMPL": "grid"},
    {"QGATE_GEMV_GENERAL": "1"},
]


@pytest.mark.parametrize("other", OTHER_PATHS, ids=["bulk-gemv+grid-topk", "general-gemv"])
def test_other_paths_give_the_same_bits(tmp_path: Path, other: dict[str, str]) -> None:
    gen, seed = fresh_generator(DEV)
    cases = _cases(gen)
    torch.save(
        {n: [a.cpu() if isinstance(a, torch.Tensor) else a for a in args] for n, args in cases.items()},
        tmp_path / "in.pt",
    )
    env = dict(os.environ, **other)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = torch.load(tmp_path / "out.pt")
    for name, args in cases.items():
        fn = qgate_kernels.gemv if name.startswith("gemv") else qgate_kernels.qsa_topk
        res = fn(*args)
        mine = [r.cpu() for r in res] if isinstance(res, tuple) else [res.cpu()]
        for a, b in zip(mine, theirs[name], strict=True):
            assert torch.equal(_bits(a), _bits(b)), f"{name} against {other}, seed {seed}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so that NaN payloads and signed zeros compare too."""
    if t.dtype == torch.half:
        return t.view(torch.int16)
    return t.view(torch.int32) if t.dtype == torch.float32 else t
