"""One GDN layer's and one attention layer's routed ops in model order, the routes against vLLM's own
paths for the same ops (ops/competitors.py), for `qgate bench ops` on a CUDA GPU.

The order is vLLM 0.32's Qwen4ExpDecoderLayer.forward at decode (models/qwen4_exp/nvidia/model.py):
attn_hc.combine_and_mix -> the layer's mixer -> mlp_hc.combine_and_mix -> the MLP. Of the mixer and
the MLP only the routed ops are timed; the steps between them that no route replaces (the GDN
core, the indexer's scores, the sparse attention, the MoE experts) are stand-ins (one elementwise
kernel each that reads the previous op's output and writes the next op's input), the same on both
sides:
  GDN layer:  HC combine_and_mix -> GDN input (qkvz + ba) -> [core: z as the 1536-wide input] ->
              out_proj 2560 x 1536 -> HC combine_and_mix -> shared expert gate/up 320 x 2560
  attention:  HC combine_and_mix -> qkv + indexer 4224 x 2560 -> [indexer: rewrites the scores] ->
              top-k (65,536 blocks, k 512) -> [attention: 1536 of the qkv as the input, reads the
              indices] -> o_proj 2560 x 1536 -> HC combine_and_mix -> shared expert 320 x 2560
Shapes are the production model's per GPU at TP=4, bf16 (what vLLM runs its CuTe GEMMs in). A chain
is one CUDA graph with one layer per weight set, sets rotated past L2; its time is a replay over the
number of sets, its ops' time that minus the stand-ins' own chain (the glue: stand-ins alone).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import qgate_kernels
from qgate.ops import competitors
from qgate.ops.shapes import MODEL_CONFIG

HC, HIDDEN, RANK = 4, 2560, 320
D = HC * HIDDEN
NK, NV, DK, DV = 4, 12, 128, 128  # GDN heads per GPU at TP=4
BLOCKS, TOPK = 65536, 512
DT = torch.bfloat16
CHAIN_MIN_VS_VLLM = 1.2  # the target: vLLM's ops over the routes' ops in each layer chain
HC_SHAPE = {"hc_count": HC, "hidden": HIDDEN, "lora_rank": RANK, "dtype": "bf16", "op": "combine_and_mix"}


def _w(gen: torch.Generator, dev: torch.device, *shape: int, scale: float) -> Tensor:
    return (torch.randn(*shape, generator=gen, device=dev) * scale).to(DT)


def _hc_weights(gen: torch.Generator, dev: torch.device) -> tuple[Tensor, ...]:
    rows = qgate_kernels.reference.hc_down_rows(RANK, HC, True)
    return (
        _w(gen, dev, D, scale=0.1),  # norm weight [D]
        _w(gen, dev, rows, D, scale=D**-0.5),  # down + inject rows (+ pad) [rows, D]
        _w(gen, dev, D, RANK, scale=RANK**-0.5),  # up [D, rank]
    )


def layer_set(kind: str, gen: torch.Generator, dev: torch.device) -> dict[str, Any]:
    """One layer's weights and its pending state (h, the previous block's output and injection)."""
    s = {
        "h": _w(gen, dev, 1, D, scale=1.0),
        "o": _w(gen, dev, 1, HIDDEN, scale=1.0),
        "inj": _w(gen, dev, 1, HC, scale=1.0),
        "hc_attn": _hc_weights(gen, dev),
        "hc_mlp": _hc_weights(gen, dev),
        "w_out": _w(gen, dev, HIDDEN, NV * DV, scale=(NV * DV) ** -0.5),  # [2560, 1536]
        "w_shared": _w(gen, dev, 320, HIDDEN, scale=HIDDEN**-0.5),  # [320, 2560]
    }
    if kind == "gdn":
        s["w_qkvz"] = _w(gen, dev, 2 * NK * DK + 2 * NV * DV, HIDDEN, scale=HIDDEN**-0.5)  # [4096, 2560]
        s["w_ba"] = _w(gen, dev, 2 * NV, HIDDEN, scale=HIDDEN**-0.5)  # [24, 2560]
    else:
        s["w_qkv"] = _w(gen, dev, 4224, HIDDEN, scale=HIDDEN**-0.5)  # [4224, 2560]
        s["scores"] = torch.relu(torch.randn(1, BLOCKS, generator=gen, device=dev))  # [1, blocks] fp32
        s["visible"] = torch.full((1,), BLOCKS, dtype=torch.int32, device=dev)
    return s


def _bytes(s: dict[str, Any]) -> int:
    flat = [v for v in s.values() for v in (v if isinstance(v, tuple) else (v,))]
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, Tensor))


class Ops:
    """The ops a chain calls: the routes' kernels, or vLLM's paths for the same ops."""

    def __init__(self, side: str, sample: dict[str, Any]) -> None:
        eps = float(MODEL_CONFIG["rms_norm_eps"])
        self.side = side
        if side == "route":
            kw: dict[str, Any] = {"hc_count": HC, "lora_rank": RANK, "eps": eps}
            self.hc = lambda h, o, inj, w: qgate_kernels.hc_combine_and_mix(h, o, inj, *w, **kw)
            self.linear = lambda w, x: qgate_kernels.gemv(w, x.reshape(-1), static_weight=True)
            self.gdn: Any = lambda x, wq, wb: qgate_kernels.gdn_input(
                x.reshape(-1), wq, wb, NK, NV, DK, DV, layout="flat", static_weight=True
            )
            self.topk: Any = lambda s, vis: qgate_kernels.qsa_topk(s, vis, TOPK)
            return
        args = (sample["h"], sample["o"], sample["inj"], *sample["hc_attn"])
        (found,) = competitors.hc_competitors(HC_SHAPE, args).values()
        hc_fn = self._need(found)
        self.hc = lambda h, o, inj, w: hc_fn(h, o, inj, *w)
        linears: dict[tuple[int, int], Callable[..., Any]] = {}
        for n, k in ((HIDDEN, NV * DV), (320, HIDDEN), (4224, HIDDEN), (4096, HIDDEN), (24, HIDDEN)):
            fn = competitors.vllm_linear(n, k, DT)
            linears[(n, k)] = self._linear_or_cublas(fn)
        self.linear = lambda w, x: linears[tuple(w.shape)](w, x.reshape(1, -1))
        self.gdn = None
        if "w_qkvz" in sample:
            shape = {"nk": NK, "nv": NV, "dk": DK, "dv": DV, "layout": "flat"}
            (gdn_fn,) = competitors.gdn_competitors(shape, (None, sample["w_qkvz"], sample["w_ba"])).values()
            self.gdn = self._need(gdn_fn)
        self.topk = None
        if "scores" in sample:
            (found,) = competitors.topk_competitors(sample["scores"], sample["visible"], TOPK).values()
            topk_fn = self._need(found)
            self.topk = lambda s, vis: topk_fn(s, vis, TOPK)

    @staticmethod
    def _need(fn: Callable[..., Any] | str) -> Callable[..., Any]:
        """The competitor, or its reason for missing (a str) raised."""
        if isinstance(fn, str):
            raise RuntimeError(fn)
        return fn

    @staticmethod
    def _linear_or_cublas(fn: Any) -> Callable[..., Any]:
        if isinstance(fn, str):
            if fn.startswith("cannot run"):
                raise RuntimeError(fn)
            return lambda w, x: torch.nn.functional.linear(x, w)  # what vLLM runs without a plan
        return fn


def gdn_layer(ops: Ops, s: dict[str, Any], glue_only: bool = False) -> Tensor:
    if glue_only:
        core = s["h"][:, : NV * DV] * 1  # the stand-ins alone, same sizes
        return torch.neg(s["o"][:, :320] * 1 + core[:, :320])
    h, x, inj = ops.hc(s["h"], s["o"], s["inj"], s["hc_attn"])[:3]
    _, z, _, _ = ops.gdn(x, s["w_qkvz"], s["w_ba"])
    core = z.reshape(1, -1) * 1  # GDN core stand-in: [1, 1536]
    y = ops.linear(s["w_out"], core)
    _, x2, _ = ops.hc(h, y.reshape(1, -1), inj, s["hc_mlp"])[:3]
    return torch.neg(ops.linear(s["w_shared"], x2))


def attention_layer(ops: Ops, s: dict[str, Any], glue_only: bool = False) -> Tensor:
    if glue_only:
        s["scores"].mul_(1)
        attn = s["h"][:, : NV * DV] * 1
        return torch.neg(attn[:, :320]) + torch.neg(s["visible"]).sum()
    h, x, inj = ops.hc(s["h"], s["o"], s["inj"], s["hc_attn"])[:3]
    qkv = ops.linear(s["w_qkv"], x)
    s["scores"].mul_(1)  # indexer stand-in: rewrites the scores after the qkv projection
    idx = ops.topk(s["scores"], s["visible"])
    attn = qkv.reshape(1, -1)[:, : NV * DV] * 1 + torch.neg(idx).sum().to(DT) * 0  # reads both
    y = ops.linear(s["w_out"], attn)  # o_proj [2560, 1536]
    _, x2, _ = ops.hc(h, y.reshape(1, -1), inj, s["hc_mlp"])[:3]
    return torch.neg(ops.linear(s["w_shared"], x2))


LAYERS = {"gdn_layer": ("gdn", gdn_layer), "attention_layer": ("attention", attention_layer)}


def _median_chain(
    timer: Callable[..., list[float]],
    cfg: dict[str, int],
    layer: Callable[..., Tensor],
    ops: Ops,
    sets: list[Any],
    glue: bool,
) -> float:
    calls = [lambda s=s: layer(ops, s, glue) for s in sets]
    return statistics.median(timer(calls, cfg["warmup"], cfg["reps"]))


def bench_chains(
    gen: torch.Generator, dev: torch.device, cfg: dict[str, int], timer: Callable[..., list[float]]
) -> dict[str, Any]:
    """Each layer's chain on the routes and on vLLM's paths, same sets: medians in us, the ratio
    vLLM ops / route ops (target 1.2), or why vLLM's side cannot run here."""
    out: dict[str, Any] = {}
    for name, (kind, layer) in LAYERS.items():
        first = layer_set(kind, gen, dev)
        n_sets = max(1, min(cfg["max_sets"], math.ceil(cfg["rotate_bytes"] / _bytes(first))))
        sets = [first] + [layer_set(kind, gen, dev) for _ in range(n_sets - 1)]
        route = Ops("route", first)
        glue = _median_chain(timer, cfg, layer, route, sets, True)
        total = _median_chain(timer, cfg, layer, route, sets, False)
        rec: dict[str, Any] = {
            "sets": n_sets,
            "glue_us": glue,
            "route_total_us": total,
            "route_us": total - glue,
        }
        try:
            vllm = Ops("vllm", first)
        except Exception as exc:  # noqa: BLE001 - any failure to set vLLM's side up: it cannot run here
            rec["vllm_cannot_run"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            v_total = _median_chain(timer, cfg, layer, vllm, sets, False)
            rec.update({"vllm_total_us": v_total, "vllm_us": v_total - glue})
            rec["vs_vllm"] = rec["vllm_us"] / rec["route_us"] if rec["route_us"] > 0 else 0.0
            rec["target_met"] = rec["vs_vllm"] >= CHAIN_MIN_VS_VLLM
        out[name] = rec
        del sets
        torch.cuda.empty_cache()
    return out
