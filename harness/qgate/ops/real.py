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
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import qgate_kernels
from qgate.contract.ops import DEFAULT_TOLERANCES
from qgate.ops import bound as B
from qgate.ops.calibration import FIGURES
from qgate.ops.load import hc_params_dtype
from qgate.ops.recorded import open_recording, recorded_markdown, recording_section, screen_topk, site_inputs
from qgate.ops.screen import _max_abs_diff, bitwise_equal, record_header, ulp_distance
from qgate.ops.weights import Checkpoint, Site, WeightsError, routed_weights
from qgate_kernels import reference
from qgate_kernels.dtypes import route_dtypes
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC


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

    kw: dict[str, Any] = {"hc_count": hc, "lora_rank": rank, "eps": eps}

    def route(h: Tensor, o: Tensor | None, inj: Tensor | None) -> tuple[Tensor, ...]:
        out: tuple[Tensor | None, ...]
        if o is None:  # a `mix` call (layer 0: nothing pending)
            out = qgate_kernels.hc_mix(h, norm, down, up, **kw)[1:]  # (h, block_input, injection)
        else:
            out = qgate_kernels.hc_combine_and_mix(h, o, inj, norm, down, up, **kw)
        return tuple(x for x in out if x is not None and x.shape[-1] > 0)

    def ref(h: Tensor, o: Tensor | None, inj: Tensor | None) -> tuple[Tensor, ...]:
        out: tuple[Tensor | None, ...]
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


def _judge_call(site: Site, args: tuple[Any, ...], outs: tuple[Tensor, ...], tally: B.Tally) -> None:
    """The forward-error bound (qgate.ops.bound) of every dot product the call's outputs hold."""
    if site.route == ROUTE_GDN:
        wq, wb = site.tensors
        m = site.meta
        tally.add(B.judge_gdn(args[0], wq, wb, (m["nk"], m["nv"], m["dk"], m["dv"]), "flat", outs), "gdn")
    else:
        norm, down, _ = site.tensors
        m = site.meta
        h, o, inj = args
        for what, j in B.judge_hc(h, o, inj, outs, norm, down, m["hc_count"], m["lora_rank"], m["eps"]):
            tally.add(j, what)


def screen_site(site: Site, inputs: list[tuple[Tensor, ...]], dev: torch.device) -> dict[str, Any]:
    """Every input through the route and its reference: the bound of each dot product (qgate.ops.bound),
    and as information bit equality, the worst absolute and ULP difference to the reference (HC's
    block_input, no dot product of its own, is judged by that ULP distance and the route's tolerance)."""
    on_dev = Site(site.name, site.role, site.route, tuple(t.to(dev) for t in site.tensors), site.meta)
    route, ref = _calls(on_dev, dev)  # the tensors are on dev already: one copy
    bitwise, max_abs, max_ulp, chain_ulp = 0, 0.0, 0.0, 0.0
    tally = B.Tally()
    gemv_calls: list[tuple[Tensor, Tensor]] = []  # GEMV: judged at once (one float64 pass over w)
    for args in inputs:
        outs, refs = route(*args), ref(*args)
        bitwise += bitwise_equal(outs, refs)
        max_abs = max(max_abs, _max_abs_diff(outs, refs))
        ulps = [ulp_distance(o, r) for o, r in zip(outs, refs, strict=True)]
        max_ulp = max(max_ulp, max(ulps))
        if site.route == ROUTE_HC:  # block_input: outs[0] of a mix, outs[1] after a combine
            chain_ulp = max(chain_ulp, ulps[0 if args[1] is None else 1])
        if site.route == ROUTE_GEMV:
            gemv_calls.append((args[0].reshape(-1), outs[0].reshape(-1)))
        else:
            _judge_call(on_dev, args, outs, tally)
    if gemv_calls:
        xs, ys = (torch.stack(t) for t in zip(*gemv_calls, strict=True))
        tally.add(B.judge_dot(on_dev.tensors[0], xs, ys), "y")
    return {"calls": len(inputs), "bitwise_equal": bitwise, "max_abs_diff": max_abs, "max_ulp": max_ulp,
            "chain_max_ulp": chain_ulp, "bound": tally.as_dict(), "_tally": tally}  # fmt: skip


