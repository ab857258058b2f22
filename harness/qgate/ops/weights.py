"""A checkpoint's routed weights, read tensor by tensor and sliced per TP rank the way vLLM 0.32 shards them.

`routed_weights(model_dir, tp, rank, dtype)` reads a Qwen4Exp model directory (config.json and
*.safetensors, `model.` or `model.language_model.` names) and returns one `Site` per routed projection
of the checkpoint: its vLLM module name (`model.layers.3.self_attn.qkv_proj`, what the plugin records
activations under), its role, its route and the tensors that route takes on that rank:

- fp16_gemv: the weight [N, K] per rank. Column-parallel layers take their rows of each packed part
  (qkv_proj: q_proj's Q + output-gate heads, k_proj / v_proj's KV heads, replicated to one a rank past
  their count, then the replicated indexer q/k projection; gate_up_proj: gate_proj's rows, then
  up_proj's; lm_head: its vocabulary rows); row-parallel layers (out_proj, o_proj, down_proj) take their
  columns; the router `gate` and `shared_expert_gate` are replicated.
- fused_gdn_input_fp16: in_proj_qkvz [q_r, k_r, v_r, z_r] from in_proj_qkv and in_proj_z, and
  in_proj_ba [b_r, a_r] (the flat layout, gqa_interleaved_layout=False).
- fused_hc_fp16: hc_norm [D], the merged down + inject [R + HC + pad, D] (the final mixer: down [R, D])
  and up [D, R], replicated.

Only the named routed tensors are read: the NVFP4 experts and everything else are never opened. A
missing tensor, a tensor of the wrong shape or a dtype the route does not take is a WeightsError
naming the tensor (one line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qgate.errors import QgateError
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


class WeightsError(QgateError):
    """A model directory whose routed tensors cannot be read as asked; str() is one line."""


@dataclass(frozen=True)
class Site:
    name: str  # the vLLM module name (the plugin records activations under it)
    role: str
    route: str
    tensors: tuple[Tensor, ...]  # what the route takes on this rank (see the module docstring)
    meta: dict[str, Any] = field(default_factory=dict)


class Checkpoint:
    """The safetensors files of a model directory; tensors opened one at a time, by name."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors import safe_open

        if not model_dir.is_dir():
            raise WeightsError(f"{model_dir}: not a directory")
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"{model_dir}: no *.safetensors file")
        cfg_path = model_dir / "config.json"
        if not cfg_path.is_file():
            raise WeightsError(f"{cfg_path}: missing")
        cfg = json.loads(cfg_path.read_text())
        self.config: dict[str, Any] = cfg.get("text_config", cfg)
        self.dir = model_dir
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    self._where[key] = f
        self._open = safe_open

    def name(self, vllm_name: str) -> str:
        """The checkpoint's name of a `model.` tensor (it may live under `model.language_model.`)."""
        alt = vllm_name.replace("model.", "model.language_model.", 1)
        return vllm_name if vllm_name in self._where or alt not in self._where else alt

    def has(self, vllm_name: str) -> bool:
        return self.name(vllm_name) in self._where

    def read(
        self, vllm_name: str, shape: tuple[int, ...], dtype: torch.dtype, take: Callable[[Any], Tensor]
    ) -> Tensor:
        """take(slice) of one tensor, after checking its full shape and dtype; WeightsError naming it."""
        name = self.name(vllm_name)
        if name not in self._where:
            raise WeightsError(f"{self.dir}: tensor {name} is missing")
        with self._open(str(self._where[name]), framework="pt") as fh:
            part = fh.get_slice(name)
            got_shape, got_dtype = tuple(part.get_shape()), part.get_dtype()
            if got_dtype not in _ST_DTYPES or _ST_DTYPES[got_dtype] not in (dtype, torch.float32):
                want = {v: k for k, v in _ST_DTYPES.items()}[dtype]
                raise WeightsError(f"tensor {name}: dtype {got_dtype}, the route takes {want}")
            if got_shape != shape:
                raise WeightsError(f"tensor {name}: shape {list(got_shape)}, expected {list(shape)}")
            return take(part).to(dtype).contiguous()


def _rows(rank: int, parts: int) -> Callable[[Any], Tensor]:
    def take(t: Any) -> Tensor:
        n = t.get_shape()[0] // parts
        return t[rank * n : (rank + 1) * n]

    return take


def _cols(rank: int, parts: int) -> Callable[[Any], Tensor]:
    def take(t: Any) -> Tensor:
        k = t.get_shape()[1] // parts
        return t[:, rank * k : (rank + 1) * k]

    return take


def _all(t: Any) -> Tensor:
    return t[:]


def _layer_types(cfg: dict[str, Any]) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        return list(types)
    every = int(cfg.get("full_attention_interval", 4))
    n = int(cfg["num_hidden_layers"])
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]


