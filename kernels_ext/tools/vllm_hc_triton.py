"""vLLM's own Triton HyperConnection kernels (vLLM 0.32, models/qwen4_exp/nvidia/ops/hc.py) against
the fused_hc_fp16 route on a GPU where vLLM itself cannot be installed (the H200 image).

The hc.py source is loaded as is, with three tiny stand-ins for the vLLM modules it imports
(current_platform.is_arch_support_pdl as vLLM's CUDA platform answers it, triton_utils = triton,
direct_register_custom_op = no-op: the kernels' Python wrappers are called directly). The sequence
around them is nvidia/hyperconnection.py's GatedResidual.mix / combine_and_mix. The down projection
is vLLM's as it picks it: in bf16 on sm_90 with the merged down + inject weight (every op here)
its CuTe-DSL hc_down_silu, imported from the stub tree of tools/vllm_stub_tree.py
(with the CUTLASS DSL on PYTHONPATH); elsewhere, or where it does not import (the record says why),
F.linear (cuBLAS) then _hc_silu.
Per output: elements bit-identical to vLLM's, max ULP at the output's magnitude; and both timed as
CUDA-graph replays over rotated inputs. One JSON object on stdout.

Usage: python kernels_ext/tools/vllm_hc_triton.py --src PATH/TO/vllm/models/qwen4_exp/nvidia/ops/hc.py
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import qgate_kernels
from qgate.ops.bench import _time_cuda
from qgate.ops.cases import MODEL_CONFIG
from qgate.ops.screen import ulp_distance
from qgate_kernels import reference


def load_vllm_hc(src: Path) -> types.ModuleType:
    import triton
    import triton.language as tl

    plat = types.SimpleNamespace(is_arch_support_pdl=lambda: torch.cuda.get_device_capability()[0] >= 9)
    stubs = {
        "vllm": types.ModuleType("vllm"),
        "vllm.platforms": types.SimpleNamespace(current_platform=plat),
        "vllm.triton_utils": types.SimpleNamespace(tl=tl, triton=triton),
        "vllm.utils": types.ModuleType("vllm.utils"),
        "vllm.utils.torch_utils": types.SimpleNamespace(direct_register_custom_op=lambda **_: None),
    }
    sys.modules.update(stubs)  # type: ignore[arg-type]
    mod = types.ModuleType("vllm_hc")
    mod.__file__ = str(src)
    exec(compile(src.read_text(), str(src), "exec"), mod.__dict__)  # noqa: S102  (vLLM's own source)
    return mod


def load_hc_down_silu() -> tuple[Callable[..., Any] | None, str]:
    """vLLM's CuTe hc_down_silu (before load_vllm_hc replaces the vllm modules), else why not."""
    try:
        from vllm.models.qwen4_exp.nvidia.ops.cute_dsl import _hc_down_silu_fma, _hc_down_silu_mma  # noqa: F401
        from vllm.models.qwen4_exp.nvidia.ops.cute_dsl.hc_down_silu import hc_down_silu
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
        why = f"{type(exc).__name__}: {str(exc)[:120]}"
        return None, f"cannot run: vLLM's CuTe hc_down_silu does not import ({why})"
    return hc_down_silu, "CuTe hc_down_silu (vLLM 0.32)"


def fused_down(down_silu: Callable[..., Any] | None, wd: torch.Tensor, rank: int) -> bool:
    """GatedResidual._down_and_inject's choice: the fused kernel with the merged down + inject weight,
    bf16, K % 8 == 0, sm_90+ (M = 1 <= MAX_FUSED_M)."""
    return (
        down_silu is not None
        and wd.shape[0] != rank
        and wd.dtype == torch.bfloat16
        and wd.shape[1] % 8 == 0
        and torch.cuda.get_device_capability() >= (9, 0)
    )


