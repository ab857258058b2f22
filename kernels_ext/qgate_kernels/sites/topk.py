"""The QSA top-k site of the route plugin (Qwen4Exp, vLLM 0.32).

QSA (`qsa_topk`): `_topk(logits, visible_blocks, token_topk, compress_ratio, block_indices,
topk_workspace)` is a module function; its callers (`qsa_select_paged_decode` / `_prefill`) look it up
in their module's globals at call time, so the module attribute is replaced, and any other loaded
module holding the same function object is patched too (both are checked and recorded). The patched
function calls `qgate_routes::qsa_topk`, which writes `block_indices` through `ops.qsa_topk` (float32
logits, int32 visible_blocks and indices) or falls back to vLLM's `_topk`, counted. With recording on
(qgate_kernels.record), the single-row calls the route takes are kept as `_topk`'s: the indexer's
score rows, every QSA layer's, for `qgate run ops --real --activations`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from qgate_kernels import record, registry
from qgate_route_env import ROUTE_TOPK as TOPK_ROUTE


class TopkSite:
    """vLLM's `_topk` (one per process: a module function); `run` is the body of qgate_routes::qsa_topk."""

    route = TOPK_ROUTE
    role = "topk"

    def __init__(self, orig: Callable[..., Any]) -> None:
        self.orig = orig

    def run(
        self,
        logits: Any,
        visible_blocks: Any,
        token_topk: int,
        compress_ratio: int,
        block_indices: Any,
        workspace: Any,
    ) -> None:
        state = registry.STATE
        k = token_topk // compress_ratio
        reason = None
        if logits.dim() != 2 or tuple(block_indices.shape) != (logits.shape[0], k):
            reason = "shape"
        elif (
            logits.dtype != torch.float32
            or visible_blocks.dtype != torch.int32
            or block_indices.dtype != torch.int32
        ):
            reason = "dtype"
        elif not block_indices.is_contiguous():
            reason = "layout"
        if reason is not None:
            state.recorder.fallback(TOPK_ROUTE, reason)
            self.orig(logits, visible_blocks, token_topk, compress_ratio, block_indices, workspace)
            return
        if record.active() and logits.shape[0] == 1:  # a decode step's row (a prefill's can be GBs)
            record.save(TOPK_ROUTE, record.TOPK_NAME, logits, visible_blocks, k)
        out = registry.invoke(TOPK_ROUTE, self.role, logits, visible_blocks, k, block_indices)
        if out is not None and out is not block_indices:
            if tuple(out.shape) != tuple(block_indices.shape):
                got, want = tuple(out.shape), tuple(block_indices.shape)
                raise RuntimeError(f"qgate qsa_topk implementation returned {got}, expected {want}")
            block_indices.copy_(out)


def define_topk_op() -> None:
    @torch.library.custom_op("qgate_routes::qsa_topk", mutates_args=("block_indices",))
    def qsa_topk(
        logits: torch.Tensor,
        visible_blocks: torch.Tensor,
        token_topk: int,
        compress_ratio: int,
        block_indices: torch.Tensor,
        workspace: torch.Tensor,
        site_id: int,
    ) -> None:
        registry.STATE.sites[site_id].run(
            logits, visible_blocks, token_topk, compress_ratio, block_indices, workspace
        )

    @qsa_topk.register_fake
    def _(
        logits: torch.Tensor,
        visible_blocks: torch.Tensor,
        token_topk: int,
        compress_ratio: int,
        block_indices: torch.Tensor,
        workspace: torch.Tensor,
        site_id: int,
    ) -> None:
        return None


def patch_topk(owner: Any, name: str, orig: Callable[..., Any]) -> list[str]:
    """Replace the module function everywhere it is looked up; returns where (module.attr), callers first.

    The site's own module is patched (its callers read the global at call time: checked through their
    code's global names), then every other loaded module that holds the same function object."""
    registry.STATE.sites.append(TopkSite(orig))  # its site count comes per model load (model_has_qsa)
    sid = len(registry.STATE.sites) - 1

    def topk(
        logits: Any, visible_blocks: Any, token_topk: int, compress_ratio: int, block_indices: Any, ws: Any
    ) -> None:
        if torch.compiler.is_compiling():  # the op keeps the per-call decision out of a traced graph
            torch.ops.qgate_routes.qsa_topk(
                logits, visible_blocks, token_topk, compress_ratio, block_indices, ws, sid
            )
        else:  # eager (and CUDA-graph capture): no dispatcher round trip
            site = registry.STATE.sites[sid]
            site.run(logits, visible_blocks, token_topk, compress_ratio, block_indices, ws)

    patched = registry.patched(topk, orig)
    where = []
    callers = [
        f"{owner.__name__}.{fname}"
        for fname, fn in vars(owner).items()
        if callable(fn) and name in getattr(getattr(fn, "__code__", None), "co_names", ())
    ]
    setattr(owner, name, patched)
    where.append(f"{owner.__name__}.{name} (callers: {', '.join(callers) or 'none'})")
    for mod_name, mod in list(sys.modules.items()):
        if mod is owner or mod is None:
            continue
        for attr, value in list(getattr(mod, "__dict__", {}).items()):
            if value is orig:
                setattr(mod, attr, patched)
                where.append(f"{mod_name}.{attr}")
    return where


def model_has_qsa(model: Any) -> bool:
    """A QSA layer in the model: a module with a QSA indexer (vLLM's Qwen4ExpQSAAttention.indexer)."""
    return any(hasattr(m, "indexer") and "qsa" in type(m).__name__.lower() for m in model.modules())