def routed_weights(
    ck: Checkpoint,
    tp: int,
    rank: int,
    dtype: str,
    routes: tuple[str, ...] = (ROUTE_GEMV, ROUTE_GDN, ROUTE_HC),
) -> list[Site]:
    """Every routed projection of the checkpoint on one TP rank (see the module docstring)."""
    cfg, dt = ck.config, DTYPES[dtype]
    h = int(cfg["hidden_size"])
    sites: list[Site] = []

    def read(name: str, shape: tuple[int, ...], take: Callable[[Any], Tensor] = _all) -> Tensor:
        return ck.read(name + ".weight", shape, dt, take)

    def gemv(name: str, role: str, *parts: Tensor) -> None:
        sites.append(Site(name, role, ROUTE_GEMV, (torch.cat(parts) if len(parts) > 1 else parts[0],)))

    for i, kind in enumerate(_layer_types(cfg)):
        p = f"model.layers.{i}"
        if kind == "linear_attention":
            nk, nv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
            dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
            a = f"{p}.linear_attn"
            if ROUTE_GDN in routes:
                qkv = 2 * nk * dk + nv * dv

                def qkv_part(start: int, size: int) -> Callable[[Any], Tensor]:
                    return lambda t: t[start + rank * size // tp : start + (rank + 1) * size // tp]

                q_, k_, v_ = (
                    read(f"{a}.in_proj_qkv", (qkv, h), qkv_part(off, size))
                    for off, size in ((0, nk * dk), (nk * dk, nk * dk), (2 * nk * dk, nv * dv))
                )
                z = read(f"{a}.in_proj_z", (nv * dv, h), _rows(rank, tp))
                b = read(f"{a}.in_proj_b", (nv, h), _rows(rank, tp))
                a_ = read(f"{a}.in_proj_a", (nv, h), _rows(rank, tp))
                heads = {"nk": nk // tp, "nv": nv // tp, "dk": dk, "dv": dv}
                sites.append(Site(f"{a}.in_proj_qkvz+in_proj_ba", "in_proj_qkvz+in_proj_ba", ROUTE_GDN,
                                  (torch.cat([q_, k_, v_, z]), torch.cat([b, a_])), heads))  # fmt: skip
            if ROUTE_GEMV in routes:
                gemv(f"{a}.out_proj", "out_proj", read(f"{a}.out_proj", (h, nv * dv), _cols(rank, tp)))
        elif ROUTE_GEMV in routes:
            a = f"{p}.self_attn"
            heads, kvh, hd = (
                int(cfg["num_attention_heads"]),
                int(cfg["num_key_value_heads"]),
                int(cfg["head_dim"]),
            )
            kv_rank = rank * kvh // tp if tp >= kvh else rank  # vLLM replicates KV heads past their count
            kv_parts = min(tp, kvh)
            q = read(f"{a}.q_proj", (2 * heads * hd, h), _rows(rank, tp))  # Q + output gate per head
            k = read(f"{a}.k_proj", (kvh * hd, h), _rows(kv_rank, kv_parts))
            v = read(f"{a}.v_proj", (kvh * hd, h), _rows(kv_rank, kv_parts))
            parts = [q, k, v]
            if cfg.get("indexer_n_heads"):  # QSA: vLLM packs the replicated indexer q/k into qkv_proj
                n_idx = (int(cfg["indexer_n_heads"]) + int(cfg["indexer_kv_heads"])) * int(
                    cfg["indexer_head_dim"]
                )
                parts.append(read(f"{a}.indexer.index_qk_proj", (n_idx, h)))
            gemv(f"{a}.qkv_proj", "qkv_proj", *parts)
            gemv(f"{a}.o_proj", "o_proj", read(f"{a}.o_proj", (h, heads * hd), _cols(rank, tp)))
        if ROUTE_GEMV in routes:
            m, inter, experts = (
                f"{p}.mlp",
                int(cfg["shared_expert_intermediate_size"]),
                int(cfg["num_experts"]),
            )
            gemv(f"{m}.gate", "gate", read(f"{m}.gate", (experts, h)))
            gemv(f"{m}.shared_expert_gate", "shared_expert_gate", read(f"{m}.shared_expert_gate", (1, h)))
            s = f"{m}.shared_expert"
            gate = read(f"{s}.gate_proj", (inter, h), _rows(rank, tp))
            up = read(f"{s}.up_proj", (inter, h), _rows(rank, tp))
            gemv(f"{s}.gate_up_proj", "gate_up_proj", gate, up)
            gemv(f"{s}.down_proj", "down_proj", read(f"{s}.down_proj", (h, inter), _cols(rank, tp)))
        if ROUTE_HC in routes:
            for where in ("attn_hyper_connection", "mlp_hyper_connection"):
                sites.append(_hc_site(ck, f"{p}.{where}", cfg, dt, use_combine=True))
    if ROUTE_HC in routes:
        sites.append(_hc_site(ck, "model.hyper_connection_mixer", cfg, dt, use_combine=False))
    if ROUTE_GEMV in routes:
        vocab = int(cfg["vocab_size"])
        gemv("lm_head", "lm_head", read("lm_head", (vocab, h), _rows(rank, tp)))
    return sites


def _hc_site(ck: Checkpoint, prefix: str, cfg: dict[str, Any], dt: torch.dtype, use_combine: bool) -> Site:
    from qgate_kernels import reference

    hc, rank_, d = (
        int(cfg["hc_count"]),
        int(cfg["hc_lowrank"]),
        int(cfg["hc_count"]) * int(cfg["hidden_size"]),
    )
    norm = ck.read(f"{prefix}.hc_norm.weight", (d,), dt, _all)
    down = ck.read(f"{prefix}.input_mix_weight_down.weight", (rank_, d), dt, _all)
    if use_combine:
        inject = ck.read(f"{prefix}.block_inject_weight.weight", (hc, d), dt, _all)
        pad = down.new_zeros((reference.hc_down_rows(rank_, hc, True) - rank_ - hc, d))
        down = torch.cat([down, inject, pad])  # [R + HC + pad, D], as vLLM merges them
    up = ck.read(f"{prefix}.input_mix_weight_up.weight", (d, rank_), dt, _all)
    role = "final" if not use_combine else ("moe" if prefix.endswith("mlp_hyper_connection") else "attn")
    meta = {"hc_count": hc, "lora_rank": rank_, "eps": float(cfg.get("rms_norm_eps", 1e-6))}
    return Site(prefix, role, ROUTE_HC, (norm, down, up), meta)
