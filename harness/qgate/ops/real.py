"""Real-weight operator bounds: every routed projection of a checkpoint through its route and its reference.

Per TP rank (all of them), per site of `weights.routed_weights` (the checkpoint's own tensors, sliced as
vLLM shards them): the inputs the plugin recorded at that site during a real decode (qgate_kernels.record,
`<activations>/rank<r>/<route>/<module>.pt`) or, for a site without a recording, `trials` random
inputs; each input through the route (as the plugin calls it) and its reference; bit equality, the
worst absolute difference and the worst ULP distance (screen.ulp_distance). Summed per role, in the
seed's form ("qkv_proj bitwise 256/256, worst abs 0, worst 0 ULP"). A role passes within the route's
tolerance of the operator screen (ops.schema.DEFAULT_TOLERANCES). Plain data in, one record out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import qgate_kernels
from qgate.contract.ops import DEFAULT_TOLERANCES
from qgate.ops.recorded import open_recording, recorded_markdown, recording_section, screen_topk, site_inputs
from qgate.ops.screen import _max_abs_diff, bitwise_equal, record_header, ulp_distance
from qgate.ops.weights import Checkpoint, Site, WeightsError, routed_weights
from qgate_kernels import reference
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC

ROUTE_DTYPES = {ROUTE_GEMV: ("fp16",), ROUTE_GDN: ("fp16", "bf16"), ROUTE_HC: ("fp16", "bf16")}


def _calls(site: Site, dev: torch.device) -> tuple[Any, Any]:
    """(route, reference) callables of one input for the site's tensors on dev."""
    t = tuple(x.to(dev) for x in site.tensors)
    if site.route == ROUTE_GEMV:
        (w,) = t
        return (lambda x: (qgate_kernels.gemv(w, x, static_weight=True),), lambda x: (reference.gemv(w, x),))
    if site.route == ROUTE_GDN:
        wq, wb = t
        m = site.meta
        heads = (m["nk"], m["nv"], m["dk"], m["dv"])
        return (
            lambda x: qgate_kernels.gdn_input(x, wq, wb, *heads, layout="flat", static_weight=True),
            lambda x: reference.gdn_input(x, wq, wb, *heads, "flat"),
        )
    norm, down, up = t
    m = site.meta
    hc, rank, eps = m["hc_count"], m["lora_rank"], m["eps"]

    kw = {"hc_count": hc, "lora_rank": rank, "eps": eps}

    def route(h: Tensor, o: Tensor | None, inj: Tensor | None) -> tuple[Tensor, ...]:
        if o is None:  # a `mix` call (layer 0: nothing pending)
            out = qgate_kernels.hc_mix(h, norm, down, up, **kw)[1:]  # (h, block_input, injection)
        else:
            out = qgate_kernels.hc_combine_and_mix(h, o, inj, norm, down, up, **kw)
        return tuple(x for x in out if x is not None and x.shape[-1] > 0)

    def ref(h: Tensor, o: Tensor | None, inj: Tensor | None) -> tuple[Tensor, ...]:
        if o is None:
            out = reference.hc_mix(h, norm, down, up, hc, rank, eps)
        else:
            out = reference.hc_combine_mix(h, o, inj, norm, down, up, hc, rank, eps)
        return tuple(x for x in out if x is not None and x.shape[-1] > 0)

    return route, ref