# The routes whose sites the real-weight screen reads and runs (the QSA top-k is judged on recorded
# score rows only: `topk`).
REAL_ROUTES = (ROUTE_GEMV, ROUTE_GDN, ROUTE_HC)


def run_real_screen(
    model_dir: Path,
    tp: int,
    dtype: str,
    activations: Path | None,
    trials: int,
    device: str,
    seed: int | None = None,
    contract: dict[str, Any] | None = None,
    routes: tuple[str, ...] = REAL_ROUTES,
    shims: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Screen every routed site of the checkpoint on every TP rank, its weights as vLLM loads them in
    `dtype` (qgate.ops.load; `shims`: the contract's, for the HC parameters' dtype; None: a caller that
    names no engine, the HC parameters in `dtype` too). The record passes
    when no routed weight is non-finite, every role's outputs are within their bounds and no route's
    sign test finds a bias. WeightsError for a checkpoint that cannot be read as asked."""
    takes = route_dtypes(device)
    for route in routes:
        if dtype not in takes[route]:
            have = ", ".join(takes[route]) or "no dtype"
            raise WeightsError(f"--dtype {dtype}: route {route}'s op on {device} runs its kernel for {have}")
    dev = torch.device(device)
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    gen = torch.Generator(device=dev).manual_seed(seed)
    ck = Checkpoint(model_dir)
    hc_dtype = dtype if shims is None else hc_params_dtype(dtype, shims, device)
    skipped: dict[str, str] = {}
    if ROUTE_HC in routes and hc_dtype != dtype:
        skipped[ROUTE_HC] = (
            f"vLLM holds the HC parameters in {hc_dtype} (qwen4_exp/nvidia/model.py: HyperConnectionConfig"
            f"(params_dtype=torch.bfloat16)) and the activations in {dtype}: the HC site counts `dtype` and "
            "runs vLLM's own path; its tensors are read and checked, not screened"
        )
    rec = None if activations is None else open_recording(activations, tp)
    mismatched: list[str] = []  # recorded shapes that do not fit the rank's slice (recorded.site_inputs)
    sites: list[dict[str, Any]] = []
    tallies: dict[str, B.Tally] = {}
    clock = {"read_s": 0.0, "screen_s": 0.0}  # reading + casting the weights; the routes + the judging
    for rank in range(tp):
        t0 = time.perf_counter()
        rank_sites = routed_weights(ck, tp, rank, dtype, routes, hc_dtype)
        clock["read_s"] += time.perf_counter() - t0
        for site in rank_sites:
            if site.route in skipped:
                continue
            t0 = time.perf_counter()
            recorded, mismatch = site_inputs(rec, rank, site, dev)
            mismatched += [mismatch] if mismatch else []
            inputs = recorded or _random_inputs(site, gen, dev, trials)
            row = screen_site(site, inputs, dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            clock["screen_s"] += time.perf_counter() - t0
            tally = row.pop("_tally")
            if rank == 0 or site.role not in _REPLICATED:  # a replicated site's outputs count once
                tallies.setdefault(site.route, B.Tally()).merge(tally)
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
    bias = [{"route": r, **B.sign_test(t.up, t.down)} for r, t in tallies.items()]
    casts = ck.casts()
    bad_weights = [_weight_failure(c) for c in casts if c["first_bad"] is not None]
    return {
        **record_header("ops_real", contract, seed, dev),
        "model_dir": str(model_dir),
        "tp": tp,
        "dtype": dtype,
        "hc_dtype": hc_dtype,
        "route_dtypes": {r: list(takes[r]) for r in routes},
        "bound": {
            "u": B.U32,
            "lambda": B.LAMBDA,
            "c": "lambda sqrt(ceil(K/32) + 12)",
            "alpha_bias": B.ALPHA_BIAS,
        },
        "error_rates": dict(FIGURES),
        "timing": {k: round(v, 3) for k, v in clock.items()},
        "activations": None if activations is None else str(activations),
        "skipped": skipped,
        "casts": casts,
        "weight_failures": bad_weights,
        "sites": sites,
        "roles": roles,
        "bias": bias,
        "recording": recording,  # the rank layout and the sites' shapes against the slices
        "topk": topk,  # the QSA top-k on the recorded score rows (None: none recorded)
        "passed": bool(roles)
        and all(r["passed"] for r in roles)
        and all(b["passed"] for b in bias)
        and not bad_weights
        and all(x is None or x["passed"] for x in (recording, topk)),
    }


# Roles whose weight every rank holds whole (router, shared expert gate, HC): with the same recorded
# input on every rank their outputs repeat, so the sign test counts them on rank 0 only.
_REPLICATED = frozenset({"gate", "shared_expert_gate", "attn", "moe", "final"})


def _weight_failure(c: dict[str, Any]) -> str:
    cast = f"overflow to inf in the cast {c['stored']} -> {c['engine']}"
    kinds = (("nan_stored", "NaN"), ("inf_stored", "inf stored"), ("overflow_to_inf", cast))
    what = [f"{c[k]} {label}" for k, label in kinds if c[k]]
    return f"tensor {c['tensor']}: {', '.join(what)}; first at index {c['first_bad']}"


def _per_role(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in sites:
        r = out.setdefault(
            (s["route"], s["role"]),
            {"route": s["route"], "role": s["role"], "sites": 0, "calls": 0, "bitwise_equal": 0,
             "max_abs_diff": 0.0, "max_ulp": 0.0, "chain_max_ulp": 0.0, "inputs": set(), "bound": B.Tally()},
        )  # fmt: skip
        r["sites"] += 1
        r["chain_max_ulp"] = max(r["chain_max_ulp"], s["chain_max_ulp"])
        r["bound"].merge(B.Tally(**{k: v for k, v in _tally_fields(s["bound"]).items()}))
        r["calls"] += s["calls"]
        r["bitwise_equal"] += s["bitwise_equal"]
        r["max_abs_diff"] = max(r["max_abs_diff"], s["max_abs_diff"])
        r["max_ulp"] = max(r["max_ulp"], s["max_ulp"])
        r["inputs"].add(s["inputs"])
    rows = []
    for r in out.values():
        tol = DEFAULT_TOLERANCES[r["route"]].max_ulp if r["route"] == ROUTE_HC else None
        b = r["bound"]
        ok = (
            r["calls"] > 0
            and b.outputs > 0
            and b.exceeded == 0
            and (tol is None or r["chain_max_ulp"] <= tol)
        )
        rows.append({**r, "inputs": "+".join(sorted(r["inputs"])), "bound": b.as_dict(),
                     "chain_ulp_bound": tol, "passed": ok})  # fmt: skip
    return rows


def _tally_fields(d: dict[str, Any]) -> dict[str, Any]:
    return {"outputs": d["outputs"], "exceeded": d["over_bound"], "worst_ratio": d["worst_ratio"],
            "up": d["above_rn"], "down": d["below_rn"], "first": d["first_over"]}  # fmt: skip


def real_markdown(record: dict[str, Any]) -> str:
    """Per role: outputs over their bound and the worst |err| / bound; bitwise n/N, worst absolute and
    ULP difference as information; the casts, non-finite weights, the sign tests, skipped routes."""
    b, rates = record["bound"], record["error_rates"]
    power = min(v for k, v in rates.items() if k.startswith("power"))
    lines = [
        f"# Real-weight operator bounds: {record['model_dir']} (TP={record['tp']}, {record['dtype']}, "
        f"HC parameters {record['hc_dtype']}, {record['device']['device']})",
        "",
        f"**{'PASS' if record['passed'] else 'FAIL'}**; inputs recorded at the sites where a recording "
        f"exists, else random; every TP rank. Bound per output: |y - y_exact| <= c u sum|w x| + ulp/2, "
        f"u = 2^-24, c = {b['c']} (lambda {b['lambda']}); sign test at alpha {b['alpha_bias']} per route. "
        f"Error rates (docs/ops.md): false FAIL {rates['false_fail_per_run']:.2%} of "
        f"whole-model runs; power per planted defect >= {power:.3%}.",
        "",
        "| route | role | sites | inputs | outputs | over bound | worst err/bound | bitwise | worst abs "
        "| worst ULP | |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["roles"]:
        chain = (
            ""
            if r["chain_ulp_bound"] is None
            else f" (block_input {r['chain_max_ulp']:.3g} <= {r['chain_ulp_bound']})"
        )
        lines.append(
            f"| {r['route']} | {r['role']} | {r['sites']} | {r['inputs']} | {r['bound']['outputs']} "
            f"| {r['bound']['over_bound']} | {r['bound']['worst_ratio']:.4g} "
            f"| {r['bitwise_equal']}/{r['calls']} "
            f"| {r['max_abs_diff']:.8g} | {r['max_ulp']:.3g}{chain} | {'ok' if r['passed'] else 'FAIL'} |"
        )
        if r["bound"]["first_over"] is not None:
            f = r["bound"]["first_over"]
            lines.append(
                f"|  | first over: {f['at']}[{f['index']}] err/bound {f['ratio']:.3g} | | | | | | | | | |"
            )
    lines += ["", "| route | above RN | below RN | sign test p | |", "|---|---|---|---|---|"]
    for t in record["bias"]:
        lines.append(f"| {t['route']} | {t['above_rn']} | {t['below_rn']} | {t['p_value']:.3g} "
                     f"| {'ok' if t['passed'] else 'FAIL'} |")  # fmt: skip
    if record.get("arm") is not None:  # schema 3: the arm's own code screened in place of the kernels
        ran = ", ".join(f"{r}: {spec}" for r, spec in (record.get("overrides") or {}).items())
        what = f"its overrides ran ({ran})" if ran else "the kernels ran"
        lines.append(f"\nArm {record['arm']}: {what}.")
        for u in record.get("unseen") or []:
            lines.append(f"\nnot screened: {u}")
    for route, why in record["skipped"].items():
        lines.append(f"\n{route}: not screened: {why}")
    for line in record["weight_failures"]:
        lines.append(f"\nFAIL {line}")
    cast = [c for c in record["casts"] if c["stored"] != c["engine"]]
    hazards = [c for c in record["casts"] if c["flushed_to_zero"] or c["overflow_to_inf"] or c["first_bad"]]
    kinds = ", ".join(sorted({c["stored"] + " -> " + c["engine"] for c in cast})) or "none"
    lines += ["", f"Casts: {len(cast)} of {len(record['casts'])} tensors cast to the engine dtype ({kinds})."]
    if hazards:
        head = "| tensor | cast | NaN stored | inf stored | overflow to inf | flushed to 0 | first bad |"
        lines += ["", head, "|---|---|---|---|---|---|---|"]
        for c in hazards[:_HAZARD_ROWS]:
            lines.append(
                f"| {c['tensor']} | {c['stored']} -> {c['engine']} | {c['nan_stored']} | {c['inf_stored']} "
                f"| {c['overflow_to_inf']} | {c['flushed_to_zero']} | {c['first_bad']} |"
            )
        if len(hazards) > _HAZARD_ROWS:
            lines.append(f"\n{len(hazards) - _HAZARD_ROWS} more tensors with a hazard: `casts` in real.json.")
    return "\n".join(lines) + "\n" + recorded_markdown(record)


_HAZARD_ROWS = 30
