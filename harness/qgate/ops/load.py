"""A routed tensor as vLLM 0.32's loader hands it to the layer: the stored dtype cast to the engine's.

vLLM builds every parameter of Qwen4Exp in the model dtype (`engine.dtype`), except the HyperConnection
ones: `qwen4_exp/nvidia/model.py` builds each `GatedResidual` from `HyperConnectionConfig(params_dtype=
torch.bfloat16, ...)` (hc_norm, the merged down + inject, the final mixer's down, up), whatever the
model dtype. qgate's `qwen4exp_fp16_cpu` shim (contract `shims:`, the CPU platform only) gives them the
model dtype instead (qgate_kernels/shims.py). The weight loaders (`default_weight_loader` and the
parallel linear layers' `weight_loader`) then `param.data.copy_(loaded_weight)`: torch's cast, round to
nearest even, so a stored bf16 / fp32 value above fp16's 65504 becomes inf and one below half of fp16's
smallest subnormal (2^-25) becomes zero. `cast_like_vllm` does exactly that copy and counts what it
did; nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qgate_route_env import SHIM_FP16_CPU, SHIM_HC_PARAMS_FP16

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}


@dataclass(frozen=True)
class Cast:
    """What the cast of one stored slice did (counts over that slice; index in the full tensor)."""

    stored: str  # the safetensors dtype (F16, BF16, F32)
    engine: str  # the dtype the engine holds it in
    elements: int
    nan_stored: int  # NaN already in the checkpoint
    inf_stored: int  # +-inf already in the checkpoint
    overflow_to_inf: int  # finite stored values that the cast made +-inf
    flushed_to_zero: int  # non-zero stored values that the cast made zero
    first_bad: tuple[int, ...] | None  # index of the first non-finite value after the cast

    @property
    def non_finite(self) -> int:
        return self.nan_stored + self.inf_stored + self.overflow_to_inf


def cast_like_vllm(stored: Tensor, dtype: torch.dtype, offset: tuple[int, ...] = ()) -> tuple[Tensor, Cast]:
    """stored (a slice as read) -> (the engine's tensor, contiguous, in dtype; what the cast did).
    `offset`: where the slice starts in the full tensor, per dimension (for first_bad)."""
    out = torch.empty(stored.shape, dtype=dtype)
    out.copy_(stored)  # the loader's copy_: round to nearest even
    n = stored.numel()
    bad = n - int(torch.count_nonzero(torch.isfinite(out)))  # count_nonzero: bool .sum() is slow
    nan_s = inf_s = overflow = 0
    first = None
    if bad:  # rare: the detail only then
        nan_s = int(torch.count_nonzero(torch.isnan(stored)))
        inf_s = int(torch.count_nonzero(torch.isinf(stored)))
        overflow = bad - nan_s - inf_s
        idx = [int(i) for i in torch.nonzero(~torch.isfinite(out))[0]]
        first = tuple(i + (offset[d] if d < len(offset) else 0) for d, i in enumerate(idx))
    # a stored zero stays zero (and a NaN stays non-zero), so new zeros are the flushed values
    flushed = 0 if stored.dtype == dtype else int(torch.count_nonzero(stored)) - int(torch.count_nonzero(out))
    return out, Cast(
        stored=NAMES.get(stored.dtype, str(stored.dtype)),
        engine=NAMES[dtype],
        elements=n,
        nan_stored=nan_s,
        inf_stored=inf_s,
        overflow_to_inf=overflow,
        flushed_to_zero=flushed,
        first_bad=first,
    )


def hc_params_dtype(engine_dtype: str, shims: tuple[str, ...], device: str) -> str:
    """The dtype vLLM gives the HyperConnection parameters: bf16 (hard-coded in qwen4_exp/nvidia), or
    the model dtype where a shim makes it so: `qwen4exp_fp16_cpu` on the CPU platform, or
    `qwen4exp_hc_params_fp16` on any (the fp16 production-shape contracts on CUDA: the fp16 HC route
    runs there, 297,402 hits on an H100 on 2026-12-06, while this rule, missing the shim, told the
    screen it did not and left it unscreened)."""
    if engine_dtype == "fp16" and (
        SHIM_HC_PARAMS_FP16 in shims or (SHIM_FP16_CPU in shims and device == "cpu")
    ):
        return "fp16"
    return "bf16"
