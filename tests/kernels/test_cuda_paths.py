"""The opt-in sm_90 paths (QGATE_GEMV_IMPL=bulk: GEMV by bulk copies; QGATE_TOPK_IMPL=cluster: top-k
by thread-block clusters) give the same bits as the default paths. The switches are read once per
process, so the sm_90 paths run in a child process on the same inputs (skipped without a GPU; on
a GPU before sm_90 both sides take the default paths)."""

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
]
TOPK_SHAPES = [(1, 131072, 2048), (4, 131072, 2048), (3, 257, 257), (3000, 512, 16), (1, 2**20, 64)]

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
        ties = torch.round(s * 2) / 2  # heavy ties across block and cluster boundaries
        ties.view(-1)[:: max(1, length // 7)] = float("nan")
        cases[f"topk_{rows}x{length}_{k}"] = [s, k]
        cases[f"topk_ties_{rows}x{length}_{k}"] = [ties, k]
    return cases


def test_sm90_paths_give_the_portable_bits(tmp_path: Path) -> None:
    gen, seed = fresh_generator(DEV)
    cases = _cases(gen)
    torch.save(
        {n: [a.cpu() if isinstance(a, torch.Tensor) else a for a in args] for n, args in cases.items()},
        tmp_path / "in.pt",
    )
    env = dict(os.environ, QGATE_GEMV_IMPL="bulk", QGATE_TOPK_IMPL="cluster")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sm90 = torch.load(tmp_path / "out.pt")
    for name, args in cases.items():
        fn = qgate_kernels.gemv if name.startswith("gemv") else qgate_kernels.qsa_topk
        res = fn(*args)
        mine = [r.cpu() for r in res] if isinstance(res, tuple) else [res.cpu()]
        for a, b in zip(mine, sm90[name], strict=True):
            assert torch.equal(_bits(a), _bits(b)), f"{name}, seed {seed}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so that NaN payloads and signed zeros compare too."""
    if t.dtype == torch.half:
        return t.view(torch.int16)
    return t.view(torch.int32) if t.dtype == torch.float32 else t