def _random_inputs(
    site: Site, gen: torch.Generator, dev: torch.device, trials: int
) -> list[tuple[Tensor, ...]]:
    first = site.tensors[0]
    dt = first.dtype
    if site.route == ROUTE_GEMV:
        return [(torch.randn(1, first.shape[1], generator=gen, device=dev).to(dt),) for _ in range(trials)]
    if site.route == ROUTE_GDN:
        return [(torch.randn(1, first.shape[1], generator=gen, device=dev).to(dt),) for _ in range(trials)]
    d, hc = first.shape[0], site.meta["hc_count"]
    out = []
    for _ in range(trials):
        h = torch.randn(1, d, generator=gen, device=dev).to(dt)
        o = torch.randn(1, d // hc, generator=gen, device=dev).to(dt)
        inj = torch.randn(1, hc, generator=gen, device=dev).to(dt) if site.role != "final" else None
        out.append((h, o, inj))
    return out


def screen_site(site: Site, inputs: list[tuple[Tensor, ...]], dev: torch.device) -> dict[str, Any]:
    route, ref = _calls(site, dev)
    bitwise, max_abs, max_ulp = 0, 0.0, 0.0
    for args in inputs:
        outs, refs = route(*args), ref(*args)
        bitwise += bitwise_equal(outs, refs)
        max_abs = max(max_abs, _max_abs_diff(outs, refs))
        max_ulp = max(max_ulp, max(ulp_distance(o, r) for o, r in zip(outs, refs, strict=True)))
    return {"calls": len(inputs), "bitwise_equal": bitwise, "max_abs_diff": max_abs, "max_ulp": max_ulp}


def run_real_screen(
    model_dir: Path,
    tp: int,
    dtype: str,
    activations: Path | None,
    trials: int,
    device: str,
    seed: int | None = None,
    contract: dict[str, Any] | None = None,
    routes: tuple[str, ...] = (ROUTE_GEMV, ROUTE_GDN, ROUTE_HC),
) -> dict[str, Any]:
    """Screen every routed site of the checkpoint on every TP rank; the record passes when every role
    is within its route's tolerance. WeightsError for a checkpoint that cannot be read as asked."""
    for route in routes:
        if dtype not in ROUTE_DTYPES[route]:
            raise WeightsError(f"--dtype {dtype}: route {route} takes {', '.join(ROUTE_DTYPES[route])}")
    dev = torch.device(device)
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    gen = torch.Generator(device=dev).manual_seed(seed)
    ck = Checkpoint(model_dir)
    rec = None if activations is None else open_recording(activations, tp)
    sites: list[dict[str, Any]] = []
    mismatched: list[str] = []  # recorded shapes that do not fit the rank's slice (recorded.site_inputs)
    for rank in range(tp):
        for site in routed_weights(ck, tp, rank, dtype, routes):
            recorded, mismatch = site_inputs(rec, rank, site, dev)
            mismatched += [mismatch] if mismatch else []
            inputs = recorded or _random_inputs(site, gen, dev, trials)
            row = screen_site(site, inputs, dev)
            sites.append(
                {
                    "name": site.name,
                    "role": site.role,
                    "route": site.route,
                    "rank": rank,
                    "shapes": [list(t.shape) for t in site.tensors],
                    "inputs": "recorded" if recorded else "random",
                    **row,
                }
            )
    roles = _per_role(sites)
    recording, topk = recording_section(rec, sites, mismatched), screen_topk(rec, dev)
    return {
        **record_header("ops_real", contract, seed, dev),
        "model_dir": str(model_dir),
        "tp": tp,
        "dtype": dtype,
        "activations": None if activations is None else str(activations),
        "sites": sites,
        "roles": roles,
        "recording": recording,  # the rank layout and the sites' shapes against the slices
        "topk": topk,  # the QSA top-k on the recorded score rows (None: none recorded)
        "passed": bool(roles)
        and all(r["passed"] for r in roles)
        and all(x is None or x["passed"] for x in (recording, topk)),
    }


def _per_role(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in sites:
        r = out.setdefault(
            (s["route"], s["role"]),
            {"route": s["route"], "role": s["role"], "sites": 0, "calls": 0, "bitwise_equal": 0,
             "max_abs_diff": 0.0, "max_ulp": 0.0, "inputs": set()},
        )  # fmt: skip
        r["sites"] += 1
        r["calls"] += s["calls"]
        r["bitwise_equal"] += s["bitwise_equal"]
        r["max_abs_diff"] = max(r["max_abs_diff"], s["max_abs_diff"])
        r["max_ulp"] = max(r["max_ulp"], s["max_ulp"])
        r["inputs"].add(s["inputs"])
    rows = []
    for r in out.values():
        bound = DEFAULT_TOLERANCES[r["route"]].max_ulp
        rows.append({**r, "inputs": "+".join(sorted(r["inputs"])), "max_ulp_bound": bound,
                     "passed": r["calls"] > 0 and r["max_ulp"] <= bound})  # fmt: skip
    return rows


def real_markdown(record: dict[str, Any]) -> str:
    """Per role, in the seed's form: bitwise n/N, worst absolute and ULP difference."""
    lines = [
        f"# Real-weight operator bounds: {record['model_dir']} (TP={record['tp']}, {record['dtype']}, "
        f"{record['device']['device']})",
        "",
        f"**{'PASS' if record['passed'] else 'FAIL'}**; inputs recorded at the sites where a recording "
        "exists, else random; every TP rank.",
        "",
        "| route | role | sites | inputs | bitwise | worst abs | worst ULP | bound | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["roles"]:
        lines.append(
            f"| {r['route']} | {r['role']} | {r['sites']} | {r['inputs']} "
            f"| {r['bitwise_equal']}/{r['calls']} "
            f"| {r['max_abs_diff']:.8g} | {r['max_ulp']:.3g} | {r['max_ulp_bound']} | "
            f"{'ok' if r['passed'] else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n" + recorded_markdown(record)
