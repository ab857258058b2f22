"""Build a minimal `vllm` package tree in which vLLM's own Qwen4Exp CuTe and Triton kernels run
where vLLM cannot be installed (the H200 image): its files copied unmodified from a vLLM 0.32 source
or install (`models/qwen4_exp/nvidia/low_latency_gemm.py`, `model_executor/kernels/linear/cute_dsl/
skinny_gemm.py` and `_skinny_gemm.py`; the HC kernels `models/qwen4_exp/nvidia/ops/hc.py` and the
down projection `models/qwen4_exp/nvidia/ops/cute_dsl/hc_down_silu.py` with `_hc_down_silu_fma.py`
and `_hc_down_silu_mma.py`; the QSA indexer's ops `models/qwen4_exp/nvidia/ops/qsa_indexer.py`,
whose `expand_qsa_block_indices` consumes the top-k), and stand-ins for only the vllm modules they import
(envs.VLLM_BATCH_INVARIANT = False, triton_utils, current_platform's capability and PDL answer as
vLLM's CUDA platform gives them, current_stream, a no-op custom-op registration, empty layer base
classes). With that tree, the CUTLASS DSL and quack-kernels on PYTHONPATH,
`harness/qgate/ops/competitors.py` times vLLM's CuTe skinny GEMM with the plan vLLM picks for the
GPU and vLLM's GatedResidual kernel sequence (with its CuTe hc_down_silu). Prints the sha256 of each
copied file (one JSON object).

Usage: python kernels_ext/tools/vllm_stub_tree.py VLLM_PACKAGE_DIR DEST   (DEST/vllm is written)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

COPIED = [
    "models/qwen4_exp/nvidia/low_latency_gemm.py",
    "model_executor/kernels/linear/cute_dsl/skinny_gemm.py",
    "model_executor/kernels/linear/cute_dsl/_skinny_gemm.py",
    "models/qwen4_exp/nvidia/ops/cute_dsl/hc_down_silu.py",
    "models/qwen4_exp/nvidia/ops/cute_dsl/_hc_down_silu_fma.py",
    "models/qwen4_exp/nvidia/ops/cute_dsl/_hc_down_silu_mma.py",
    "models/qwen4_exp/nvidia/ops/hc.py",
    "models/qwen4_exp/nvidia/ops/qsa_indexer.py",
]

STUBS = {
    "envs.py": "VLLM_BATCH_INVARIANT = False\nVLLM_SPARSE_INDEXER_MAX_LOGITS_MB = 512\n",
    "model_executor/warmup/jit_warmup_triton_helper.py": "class TritonWarmupTensor:\n    pass\n",
    "triton_utils.py": 'import triton\nimport triton.language as tl\n\n__all__ = ["tl", "triton"]\n',
    "platforms/__init__.py": (
        "import torch\n\n\n"
        "class _Cuda:\n"
        "    def get_device_capability(self):\n"
        "        return tuple(torch.cuda.get_device_capability())\n\n"
        "    def is_arch_support_pdl(self):\n"
        "        return torch.cuda.get_device_capability()[0] >= 9\n\n"
        "    def has_device_capability(self, capability):\n"
        "        major, minor = torch.cuda.get_device_capability()\n"
        "        if isinstance(capability, tuple):\n"
        "            return (major, minor) >= capability\n"
        "        return major * 10 + minor >= capability\n\n"
        "    def is_device_capability_family(self, family):\n"
        "        return torch.cuda.get_device_capability()[0] * 10 == family\n\n\n"
        "current_platform = _Cuda()\n"
    ),
    "utils/torch_utils.py": (
        "import torch\n\n\n"
        "def current_stream():\n"
        "    return torch.cuda.current_stream()\n\n\n"
        "def direct_register_custom_op(*args, **kwargs):\n"
        "    return None\n"
    ),
    "model_executor/layers/linear.py": (
        "class LinearBase:\n    pass\n\n\nclass UnquantizedLinearMethod:\n    pass\n"
    ),
    "model_executor/layers/vocab_parallel_embedding.py": (
        "class ParallelLMHead:\n    pass\n\n\nclass UnquantizedEmbeddingMethod:\n    pass\n"
    ),
}


def main() -> None:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2]) / "vllm"
    hashes = {}
    for rel in COPIED:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, out)
        hashes[rel] = hashlib.sha256(out.read_bytes()).hexdigest()
    for rel, text in STUBS.items():
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    for d in [dest, *[p for p in dest.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch(exist_ok=True)
    print(json.dumps({"vllm_source": str(src), "sha256": hashes}, indent=1))


if __name__ == "__main__":
    main()
