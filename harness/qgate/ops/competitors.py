"""What vLLM itself runs for each route on this GPU, timed beside the route in `qgate bench ops`.

Each function returns name -> callable (same arguments as the case's kernel) for a path that can
run here, or name -> reason (a string) for one that cannot: the benchmark then prints the reason and
judges the route against the competitors it could time (the case's own baseline always runs).
vLLM's paths need vLLM itself (and, for its CuTe kernels, the CUTLASS DSL) in this process; where
vLLM is not installed the reason says so. Nothing here falls back silently to another kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Competitor = Callable[..., Any] | str

VLLM_GEMM = "vLLM Qwen4Exp low-latency GEMM (CuTe skinny GEMM, plan by arch)"
VLLM_HC = "vLLM GatedResidual (Triton + CuTe hc_down_silu)"
VLLM_TOPK = "vLLM _topk (persistent_topk / cooperative_topk)"


def _import_error(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
        return f"cannot run: {module} does not import here ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def gemv_competitors(n: int, k: int, dtype: torch.dtype) -> dict[str, Competitor]:
    """vLLM's batch-one linear for Qwen4Exp: its CuTe skinny GEMM where its plan for this arch names
    the (N, K) shape (bf16 only), else F.linear, i.e. cuBLAS, which the case's baseline times."""
    module = "vllm.models.qwen4_exp.nvidia.low_latency_gemm"
    reason = _import_error(module)
    if reason is not None:
        return {VLLM_GEMM: reason}
    import importlib

    llg = importlib.import_module(module)
    if not torch.cuda.is_available():
        return {VLLM_GEMM: "cannot run: no CUDA device"}
    cap = torch.cuda.get_device_capability()
    plan = llg.QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY.get(cap, {}).get((n, k), {}).get(1)
    if plan is None:
        arch = f"sm_{cap[0]}{cap[1]}"
        return {VLLM_GEMM: f"vLLM runs F.linear (cuBLAS, the baseline) at ({n}, {k}) on {arch}: no plan"}
    if dtype != torch.bfloat16:
        return {VLLM_GEMM: "vLLM's skinny GEMM takes bf16 only (F.linear otherwise: the baseline)"}
    if not llg.shape_dynamic_skinny_gemm.is_available():
        return {VLLM_GEMM: "cannot run: the CUTLASS DSL (nvidia-cutlass-dsl) is not installed"}
    gemm = llg.shape_dynamic_skinny_gemm
    return {VLLM_GEMM: lambda w, x: gemm(x.view(1, -1), w, plan)}


def hc_competitors() -> dict[str, Competitor]:
    """vLLM's GatedResidual needs vLLM's model code; kernels_ext/tools/vllm_hc_triton.py times its
    Triton kernels standalone where vLLM cannot be installed."""
    reason = _import_error("vllm.models.qwen4_exp.nvidia.hyperconnection")
    return {VLLM_HC: reason or "not wired: time it with kernels_ext/tools/vllm_hc_triton.py"}


def topk_competitors() -> dict[str, Competitor]:
    """vLLM's top-k kernels live in its compiled _C extension."""
    reason = _import_error("vllm._C")
    return {VLLM_TOPK: reason or "not wired: vLLM's _C top-k ops are not called by this benchmark yet"}
