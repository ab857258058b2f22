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
VLLM_GDN = "vLLM GDN Part 1 (2 low-latency GEMMs + split)"


def _import_error(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
        return f"cannot run: {module} does not import here ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def vllm_linear(n: int, k: int, dtype: torch.dtype) -> Competitor:
    """What vLLM's Qwen4Exp runs for a batch-one linear of weight [n, k] on this GPU
    (`_qwen4_exp_low_latency_gemm` in models/qwen4_exp/nvidia/low_latency_gemm.py, installed by
    enable_qwen4_exp_low_latency_gemm on every unquantized Linear and the lm_head whose (N, K) its
    plan table for this arch names, bf16 only): fn(w, x [1, k]) -> [1, n] on its CuTe skinny GEMM, or
    the reason it runs F.linear (cuBLAS) instead."""
    module = "vllm.models.qwen4_exp.nvidia.low_latency_gemm"
    reason = _import_error(module)
    if reason is not None:
        return reason
    import importlib

    llg = importlib.import_module(module)
    if not torch.cuda.is_available():
        return "cannot run: no CUDA device"
    cap = torch.cuda.get_device_capability()
    plan = llg.QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY.get(cap, {}).get((n, k), {}).get(1)
    if plan is None:
        arch = f"sm_{cap[0]}{cap[1]}"
        return f"vLLM runs F.linear (cuBLAS, the baseline) at ({n}, {k}) on {arch}: no plan"
    if dtype != torch.bfloat16:
        return "vLLM's skinny GEMM takes bf16 only (F.linear otherwise: the baseline)"
    if not llg.shape_dynamic_skinny_gemm.is_available():
        return "cannot run: the CUTLASS DSL (nvidia-cutlass-dsl) is not installed"
    gemm = llg.shape_dynamic_skinny_gemm
    return lambda w, x: gemm(x.view(1, -1), w, plan)


def gemv_competitors(n: int, k: int, dtype: torch.dtype) -> dict[str, Competitor]:
    """vLLM's batch-one linear for Qwen4Exp (vllm_linear): its CuTe skinny GEMM where its plan for
    this arch names the (N, K) shape (bf16 only), else F.linear, i.e. cuBLAS, which the case's
    baseline times."""
    return {VLLM_GEMM: vllm_linear(n, k, dtype)}


def gdn_competitors(shape: dict[str, Any], args: tuple[Any, ...]) -> dict[str, Competitor]:
    """vLLM's GDN Part 1 (`forward_cuda` in model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py):
    in_proj_qkvz and in_proj_ba as two linears, each on vLLM's Qwen4Exp low-latency GEMM where its
    plan names the shape (both TP=4 shapes are in the SM90 table), then the flat layout's split
    (mixed_qkv, z) and split_ba's chunk + .contiguous() of b and a. Only the flat layout (Qwen3.5's,
    and Qwen4Exp's) is modelled; the case's baseline is the same with F.linear."""
    x, w_qkvz, w_ba = args
    if shape.get("layout", "flat") != "flat":
        return {}
    lin_qkvz = vllm_linear(int(w_qkvz.shape[0]), int(w_qkvz.shape[1]), w_qkvz.dtype)
    lin_ba = vllm_linear(int(w_ba.shape[0]), int(w_ba.shape[1]), w_ba.dtype)
    for lin in (lin_qkvz, lin_ba):
        if isinstance(lin, str):
            return {VLLM_GDN: lin}
    nk, nv, dk, dv = (int(shape[key]) for key in ("nk", "nv", "dk", "dv"))
    assert not isinstance(lin_qkvz, str) and not isinstance(lin_ba, str)

    def run(x: Any, wq: Any, wb: Any) -> tuple[Any, ...]:
        x2 = x.view(1, -1)  # [1, hidden]
        mixed, z = lin_qkvz(wq, x2).split([2 * nk * dk + nv * dv, nv * dv], dim=-1)
        b, a = lin_ba(wb, x2).chunk(2, dim=-1)
        return mixed, z.reshape(1, -1, dv), b.contiguous(), a.contiguous()

    return {VLLM_GDN: run}


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

    # The final mixer's down projection is a ReplicatedLinear [rank, D]: vLLM's low-latency GEMM
    # where its plan names the shape (320 x 10240 is in the SM90 table), in bf16; else F.linear.
    down_linear: Any = None
    if not use_combine:
        found = vllm_linear(int(wd.shape[0]), int(wd.shape[1]), wd.dtype)
        if not isinstance(found, str):
            down_linear = found
        elif found.startswith("cannot run") and wd.dtype == torch.bfloat16:
            why = f"the final mixer's down projection is vLLM's CuTe GEMM here ({found})"
            return {VLLM_HC: f"cannot run: {why}"}

    def run(h: Any, o: Any, inj: Any, nw: Any, wd: Any, wu: Any) -> tuple[Any, ...]:
        if op == "mix":
            h_out, xn = None, hc_ops._grouped_gemma_rmsnorm(h, nw, eps, hc)
        else:
            h_out, xn = hc_ops._hc_combine_norm(h, o, inj, nw, eps, hc)
        if down_silu is not None:
            lora, injection = down_silu(xn, wd, rank, hc)
        else:
            down = torch.nn.functional.linear(xn, wd) if down_linear is None else down_linear(wd, xn)
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
    down_name = "CuTe skinny GEMM down" if down_linear is not None else down_name
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
