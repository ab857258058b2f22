"""Activation recording for the real-weight operator screen (`qgate run ops --model --activations`).

When QGATE_RECORD_DIR is set, the plugin saves the inputs of the first QGATE_RECORD_CALLS (default 4)
batch-one decode calls at every routed GEMV, GDN-input and HC site to
`$QGATE_RECORD_DIR/rank<r>/<route>/<vLLM module name>.pt`, a list of calls, each a tuple of CPU
tensors: (x [1, K],) at a GEMV site, (h [1, hidden],) at a GDN site, (h [1, D], block_output
[1, hidden], injection [1, HC]) at an HC module (None, None for a `mix` call); rank r is the process's
torch.distributed rank (0 without one). The screen replays them through the route and its reference
on the checkpoint's own weights. Off (the variable unset), `active()` is False and the sites never
call in here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from qgate_route_env import RECORD_CALLS_ENV, RECORD_DIR_ENV

_SAVED: dict[str, list[Any]] = {}
_DIR = os.environ.get(RECORD_DIR_ENV) or None
_CALLS = int(os.environ.get(RECORD_CALLS_ENV) or 4)


def active() -> bool:
    return _DIR is not None


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save(route: str, name: str, *inputs: Any) -> None:
    """Keep the inputs (copies on the CPU; None stays None) as the next recorded call of the site
    `name`, up to the limit."""
    if _DIR is None or not name:
        return
    kept = _SAVED.setdefault(f"{route}/{name}", [])
    if len(kept) >= _CALLS:
        return
    kept.append(tuple(None if x is None else x.detach().to("cpu", copy=True) for x in inputs))
    path = Path(_DIR) / f"rank{_rank()}" / route / f"{name}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(kept, path)
