"""A synthetic checkpoint at the production shapes, to exercise the real-weight reader and its TP slicing.

`write_synthetic_checkpoint(path)` writes config.json and model.safetensors for two decoder layers of
Qwen3.8-Flash-Next (one Gated-DeltaNet layer, one QSA attention layer) under the published tensor
names (`model.language_model.`), random fp16 weights: every routed projection keeps its production
shape (hidden 2560, GDN 16 / 48 heads of 128, attention 24 / 2 heads of 256 with the output gate, the
indexer's 4 + 1 heads of 128, shared expert 640, HC 4 x 2560 low rank 320); the experts (8, not 512)
and the vocabulary (4096, not 248,320) are cut down, and each layer carries one NVFP4-style expert
(uint8 packed weight + scale) that the reader must never open. About 280 MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from qgate.ops.shapes import MODEL_CONFIG

LAYER_TYPES = ["linear_attention", "full_attention"]
CUT = {"num_experts": 8, "vocab_size": 4096, "num_hidden_layers": 2}
_ST = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def synthetic_config(
    cfg: dict[str, Any] | None = None, layers: int = 2, vocab: int = 4096, dtype: torch.dtype = torch.float16
) -> dict[str, Any]:
    """The cut config: `layers` decoder layers (2: one GDN, one attention; more: the model's own
    pattern, every full_attention_interval-th an attention layer), `vocab` rows of lm_head."""
    base = {k: v for k, v in (cfg or MODEL_CONFIG).items() if not k.startswith("_")}
    every = int(base["full_attention_interval"])
    types = LAYER_TYPES if layers == 2 else [
        "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
    ]  # fmt: skip
    cut = {**CUT, "vocab_size": vocab, "num_hidden_layers": layers}
    return {**base, **cut, "layer_types": types, "torch_dtype": _ST[dtype]}


def write_synthetic_checkpoint(
    path: Path, seed: int = 0, layers: int = 2, vocab: int = 4096, dtype: torch.dtype = torch.float16
) -> Path:
    """Stored in `dtype` (bf16: as NVFP4 exports keep the unquantized tensors); one safetensors file,
    or one a layer past 2 layers (48 layers at the full vocabulary: about 8 GB in 16-bit)."""
    from safetensors.torch import save_file

    cfg = synthetic_config(layers=layers, vocab=vocab, dtype=dtype)
    types = cfg["layer_types"]
    gen = torch.Generator().manual_seed(seed)
    h, d = cfg["hidden_size"], cfg["hc_count"] * cfg["hidden_size"]
    rank, hc = cfg["hc_lowrank"], cfg["hc_count"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    heads, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    idx = (cfg["indexer_n_heads"] + cfg["indexer_kv_heads"]) * cfg["indexer_head_dim"]
    inter = cfg["shared_expert_intermediate_size"]
    m = "model.language_model"
    path.mkdir(parents=True, exist_ok=True)
    files: list[dict[str, tuple[int, ...]]] = [{"lm_head.weight": (cfg["vocab_size"], h)}]
    shapes = files[0]
    for i, kind in enumerate(types):
        if layers > 2:
            shapes = {}
            files.append(shapes)
        p = f"{m}.layers.{i}"
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            shapes |= {
                f"{a}.in_proj_qkv.weight": (2 * nk * dk + nv * dv, h),
                f"{a}.in_proj_z.weight": (nv * dv, h),
                f"{a}.in_proj_b.weight": (nv, h),
                f"{a}.in_proj_a.weight": (nv, h),
                f"{a}.out_proj.weight": (h, nv * dv),
            }
        else:
            a = f"{p}.self_attn"
            shapes |= {
                f"{a}.q_proj.weight": (2 * heads * hd, h),
                f"{a}.k_proj.weight": (kvh * hd, h),
                f"{a}.v_proj.weight": (kvh * hd, h),
                f"{a}.indexer.index_qk_proj.weight": (idx, h),
                f"{a}.o_proj.weight": (h, heads * hd),
            }
        shapes |= {
            f"{p}.mlp.gate.weight": (cfg["num_experts"], h),
            f"{p}.mlp.shared_expert_gate.weight": (1, h),
            f"{p}.mlp.shared_expert.gate_proj.weight": (inter, h),
            f"{p}.mlp.shared_expert.up_proj.weight": (inter, h),
            f"{p}.mlp.shared_expert.down_proj.weight": (h, inter),
        }
        for where in ("attn_hyper_connection", "mlp_hyper_connection"):
            shapes |= _hc(f"{p}.{where}", d, rank, hc, inject=True)
    files[0] |= _hc(f"{m}.hyper_connection_mixer", d, rank, hc, inject=False)
    for n, part in enumerate(files):
        tensors = {
            name: (torch.randn(*shape, generator=gen) * (0.1 if len(shape) == 1 else shape[-1] ** -0.5)).to(
                dtype
            )
            for name, shape in part.items()
        }
        for name in part:  # an NVFP4 expert a layer: packed e2m1 pairs + fp8 block scales (never read)
            if name.endswith("mlp.gate.weight"):
                e = name.removesuffix("mlp.gate.weight") + "mlp.experts.0"
                tensors[f"{e}.down_proj.weight"] = torch.randint(
                    0, 255, (h, inter // 2), generator=gen, dtype=torch.uint8
                )
                tensors[f"{e}.down_proj.weight_scale"] = torch.ones(h, inter // 16).to(torch.float8_e4m3fn)
        name = "model.safetensors" if len(files) == 1 else f"model-{n:05d}.safetensors"
        save_file(tensors, str(path / name))
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen4ExpForCausalLM"], **cfg}, indent=1))
    return path


def _hc(prefix: str, d: int, rank: int, hc: int, inject: bool) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {
        f"{prefix}.hc_norm.weight": (d,),
        f"{prefix}.input_mix_weight_down.weight": (rank, d),
        f"{prefix}.input_mix_weight_up.weight": (d, rank),
    }
    if inject:
        out[f"{prefix}.block_inject_weight.weight"] = (hc, d)
    return out
