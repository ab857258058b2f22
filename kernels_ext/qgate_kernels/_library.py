"""Where the qgate::* op schemas come from.

The schemas are declared once, in C++ (csrc/ops_def.cpp, TORCH_LIBRARY(qgate, m)). When the compiled
extension is missing (a pure-Python install, or a build without a C++ compiler) the same strings are
declared here instead, so the CPU reference ops still work; tests/kernels check that the C++
declarations and these strings agree whenever the extension is built.
"""

from __future__ import annotations

import torch

NAMESPACE = "qgate"

SCHEMAS: dict[str, str] = {
    "gemv": "gemv(Tensor weight, Tensor x, bool static_weight=False) -> Tensor",
    "hc_mix": (
        "hc_mix(Tensor h, Tensor norm_weight, Tensor w_down, Tensor w_up, int hc_count, int lora_rank, "
        "float eps) -> (Tensor, Tensor)"
    ),
    "hc_combine_mix": (
        "hc_combine_mix(Tensor h, Tensor block_output, Tensor? injection, Tensor norm_weight, Tensor w_down, "
        "Tensor w_up, int hc_count, int lora_rank, float eps) -> (Tensor, Tensor, Tensor)"
    ),
    "gdn_input": (
        "gdn_input(Tensor x, Tensor w_qkvz, Tensor w_ba, int num_k_heads, int num_v_heads, "
        "int head_k_dim, int head_v_dim, bool interleaved, bool static_weight=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)"
    ),
    "qsa_topk": "qsa_topk(Tensor logits, Tensor visible_blocks, int k, Tensor(a!) block_indices) -> ()",
}

_py_lib: torch.library.Library | None = None


def _load_extension() -> tuple[bool, bool, str]:
    """Import the compiled extension. Returns (loaded, has_cuda_kernels, why_not)."""
    try:
        from qgate_kernels import _C  # noqa: F401  (importing it runs the TORCH_LIBRARY registrations)
    except ImportError as exc:
        return False, False, f"{type(exc).__name__}: {exc}"
    return True, bool(getattr(_C, "WITH_CUDA", False)), ""


EXTENSION_LOADED, EXTENSION_HAS_CUDA, EXTENSION_ERROR = _load_extension()

if not EXTENSION_LOADED:
    # Kept alive for the life of the process: the definitions vanish with the Library object.
    _py_lib = torch.library.Library(NAMESPACE, "DEF")
    for _schema in SCHEMAS.values():
        _py_lib.define(_schema)
