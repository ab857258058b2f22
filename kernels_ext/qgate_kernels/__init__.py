"""qgate_kernels: the candidate decode routes that qgate gates (FP16 GEMV, Qwen4Exp GatedResidual
hyper-connection, fused Gated-DeltaNet input projection, QSA top-k block selection).

Importing this package loads torch and registers the qgate::* ops; it never imports vLLM (the
vLLM plugin lives in qgate_kernels.plugin and is loaded by vLLM through its entry point).
"""

from qgate_kernels.ops import (
    ROUTE_GDN,
    ROUTE_GEMV,
    ROUTE_HC,
    ROUTE_TOPK,
    ROUTES,
    build_info,
    cuda_kernels_available,
    fallback_counts,
    gdn_input,
    gemv,
    hc_combine_and_mix,
    hc_mix,
    qsa_topk,
    reset_fallback_counts,
)

__all__ = [
    "ROUTES",
    "ROUTE_GDN",
    "ROUTE_GEMV",
    "ROUTE_HC",
    "ROUTE_TOPK",
    "build_info",
    "cuda_kernels_available",
    "fallback_counts",
    "gdn_input",
    "gemv",
    "hc_combine_and_mix",
    "hc_mix",
    "qsa_topk",
    "reset_fallback_counts",
]
__version__ = "0.1.0"
