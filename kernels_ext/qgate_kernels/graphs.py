"""CUDA-graph accounting of the routes: which routed calls a graph captured, and how often it replayed.

A routed call runs in Python once when vLLM captures a CUDA graph (FULL or piecewise, or a segment of
vLLM 0.32's breakable graphs), and its kernel then runs at every replay without Python. `install()`
wraps `torch.cuda.CUDAGraph.capture_begin / capture_end / replay` (class level, once per process: every
vLLM capture path, `torch.cuda.graph(...)` and BreakableCUDAGraphCapture, goes through them): between
begin and end, `attest.CAPTURE` collects the calls the sites count; at the end they become the graph's
replay plan (kept on the graph object), and each replay adds the plan to the recorder's executions.
Nothing runs on the device and nothing synchronizes: the capture is untouched, and a replay costs one
Python loop over the graph's captured roles. An eager break of vLLM's breakable graphs runs the op's
Python at capture outside any graph and again at every replay, so it counts as an eager call.

The recorder is looked up at every event (registry.STATE), so a process whose plugin is not on counts
nothing. One capture at a time per process: vLLM captures in its model thread.
"""

from __future__ import annotations

from typing import Any

from qgate_kernels import attest, registry

PLAN_ATTR = "_qgate_replay_plan"


def install(cls: Any = None) -> bool:
    """Wrap the graph class's capture and replay (torch.cuda.CUDAGraph unless a class is given, as a
    test gives one); False when torch has no such class. Idempotent."""
    if cls is None:
        import torch

        cls = getattr(torch.cuda, "CUDAGraph", None)
        if cls is None:
            return False
    if getattr(cls.replay, "_qgate_orig", None) is not None:
        return True
    orig_begin, orig_end, orig_replay = cls.capture_begin, cls.capture_end, cls.replay

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_begin(self, *args, **kwargs)
        setattr(self, PLAN_ATTR, ())
        self._qgate_outer = attest.CAPTURE  # not expected (one capture at a time); restored at the end
        attest.CAPTURE = {}
        return out

    def capture_end(self: Any) -> Any:
        noted, attest.CAPTURE = attest.CAPTURE, getattr(self, "_qgate_outer", None)
        out = orig_end(self)  # a failed capture raises here: the graph has no plan and never replays
        state = registry.STATE
        if noted and state is not None:
            setattr(self, PLAN_ATTR, state.recorder.end_capture(noted))
        return out

    def replay(self: Any) -> Any:
        out = orig_replay(self)
        plan = getattr(self, PLAN_ATTR, None)
        state = registry.STATE
        if plan and state is not None:
            state.recorder.replayed(plan)
        return out

    for name, fn, orig in (
        ("capture_begin", capture_begin, orig_begin),
        ("capture_end", capture_end, orig_end),
        ("replay", replay, orig_replay),
    ):
        setattr(cls, name, registry.patched(fn, orig))
    return True