def vllm_sequence(
    hc_mod: types.ModuleType,
    args: tuple,
    op: str,
    hc: int,
    rank: int,
    eps: float,
    down_silu: Callable[..., Any] | None = None,
) -> tuple:
    """GatedResidual (nvidia) mix / combine_and_mix with vLLM's kernels; outputs as the route's."""
    h, o, inj, nw, wd, wu = args
    if op == "mix":
        xn = hc_mod._grouped_gemma_rmsnorm(h, nw, eps, hc)
        h_out = None
    else:
        h_out, xn = hc_mod._hc_combine_norm(h, o, None if op == "combine_unit" else inj, nw, eps, hc)
    if fused_down(down_silu, wd, rank):
        lora, injection = down_silu(xn, wd, rank, hc)  # type: ignore[misc]
    else:
        down = F.linear(xn, wd)
        lora = hc_mod._hc_silu(down[:, :rank], hc)
        injection = down[:, rank : rank + hc] if wd.shape[0] != rank else None
    block_input = hc_mod._hc_gate_mix(xn, F.linear(lora, wu), hc)
    outs = [h_out, block_input, injection]
    return tuple(t for t in outs if t is not None)


def route(args: tuple, op: str, hc: int, rank: int, eps: float) -> tuple:
    h, o, inj, nw, wd, wu = args
    kw = {"hc_count": hc, "lora_rank": rank, "eps": eps}
    if op == "mix":
        return qgate_kernels.hc_mix(h, nw, wd, wu, **kw)[1:]
    return tuple(
        t
        for t in qgate_kernels.hc_combine_and_mix(
            h, o, None if op == "combine_unit" else inj, nw, wd, wu, **kw
        )
        if t is not None
    )


def make(gen: torch.Generator, hc: int, hs: int, rank: int, dtype: torch.dtype) -> tuple:
    d = hc * hs
    rows = reference.hc_down_rows(rank, hc, True)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)

    return (
        rnd(1, d),
        rnd(1, hs),
        rnd(1, hc),
        rnd(d, scale=0.1),
        rnd(rows, d, scale=d**-0.5),
        rnd(d, rank, scale=rank**-0.5),
    )


def compare(
    hc_mod: types.ModuleType,
    dtype: torch.dtype,
    op: str,
    trials: int,
    gen: torch.Generator,
    hidden: int,
    down: tuple[Callable[..., Any] | None, str],
) -> dict[str, Any]:
    hc, rank, eps = (MODEL_CONFIG[k] for k in ("hc_count", "hc_lowrank", "rms_norm_eps"))
    hs = hidden
    names = (["h"] if op != "mix" else []) + ["block_input", "injection"]
    equal = dict.fromkeys(names, 0)
    total = dict.fromkeys(names, 0)
    worst = dict.fromkeys(names, 0.0)
    for _ in range(trials):
        args = make(gen, hc, hs, rank, dtype)
        mine, theirs = route(args, op, hc, rank, eps), vllm_sequence(hc_mod, args, op, hc, rank, eps, down[0])
        for name, a, b in zip(names, mine, theirs, strict=True):
            equal[name] += int((a.view(torch.int16) == b.view(torch.int16)).sum())
            total[name] += a.numel()
            worst[name] = max(worst[name], ulp_distance(a, b))
    sets = [make(gen, hc, hs, rank, dtype) for _ in range(24)]  # ~260 MB of weights: past the L2
    t_route = _time_cuda([lambda a=a: route(a, op, hc, rank, eps) for a in sets], 3, 30)
    theirs_fn = down[0]
    t_vllm = _time_cuda(
        [lambda a=a: vllm_sequence(hc_mod, a, op, hc, rank, eps, theirs_fn) for a in sets], 3, 30
    )
    med = lambda t: sorted(t)[len(t) // 2]  # noqa: E731
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "op": op,
        "hidden": hs,
        "bitwise": {n: f"{equal[n]}/{total[n]}" for n in names},
        "max_ulp": worst,
        "vllm_down_projection": down[1] if fused_down(down[0], sets[0][4], rank) else "F.linear (cuBLAS)",
        "route_us": med(t_route),
        "vllm_us": med(t_vllm),
        "speedup": med(t_vllm) / med(t_route),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="vLLM's models/qwen4_exp/nvidia/ops/hc.py")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--hidden", type=int, default=MODEL_CONFIG["hidden_size"], help="HC hidden (one stream)"
    )
    args = parser.parse_args()
    down = load_hc_down_silu()
    hc_mod = load_vllm_hc(args.src)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(14)
    results = [
        compare(hc_mod, dtype, op, args.trials, gen, args.hidden, down)
        for dtype in (torch.float16, torch.bfloat16)
        for op in ("mix", "combine_and_mix", "combine_unit")
    ]
    record = {"hc_down_silu": down[1], "fallbacks": qgate_kernels.fallback_counts(), "results": results}
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
