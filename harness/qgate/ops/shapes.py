"""The production model's per-GPU operator shapes, derived from one config file.

`qwen4_exp_config.json` holds the published Qwen3.8-Flash-Next `config.json` keys the shapes need
(hidden 2560, HC 4 x 2560 low rank 320, GDN 16 key / 48 value heads of 128, attention 24 heads / 2 KV
heads of 256 with the output gate packed next to Q, indexer 4 heads + 1 KV head of 128, 512 experts,
shared expert 640 wide, vocabulary 248,320). `projections(cfg, tp)` lists every unquantized decode
projection of one decoder layer of each kind (and the lm_head) as vLLM 0.32 shards it at tensor
parallel size `tp`: its role (the last name of the vLLM module, `Qwen4ExpForCausalLM`), its per-GPU
weight [N, K], which route takes it and how vLLM splits it over the ranks. tests/kernels/test_ops_shapes.py
checks the TP=4 list against vLLM's `QWEN4_EXP_SM90_GEMM_PLANS` (tuned on the H200 for this model at
TP=4), so a drift of either shows.

Sharding (vLLM's linear layers): column-parallel layers split N (QKV: the Q/gate heads split, the 2 KV
heads of 256 replicated once tp > 2; the merged gate_up: each half split), row-parallel layers split
K; replicated layers (router, shared-expert gate, the indexer's q/k projection packed into qkv_proj,
every HyperConnection projection) keep the full weight on every GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC

# Package data (pyproject.toml ships ops/*.json): read as a resource, so an installed wheel has it too.
MODEL_CONFIG: dict[str, Any] = json.loads(files("qgate.ops").joinpath("qwen4_exp_config.json").read_text())
TP_SIZES = (4, 1)  # the production deployment first, then one GPU

# The GEMV route's default roles (vLLM module names): the unquantized decode projections outside the
# GDN-input and HC routes. The routed experts are NVFP4 (no route); the indexer's q/k projection is
# packed into qkv_proj (Qwen4ExpQSAQKVIndexerLinear), so it is no module of its own at decode.
GEMV_DEFAULT_ROLES = (
    "out_proj",  # GDN output (row-parallel)
    "qkv_proj",  # QSA q + output gate, k, v, + the replicated indexer q/k
    "o_proj",  # QSA output (row-parallel)
    "gate_up_proj",  # shared expert gate/up
    "down_proj",  # shared expert down (row-parallel)
    "gate",  # the MoE router (replicated)
    "shared_expert_gate",  # the shared expert's scalar gate (replicated, N = 1)
    "lm_head",
)


@dataclass(frozen=True)
class Projection:
    role: str  # the last name of the vLLM module (what a contract's routes.<route>.roles lists)
    module: str  # where it sits in a decoder layer (or the model), for the reader and the docs
    route: str  # the route that takes it
    n: int  # per-GPU output rows of the weight [n, k]
    k: int
    split: str  # "column" (N split over the ranks), "row" (K split) or "replicated"


def _div(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ValueError(f"{what} = {total} does not divide over tp {tp}")
    return total // tp


def qkv_rows(cfg: dict[str, Any], tp: int) -> int:
    """Per-GPU rows of the QSA qkv_proj: Q and its output gate (heads split), K and V (KV heads split,
    replicated to one a GPU past their count), then the replicated indexer Q (n heads) and K (kv heads)."""
    hd = cfg["head_dim"]
    q = 2 * _div(cfg["num_attention_heads"], tp, "num_attention_heads") * hd
    kv = 2 * max(1, cfg["num_key_value_heads"] // tp) * hd
    indexer = (cfg["indexer_n_heads"] + cfg["indexer_kv_heads"]) * cfg["indexer_head_dim"]
    return q + kv + indexer


def projections(cfg: dict[str, Any], tp: int) -> list[Projection]:
    """Every unquantized decode projection of the model at tensor parallel size tp, per GPU."""
    h = cfg["hidden_size"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    attn = cfg["num_attention_heads"] * cfg["head_dim"]
    shared = cfg["shared_expert_intermediate_size"]
    d, rank = cfg["hc_count"] * h, cfg["hc_lowrank"]
    qkvz = _div(2 * nk * dk + 2 * nv * dv, tp, "GDN q/k/v/z rows")
    ba = _div(2 * nv, tp, "GDN b/a rows")
    gdn_v = _div(nv * dv, tp, "GDN value dim")
    attn_k = _div(attn, tp, "attention dim")
    up, down = _div(2 * shared, tp, "shared expert"), _div(shared, tp, "shared expert")
    vocab = _div(cfg["vocab_size"], tp, "vocab_size")
    gdn, qsa, mlp, shx = "linear_attn.", "self_attn.", "mlp.", "mlp.shared_expert."
    col, row, rep = "column", "row", "replicated"
    return [
        Projection("in_proj_qkvz", gdn + "in_proj_qkvz", ROUTE_GDN, qkvz, h, col),
        Projection("in_proj_ba", gdn + "in_proj_ba", ROUTE_GDN, ba, h, col),
        Projection("out_proj", gdn + "out_proj", ROUTE_GEMV, h, gdn_v, row),
        Projection("qkv_proj", qsa + "qkv_proj", ROUTE_GEMV, qkv_rows(cfg, tp), h, col),
        Projection("o_proj", qsa + "o_proj", ROUTE_GEMV, h, attn_k, row),
        Projection("gate_up_proj", shx + "gate_up_proj", ROUTE_GEMV, up, h, col),
        Projection("down_proj", shx + "down_proj", ROUTE_GEMV, h, down, row),
        Projection("gate", mlp + "gate", ROUTE_GEMV, cfg["num_experts"], h, rep),
        Projection("shared_expert_gate", mlp + "shared_expert_gate", ROUTE_GEMV, 1, h, rep),
        Projection("lm_head", "lm_head", ROUTE_GEMV, vocab, h, col),
        # HyperConnection (replicated): the final mixer's down projection [R, D] (the per-block merged
        # down + inject is [R + HC + pad, D]: vLLM's hc_down_silu "K=10240, N=324" before the pad), up [D, R].
        Projection(
            "input_mix_weight_down", "hyper_connection_mixer.input_mix_weight_down", ROUTE_HC, rank, d, rep
        ),
        Projection(
            "input_mix_weight_up", "hyper_connection_mixer.input_mix_weight_up", ROUTE_HC, d, rank, rep
        ),
    ]


def calls_a_step(cfg: dict[str, Any]) -> dict[str, int]:
    """Calls of one decode step per linear role of `projections` (HC's aside: two modules a layer and a
    final mixer, counted by their callers): the GDN roles once in every GDN layer, qkv_proj and o_proj
    in every attention layer (every full_attention_interval-th), the router and the shared expert's in
    every layer, one lm_head."""
    layers = int(cfg["num_hidden_layers"])
    attn = layers // int(cfg["full_attention_interval"])
    gdn = layers - attn
    return {
        "in_proj_qkvz": gdn,
        "in_proj_ba": gdn,
        "out_proj": gdn,
        "qkv_proj": attn,
        "o_proj": attn,
        "gate_up_proj": layers,
        "down_proj": layers,
        "gate": layers,
        "shared_expert_gate": layers,
        "lm_head": 1,
    }


def _unique(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in pairs:
        if p not in out:
            out.append(p)
    return out


def default_shapes(cfg: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The screen's and benchmark's default shapes: TP=4 first, then TP=1, without repeats."""
    h, hc, rank = cfg["hidden_size"], cfg["hc_count"], cfg["hc_lowrank"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    gemv = [
        {"n": p.n, "k": p.k}
        for tp in TP_SIZES
        for p in projections(cfg, tp)
        if p.role in GEMV_DEFAULT_ROLES or p.role == "input_mix_weight_down"  # GEMV while HC is off
    ]
    hc_shapes = [
        {"hc_count": hc, "hidden": h, "lora_rank": rank, "dtype": dt, "op": op}
        for dt in ("fp16", "bf16")
        for op in ("mix", "combine_and_mix", "final")
    ]
    gdn = [
        {
            "hidden": h,
            "num_k_heads": nk // tp,
            "num_v_heads": nv // tp,
            "head_k_dim": cfg["linear_key_head_dim"],
            "head_v_dim": cfg["linear_value_head_dim"],
            "layout": "flat",
            "dtype": dt,
        }
        for tp in TP_SIZES
        for dt in ("fp16", "bf16")
    ]
    gdn.append({**gdn[0], "layout": "interleaved"})  # Qwen3-Next's layout, kept
    k, blocks = topk_k_and_blocks(cfg)
    topk = [
        {"rows": 1, "length": blocks, "k": k},  # one decode row, the whole context visible (timed)
        {"rows": 4, "length": blocks, "k": k},  # rows past row 0 see a random part of it
        {"rows": 2, "length": blocks // 4, "k": k},  # a shorter context
    ]
    return {ROUTE_GEMV: _unique(gemv), ROUTE_HC: hc_shapes, ROUTE_GDN: gdn, "qsa_topk": topk}


def topk_k_and_blocks(cfg: dict[str, Any]) -> tuple[int, int]:
    """QSA's block top-k: k = indexer_budget / compress_ratio blocks out of at most
    max_position_embeddings / compress_ratio (2048 / 4 = 512 of 262,144 / 4 = 65,536)."""
    ratio = cfg["indexer_compress_ratio"]
    return cfg["indexer_budget"] // ratio, cfg["max_position_embeddings"] // ratio


DEFAULT_SHAPES: dict[str, list[dict[str, Any]]] = default_shapes(MODEL_CONFIG)
