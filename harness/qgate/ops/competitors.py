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


def hc_competitors(shape: dict[str, Any], args: tuple[Any, ...]) -> dict[str, Competitor]:
    """vLLM's GatedResidual (models/qwen4_exp/nvidia/hyperconnection.py) mix / combine_and_mix as
    the sequence of its own kernels (nvidia/ops/hc.py: Triton norm or combine-norm, _hc_silu, gate
    mix; cuBLAS up) with the down projection `_down_and_inject` picks: the CuTe hc_down_silu for the
    merged down + inject weight in bf16 on sm_90, else F.linear + _hc_silu. The module itself needs
    vLLM's layers; its kernels import from vLLM or from the stub tree of
    kernels_ext/tools/vllm_stub_tree.py. One call on the case's first set checks that it runs."""
    import importlib

    try:
        hc_ops = importlib.import_module("vllm.models.qwen4_exp.nvidia.ops.hc")
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
        why = f"{type(exc).__name__}: {str(exc)[:120]}"
        return {VLLM_HC: f"cannot run: vLLM's HC kernels (nvidia/ops/hc.py) do not import here ({why})"}
    from qgate.ops.cases import MODEL_CONFIG

    hc, rank, op = int(shape["hc_count"]), int(shape["lora_rank"]), str(shape["op"])
    eps = float(MODEL_CONFIG["rms_norm_eps"])
    wd = args[4]
    use_combine = op != "final"  # the merged down + inject weight
    fused = use_combine and wd.dtype == torch.bfloat16 and wd.shape[1] % 8 == 0
    fused = fused and torch.cuda.get_device_capability(wd.device) >= (9, 0)
    down_silu = None
    if fused:
        try:
            module = "vllm.models.qwen4_exp.nvidia.ops.cute_dsl.hc_down_silu"
            down_silu = importlib.import_module(module).hc_down_silu
        except Exception as exc:  # noqa: BLE001
            why = f"{type(exc).__name__}: {str(exc)[:120]}"
            return {
                VLLM_HC: f"cannot run: vLLM's CuTe hc_down_silu (what vLLM runs here) does not import ({why})"
            }

    def run(h: Any, o: Any, inj: Any, nw: Any, wd: Any, wu: Any) -> tuple[Any, ...]:
        if op == "mix":
            h_out, xn = None, hc_ops._grouped_gemma_rmsnorm(h, nw, eps, hc)
        else:
            h_out, xn = hc_ops._hc_combine_norm(h, o, inj, nw, eps, hc)
        if down_silu is not None:
            lora, injection = down_silu(xn, wd, rank, hc)
        else:
            down = torch.nn.functional.linear(xn, wd)
            lora = hc_ops._hc_silu(down[:, :rank], hc)
            injection = down[:, rank : rank + hc] if use_combine else None
        block_input = hc_ops._hc_gate_mix(xn, torch.nn.functional.linear(lora, wu), hc)
        return tuple(t for t in (h_out, block_input, injection) if t is not None)

    try:
        run(*args)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a path that fails here cannot be timed
        return {VLLM_HC: f"cannot run: vLLM's HC sequence failed ({type(exc).__name__}: {str(exc)[:120]})"}
    down_name = "CuTe hc_down_silu" if down_silu is not None else "cuBLAS down"
    return {f"vLLM GatedResidual (Triton + {down_name})": run}


def topk_competitors(logits: torch.Tensor, visible: torch.Tensor, k: int) -> dict[str, Competitor]:
    """vLLM's QSA top-k as its Qwen4Exp indexer calls it (`_topk` in models/qwen4_exp/nvidia/ops/
    qsa_indexer.py): torch.ops._C.cooperative_topk for <= 64 rows with a row stride divisible by 4
    on sm_90+ other than sm_12x, else torch.ops._C.persistent_topk; a 1 MiB uint8 workspace and
    max_seq_len = the row width, as there. The ops come from vLLM's compiled _C, or, where vLLM is
    not installed, from the stand-in kernels_ext/tools/vllm_topk_build.py builds from vLLM's csrc."""
    reason = _import_error("vllm._C")
    if reason is not None:
        return {VLLM_TOPK: reason}
    import importlib

    c_mod = importlib.import_module("vllm._C")
    cap = torch.cuda.get_device_capability(logits.device)
    rows = int(logits.shape[0])
    coop = rows <= 64 and logits.stride(0) % 4 == 0 and cap >= (9, 0) and cap[0] != 12
    name = "cooperative_topk" if coop else "persistent_topk"
    if k not in (512, 1024, 2048):
        return {VLLM_TOPK: f"vLLM's {name} takes k 512, 1024 or 2048, not {k}"}
    try:
        op = getattr(torch.ops._C, name)
    except (AttributeError, RuntimeError):
        return {VLLM_TOPK: f"cannot run: torch.ops._C.{name} (what vLLM runs here) is not registered"}
    source = getattr(c_mod, "SOURCE_SHA256", None)
    label = f"vLLM {name}" + (" (0.32 csrc built standalone)" if source else "")
    workspace = torch.empty(1 << 20, dtype=torch.uint8, device=logits.device)  # vLLM's _TOPK_WORKSPACE_BYTES
    out = torch.empty(rows, k, dtype=torch.int32, device=logits.device)  # [rows, k]

    def run(s: torch.Tensor, vis: torch.Tensor, kk: int) -> torch.Tensor:
        op(s, vis, out, workspace, kk, s.shape[1])
        return out

    return {label: run}
