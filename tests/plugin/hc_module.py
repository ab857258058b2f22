"""A small Qwen4Exp GatedResidual for the HC site's unit tests (tests/plugin): the attributes HcSite
reads, and merged down + inject and up weights of the shapes it takes (fp16)."""

from __future__ import annotations

import types
from typing import Any

import torch

HC, HS, RANK = 4, 16, 8  # streams, stream width, low rank
D = HC * HS
MERGED = RANK + HC + (-(RANK + HC)) % 16  # merged down + inject rows, padded to 16


class Module(types.SimpleNamespace):
    """A GatedResidual's attributes the site reads (weak-referenceable, as an nn.Module is)."""


def gated_residual(g: torch.Generator) -> tuple[Module, Any, Any]:
    """(module, w_down [MERGED, D], w_up [D, RANK]), drawn from g."""
    module = Module(
        hc_count=HC,
        lora_rank=RANK,
        hidden_size=HS,
        use_combine=True,
        config=types.SimpleNamespace(rms_norm_eps=1e-6),
        hc_norm=types.SimpleNamespace(weight=(1 + 0.1 * torch.randn(D, generator=g)).half()),
    )
    w_down = (0.1 * torch.randn(MERGED, D, generator=g)).half()  # [R + HC + pad, D]
    w_up = (0.1 * torch.randn(D, RANK, generator=g)).half()  # [D, R]
    return module, w_down, w_up
