"""Outputs of the qgate_routes custom ops that share no memory with an input or with each other.

torch.library checks at every call that a custom op's outputs neither are nor alias its inputs or each
other (RuntimeError otherwise). The kernels' own outputs are fresh allocations and pass as they are; a
copy is made only of an output that does share memory (vLLM's path in a fallback can hand back its
input, views of one buffer, an override anything), so a routed call adds no copy kernel (one a call
was 25 us of a production-shape decode step on the H200: docs/evidence/gpu-sessions.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def unaliased(inputs: Iterable[Any], outs: Iterable[Any], contiguous: bool = False) -> tuple[Any, ...]:
    """outs in order, each copied when its storage is an input's or an earlier output's (contiguous:
    every output dense as well, a copy only where it is not)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t is not None and t.numel()}
    fresh = []
    for t in outs:
        if not t.numel():  # no memory to share (data_ptr may be 0 for every empty tensor)
            fresh.append(t)
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone(memory_format=torch.contiguous_format)
        elif contiguous:
            t = t.contiguous()
        seen.add(t.untyped_storage().data_ptr())
        fresh.append(t)
    return tuple(fresh)
