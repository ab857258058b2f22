"""Activation recording for the real-weight operator screen (`qgate run ops --model --activations`).

When QGATE_RECORD_DIR is set, the plugin saves the inputs of the first QGATE_RECORD_CALLS (default 4)
batch-one decode calls at every routed GEMV, GDN-input and HC site, and of the first single-row calls
of the QSA indexer's top-k, to `$QGATE_RECORD_DIR/rank<r>/<route>/<name>.pt`, a list of calls, each a
tuple of CPU tensors: (x [1, K],) at a GEMV site, (h [1, hidden],) at a GDN site, (h [1, D],
block_output [1, hidden], injection [1, HC]) at an HC module (None, None for a `mix` call), named by
the vLLM module; (logits [rows, L] float32, visible_blocks [rows] int32, k) at `_topk` (one module
function that every QSA layer calls: name `_topk`). Beside each, `<name>.json` holds the shapes of the
weights the site holds on that rank (what the screen's slice of the checkpoint must match), and
`rank<r>/rank.json` the rank and the tensor parallel size of the process that wrote them: r is vLLM's
tensor parallel rank (torch.distributed's rank outside vLLM's groups; 0 without either). The screen
replays them through the route and its reference on the checkpoint's own weights. Off (the variable
unset), `active()` is False and the sites never call in here. Calls inside a CUDA graph capture are
not kept (the graph's replays never reach Python): record with enforce_eager.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from qgate_kernels import attest
from qgate_route_env import RECORD_CALLS_ENV, RECORD_DIR_ENV

_SAVED: dict[str, list[Any]] = {}
_DIR = os.environ.get(RECORD_DIR_ENV) or None
_CALLS = int(os.environ.get(RECORD_CALLS_ENV) or 4)

RANK_FILE = "rank.json"
TOPK_NAME = "_topk"


def active() -> bool:
    return _DIR is not None


def _rank() -> tuple[int, int]:
    """(rank, size) of this process's tensor parallel group: vLLM's, else torch.distributed's, else (0, 1)."""
    return attest.parallel_rank() or (0, 1)


def _capturing(inputs: tuple[Any, ...]) -> bool:
    """A CUDA graph capture (no copy to the host can run in it; its replays never call Python)."""
    on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    return on_cuda and torch.cuda.is_current_stream_capturing()


def _copy(x: Any) -> Any:
    return x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x


def save(route: str, name: str, *inputs: Any, weights: tuple[Any, ...] = ()) -> None:
    """Keep the inputs (tensors copied to the CPU; None and ints as they are) as the next recorded call
    of the site `name`, up to the limit; at its first call, the shapes of `weights` (the tensors the
    site holds) beside it."""
    if _DIR is None or not name:
        return
    kept = _SAVED.setdefault(f"{route}/{name}", [])
    if len(kept) >= _CALLS or _capturing(inputs):
        return
    kept.append(tuple(_copy(x) for x in inputs))
    rank, size = _rank()
    path = Path(_DIR) / f"rank{rank}" / route / f"{name}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(kept) == 1:
        shapes = [None if w is None else list(w.shape) for w in weights]
        path.with_suffix(".json").write_text(json.dumps({"weights": shapes}))
        rank_file = path.parents[1] / RANK_FILE
        if not rank_file.exists():
            rank_file.write_text(json.dumps({"rank": rank, "tensor_parallel_size": size}))
    torch.save(kept, path)
