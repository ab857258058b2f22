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

Only the named routed tensors are read: the NVFP4 experts and everything else are never opened. Each
slice is cast to the dtype the engine holds it in as vLLM's loader casts it (qgate.ops.load: the
engine dtype; the HC parameters bf16 unless the fp16 CPU shim applies), and what the cast did is kept
per tensor (`Checkpoint.casts()`: stored dtype, NaN / inf already there, overflow to inf, non-zero
values flushed to zero, the first non-finite index). A missing tensor, a tensor of the wrong shape or
a stored dtype that is not F16, BF16 or F32 (a quantized tensor) is a WeightsError naming the tensor
(one line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qgate.errors import QgateError
from qgate.ops.load import DTYPES, Cast, cast_like_vllm
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC

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


QWEN4EXP = "Qwen4ExpForCausalLM"


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
        # the sites below are Qwen4Exp's (vLLM's qwen4_exp model code): any other model has other names
        archs = cfg.get("architectures") or self.config.get("architectures") or []
        if QWEN4EXP not in archs:
            raise WeightsError(
                f"{cfg_path}: architectures {archs}: the real-weight screen reads {QWEN4EXP} checkpoints only"
            )
        self.dir = model_dir
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    self._where[key] = f
        self._open = safe_open
        self._casts: dict[tuple[str, Any], Cast] = {}  # (tensor, slice) -> what its cast did

    def casts(self) -> list[dict[str, Any]]:
        """Per tensor read so far (each distinct slice counted once): stored and engine dtype, element
        counts of NaN / inf stored, overflow to inf, flushed to zero, the first non-finite index."""
        out: dict[str, dict[str, Any]] = {}
        for (name, _), c in sorted(self._casts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            row = out.setdefault(
                name,
                {"tensor": name, "stored": c.stored, "engine": c.engine, "elements": 0, "nan_stored": 0,
                 "inf_stored": 0, "overflow_to_inf": 0, "flushed_to_zero": 0, "first_bad": None},
            )  # fmt: skip
            for key in ("elements", "nan_stored", "inf_stored", "overflow_to_inf", "flushed_to_zero"):
                row[key] += getattr(c, key)
            if row["first_bad"] is None and c.first_bad is not None:
                row["first_bad"] = list(c.first_bad)
        return list(out.values())

    def name(self, vllm_name: str) -> str:
        """The checkpoint's name of a `model.` tensor (it may live under `model.language_model.`)."""
        alt = vllm_name.replace("model.", "model.language_model.", 1)
        return vllm_name if vllm_name in self._where or alt not in self._where else alt

    def has(self, vllm_name: str) -> bool:
        return self.name(vllm_name) in self._where

    def read(
        self, vllm_name: str, shape: tuple[int, ...], dtype: torch.dtype, take: Take | None = None
    ) -> Tensor:
        """The slice `take` of one tensor, after checking its full shape and stored dtype, cast to dtype
        as vLLM's loader casts it (the cast's counts kept: casts()); WeightsError naming the tensor."""
        take = take or Take()
        name = self.name(vllm_name)
        if name not in self._where:
            raise WeightsError(f"{self.dir}: tensor {name} is missing")
        with self._open(str(self._where[name]), framework="pt") as fh:
            part = fh.get_slice(name)
            got_shape, got_dtype = tuple(part.get_shape()), part.get_dtype()
            if got_dtype not in _ST_DTYPES:
                raise WeightsError(
                    f"tensor {name}: dtype {got_dtype}, the routes read F16, BF16 or F32 (quantized?)"
                )
            if got_shape != shape:
                raise WeightsError(f"tensor {name}: shape {list(got_shape)}, expected {list(shape)}")
            out, cast = cast_like_vllm(take(part), dtype, take.offset(len(shape)))
        self._casts[(name, take.key())] = cast
        return out


@dataclass(frozen=True)
class Take:
    """Rows [start, stop) (dim 0), columns (dim 1) or, dim None, all of a tensor slice."""

    dim: int | None = None
    start: int = 0
    stop: int = 0

    def __call__(self, t: Any) -> Tensor:
        if self.dim is None:
            return t[:]
        return t[self.start : self.stop] if self.dim == 0 else t[:, self.start : self.stop]

    def offset(self, ndim: int) -> tuple[int, ...]:
        return tuple(self.start if d == self.dim else 0 for d in range(ndim))

    def key(self) -> tuple[int | None, int, int]:
        return (self.dim, self.start, self.stop)


def _rows(rank: int, parts: int, total: int, start: int = 0) -> Take:
    n = total // parts
    return Take(0, start + rank * n, start + (rank + 1) * n)


def _cols(rank: int, parts: int, total: int) -> Take:
    k = total // parts
    return Take(1, rank * k, (rank + 1) * k)


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
    hc_dtype: str | None = None,
) -> list[Site]:
    """Every routed projection of the checkpoint on one TP rank (see the module docstring), in the
    engine dtype `dtype`; the HC parameters in `hc_dtype` (default: dtype; vLLM's rule: load.py)."""
    cfg, dt = ck.config, DTYPES[dtype]
    hc_dt = DTYPES[hc_dtype or dtype]
    h = int(cfg["hidden_size"])
    sites: list[Site] = []

    def read(name: str, shape: tuple[int, ...], take: Take | None = None) -> Tensor:
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

                q_, k_, v_ = (
                    read(f"{a}.in_proj_qkv", (qkv, h), _rows(rank, tp, size, off))
                    for off, size in ((0, nk * dk), (nk * dk, nk * dk), (2 * nk * dk, nv * dv))
                )
                z = read(f"{a}.in_proj_z", (nv * dv, h), _rows(rank, tp, nv * dv))
                b = read(f"{a}.in_proj_b", (nv, h), _rows(rank, tp, nv))
                a_ = read(f"{a}.in_proj_a", (nv, h), _rows(rank, tp, nv))
                gdn_heads = {"nk": nk // tp, "nv": nv // tp, "dk": dk, "dv": dv}
                sites.append(Site(f"{a}.in_proj_qkvz+in_proj_ba", "in_proj_qkvz+in_proj_ba", ROUTE_GDN,
                                  (torch.cat([q_, k_, v_, z]), torch.cat([b, a_])), gdn_heads))  # fmt: skip
            if ROUTE_GEMV in routes:
                out = read(f"{a}.out_proj", (h, nv * dv), _cols(rank, tp, nv * dv))
                gemv(f"{a}.out_proj", "out_proj", out)
        elif ROUTE_GEMV in routes:
            a = f"{p}.self_attn"
            heads, kvh, hd = (
                int(cfg["num_attention_heads"]),
                int(cfg["num_key_value_heads"]),
                int(cfg["head_dim"]),
            )
            kv_rank = rank * kvh // tp if tp >= kvh else rank  # vLLM replicates KV heads past their count
            kv_parts = min(tp, kvh)
            # Q + output gate per head
            q = read(f"{a}.q_proj", (2 * heads * hd, h), _rows(rank, tp, 2 * heads * hd))
            k = read(f"{a}.k_proj", (kvh * hd, h), _rows(kv_rank, kv_parts, kvh * hd))
            v = read(f"{a}.v_proj", (kvh * hd, h), _rows(kv_rank, kv_parts, kvh * hd))
            parts = [q, k, v]
            if cfg.get("indexer_n_heads"):  # QSA: vLLM packs the replicated indexer q/k into qkv_proj
                n_idx = (int(cfg["indexer_n_heads"]) + int(cfg["indexer_kv_heads"])) * int(
                    cfg["indexer_head_dim"]
                )
                parts.append(read(f"{a}.indexer.index_qk_proj", (n_idx, h)))
            gemv(f"{a}.qkv_proj", "qkv_proj", *parts)
            gemv(f"{a}.o_proj", "o_proj", read(f"{a}.o_proj", (h, heads * hd), _cols(rank, tp, heads * hd)))
        if ROUTE_GEMV in routes:
            m, inter, experts = (
                f"{p}.mlp",
                int(cfg["shared_expert_intermediate_size"]),
                int(cfg["num_experts"]),
            )
            gemv(f"{m}.gate", "gate", read(f"{m}.gate", (experts, h)))
            gemv(f"{m}.shared_expert_gate", "shared_expert_gate", read(f"{m}.shared_expert_gate", (1, h)))
            s = f"{m}.shared_expert"
            gate = read(f"{s}.gate_proj", (inter, h), _rows(rank, tp, inter))
            up = read(f"{s}.up_proj", (inter, h), _rows(rank, tp, inter))
            gemv(f"{s}.gate_up_proj", "gate_up_proj", gate, up)
            gemv(f"{s}.down_proj", "down_proj", read(f"{s}.down_proj", (h, inter), _cols(rank, tp, inter)))
        if ROUTE_HC in routes:
            for where in ("attn_hyper_connection", "mlp_hyper_connection"):
                sites.append(_hc_site(ck, f"{p}.{where}", cfg, hc_dt, use_combine=True))
    if ROUTE_HC in routes:
        sites.append(_hc_site(ck, "model.hyper_connection_mixer", cfg, hc_dt, use_combine=False))
    if ROUTE_GEMV in routes:
        vocab = int(cfg["vocab_size"])
        gemv("lm_head", "lm_head", read("lm_head", (vocab, h), _rows(rank, tp, vocab)))
    return sites


def _hc_site(ck: Checkpoint, prefix: str, cfg: dict[str, Any], dt: torch.dtype, use_combine: bool) -> Site:
    from qgate_kernels import reference

    hc, rank_, d = (
        int(cfg["hc_count"]),
        int(cfg["hc_lowrank"]),
        int(cfg["hc_count"]) * int(cfg["hidden_size"]),
    )
    norm = ck.read(f"{prefix}.hc_norm.weight", (d,), dt)
    down = ck.read(f"{prefix}.input_mix_weight_down.weight", (rank_, d), dt)
    if use_combine:
        inject = ck.read(f"{prefix}.block_inject_weight.weight", (hc, d), dt)
        pad = down.new_zeros((reference.hc_down_rows(rank_, hc, True) - rank_ - hc, d))
        down = torch.cat([down, inject, pad])  # [R + HC + pad, D], as vLLM merges them
    up = ck.read(f"{prefix}.input_mix_weight_up.weight", (d, rank_), dt)
    role = "final" if not use_combine else ("moe" if prefix.endswith("mlp_hyper_connection") else "attn")
    meta = {"hc_count": hc, "lora_rank": rank_, "eps": float(cfg.get("rms_norm_eps", 1e-6))}
    return Site(prefix, role, ROUTE_HC, (norm, down, up), meta)
