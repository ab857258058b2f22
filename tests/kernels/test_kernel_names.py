"""qgate_route_env.kernel_route, which ties a profiler's kernel names to routes (qgate.timeline), covers
every CUDA kernel and row type csrc/ defines, with the names as the H200 profiler showed them."""

from __future__ import annotations

import json
import re

from conftest import REPO

from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK, kernel_route

CSRC = REPO / "kernels_ext" / "csrc"


def _sources() -> str:
    return "\n".join(p.read_text() for p in sorted(CSRC.glob("*.cu*")) + sorted(CSRC.glob("*.h")))


def test_every_kernel_and_row_type_of_the_sources_has_a_route() -> None:
    text = _sources()
    bounds = r"(?:\s+__launch_bounds__\((?:[^()]|\([^()]*\))*\))?"  # its arguments may call a function
    kernels = set(re.findall(r"__global__\s+void" + bounds + r"\s+(\w+)", text))
    # the row types the gemv kernels are instantiated on (TopkRows is the top-k kernels' argument)
    rows = set(re.findall(r"struct\s+(\w+Rows)\b", text)) - {"TopkRows"}
    assert {"gemv_rows_kernel", "hc_tma_kernel", "qsa_topk_push_kernel"} <= kernels, kernels
    assert {"GemvRows", "GdnFlatRows", "GdnInterleavedRows", "HcDownRows"} <= rows, rows
    want = {"GemvRows": ROUTE_GEMV, "GdnFlatRows": ROUTE_GDN, "GdnInterleavedRows": ROUTE_GDN}
    want["HcDownRows"] = ROUTE_HC
    for row in rows:  # a row type runs on the gemv kernels: the profiler shows it as a template argument
        name = f"void qgate::gemv_rows_kernel<2, true, qgate::(anonymous namespace)::{row}<__half> >(int)"
        assert kernel_route(name) == want.get(row, "unmapped"), row
    for kernel in kernels - {"gemv_rows_kernel", "gemv_one_group_kernel"}:
        route = kernel_route(f"void qgate::{kernel}<8>(qgate::TopkRows, int)")
        assert route in (ROUTE_HC, ROUTE_TOPK), kernel


def test_the_h200_profile_names_map_to_their_routes_and_vllms_to_none() -> None:
    fixture = REPO / "tests" / "fixtures" / "timeline" / "h200-prodshape-bf16"
    names = set(json.loads((fixture / "candidate.json").read_text())["kernels"])
    names |= set(json.loads((fixture / "control.json").read_text())["kernels"])
    routes = {n: kernel_route(n) for n in names}
    ours = {n: r for n, r in routes.items() if r is not None}
    assert set(ours.values()) == {ROUTE_GEMV, ROUTE_GDN, ROUTE_HC, ROUTE_TOPK}
    assert all(n.startswith("void qgate::") for n in ours)
    assert routes["void qgate::hc_tma_kernel<__nv_bfloat16>(qgate::HcArgs, qgate::HcTmaPlan)"] == ROUTE_HC
    assert not any("nvjet" in n or "cutlass" in n or "_hc_" in n for n in ours)  # vLLM's HC kernels: None
