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


# ---- a checkpoint vLLM's Qwen4Exp loads, at the production shapes --------------------------------------
ENGINE_EXPERTS = 16  # routed experts kept (of 512): >= the 10 a token uses; bf16, not NVFP4 (no route)
QSA_KEYS = (
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
)
ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}


def engine_config(layers: int, experts: int = ENGINE_EXPERTS, vocab: int | None = None) -> dict[str, Any]:
    """transformers' Qwen4ExpTextConfig keys for `layers` decoder layers at the published shapes (the
    model's own pattern: every 4th an indexed (QSA) attention layer, with its indexer), `experts` routed
    experts, the full vocabulary unless `vocab` cuts it. The RoPE's partial factor 0.25 (64 of 256 dims)
    is Qwen3-Next's: transformers requires the rotary dims to fit the 128-wide index head."""
    base = {k: v for k, v in MODEL_CONFIG.items() if not k.startswith("_") and k != "model_type"}
    every = int(base.pop("full_attention_interval"))
    types = ["indexed_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    if layers < every:  # a short model still gets one QSA layer, last
        types[-1] = "indexed_attention"
    return {
        **base,
        "num_hidden_layers": layers,
        "layer_types": types,
        "num_experts": experts,
        "vocab_size": vocab or base["vocab_size"],
        "rope_parameters": dict(ROPE),
        "tie_word_embeddings": False,
        "output_gate_type": "silu",
    }


def write_engine_checkpoint(
    path: Path,
    layers: int = 12,
    experts: int = ENGINE_EXPERTS,
    vocab: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str = "cpu",
    qsa: bool = True,
) -> Path:
    """A Qwen4ExpForCausalLM checkpoint that vLLM 0.32 loads and runs (unlike write_synthetic_checkpoint,
    which holds only the routed tensors for `run ops --real`): transformers' own classes and
    initialisation (as qgate.tiny.qwen4exp, built on `device`, "cuda" on a GPU runner: seconds instead
    of minutes), stored in `dtype` (bf16, as the NVFP4 export keeps its unquantized tensors), one
    safetensors file per decoder layer + one for the rest, with an index; the tiny Qwen3's tokenizer
    (2,048 tokens; the speed workload sends token ids and never detokenizes). Every routed projection
    is at its production shape; the routed experts are cut to `experts` and kept in `dtype`.

    qsa=False writes the attention layers without their QSA indexer (its weights dropped and its config
    keys None, as qgate.tiny.qwen4exp does), so vLLM builds plain gated attention there: vLLM 0.32's
    Qwen4Exp QSA refuses any dtype but bf16 ("Qwen4Exp QSA currently requires BF16", seen on the H200),
    so an fp16 engine at these shapes runs without it (and without the QSA top-k route)."""
    import json as _json

    from safetensors.torch import save_file
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    from qgate.tiny import qwen3 as tiny

    cfg = Qwen4ExpTextConfig(**engine_config(layers, experts, vocab))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in `dtype`: 48 layers need no fp32 copy on the device
    try:
        with torch.device(device):
            model = Qwen4ExpForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in model.state_dict().items():
        if not qsa and ".indexer." in name:
            continue
        parts = name.split(".")
        key = f"layer{int(parts[2]):03d}" if parts[1] == "layers" else "rest"
        shards.setdefault(key, {})[name] = t.detach().to(dtype).to("cpu").contiguous()
    del model
    weight_map: dict[str, str] = {}
    for i, key in enumerate(sorted(shards)):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shards[key], str(path / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shards[key], fname)
    total = sum(t.numel() * t.element_size() for s in shards.values() for t in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(_json.dumps(index, indent=1))
    tok = tiny.write_tokenizer_files(path)
    config = cfg.to_dict()
    config.pop("transformers_version", None)
    config |= {"architectures": ["Qwen4ExpForCausalLM"], "dtype": _ST[dtype]}
    if not qsa:
        config |= dict.fromkeys(QSA_KEYS)
    config |= {
        "eos_token_id": tok.token_to_id(tiny.ENDOFTEXT),
        "pad_token_id": tok.token_to_id(tiny.ENDOFTEXT),
    }
    (path / "config.json").write_text(_json.dumps(config, indent=1, sort_keys=True))
    return path
