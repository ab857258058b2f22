"""Which activation dtypes each route's op runs its kernel for on a device, read from the op's own dispatch.

`route_dtypes("cuda")` asks each op's dispatch function (ops._gemv_reason, _gdn_reason, _hc_reason) about
a small dense tensor of each dtype on that device: a dtype is listed when the op would run its kernel
(no fallback reason), so the answer follows ops.py as it changes. On the CPU that is the C++ kernel
where the extension has one (else the reference, which is the CPU kernel of a pure-Python install);
on CUDA the compiled kernels (none without a CUDA build: every dtype falls back, the list is empty).
The top-k takes float32 scores only and is not listed.
"""

from __future__ import annotations

import torch

from qgate_kernels import ops
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC

NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def route_dtypes(device: str) -> dict[str, tuple[str, ...]]:
    """route -> the dtype names ("fp16", "bf16") its op runs a kernel for on `device` ("cpu", "cuda")."""
    dev = torch.device(device)
    out: dict[str, tuple[str, ...]] = {}
    for route, takes in ((ROUTE_GEMV, _gemv), (ROUTE_GDN, _gdn), (ROUTE_HC, _hc)):
        out[route] = tuple(name for name, dt in NAMES.items() if takes(dt, dev))
    return out


def _gemv(dt: torch.dtype, dev: torch.device) -> bool:
    w, x = torch.zeros(8, 64, dtype=dt, device=dev), torch.zeros(64, dtype=dt, device=dev)
    return ops._gemv_reason(w, x) is None


def _gdn(dt: torch.dtype, dev: torch.device) -> bool:
    x = torch.zeros(64, dtype=dt, device=dev)
    return (
        ops._gdn_reason(
            x, torch.zeros(16, 64, dtype=dt, device=dev), torch.zeros(4, 64, dtype=dt, device=dev)
        )
        is None
    )


def _hc(dt: torch.dtype, dev: torch.device) -> bool:
    hc, hs, rank = 4, 16, 8
    d = hc * hs
    tensors = (
        torch.zeros(1, d, dtype=dt, device=dev),
        torch.zeros(d, dtype=dt, device=dev),
        torch.zeros(rank, d, dtype=dt, device=dev),
        torch.zeros(d, rank, dtype=dt, device=dev),
    )
    return ops._hc_reason(tensors, hc, rank) is None
