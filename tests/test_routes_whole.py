"""An engine start whose route attestation files are not whole (issue 63): a worker's file lost or
emptied, one from another engine start left in the folder. The sums of qgate.routes.collect cannot
tell a lost file from a process that counted nothing; `routes.not_whole` asks each rank of the engine
for its file, the launcher keeps the answer on the start's `launches` entry, and `routes.<route>.ran`
fails on it, also once a --resume has finished the result. On the files a real TP 2 engine wrote
(tests/fixtures/attest/tp2-vllm-cpu/) and copies of them. No vLLM: fast."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from qgate import routes
from qgate.engine import launcher, segment
from qgate.engine.launcher import ChildOutcome, EngineError
from qgate.engine.preflight import arm_env
from qgate.engine.segment import merge_routes
from qgate.records import validate

TP2 = REPO / "tests" / "fixtures" / "attest" / "tp2-vllm-cpu"
MAIN, RANK0, RANK1 = "MainProcess-21478.json", "VllmWorker-0-22801.json", "VllmWorker-1-22802.json"
ENV = {"VLLM_SM70_QWEN38_FP16_GEMV": "1", "VLLM_SM70_QWEN38_FUSED_HC_FP16": "1"}


def _copy(tmp_path: Path, name: str = "start") -> Path:
    return Path(shutil.copytree(TP2, tmp_path / name, ignore=shutil.ignore_patterns("*.md")))


def _tp1(tmp_path: Path) -> Path:
    """One engine start at TP 1 with the engine core in its own process: the front end's file and the
    one model-loading process's (rank 0 of 1), as a TP 1 start writes them."""
    start = tmp_path / "tp1"
    start.mkdir()
    shutil.copy(TP2 / MAIN, start / MAIN)
    worker = json.loads((TP2 / RANK0).read_text())
    worker.update(process="EngineCore_DP0", tp_size=1)
    (start / "EngineCore_DP0-22801.json").write_text(json.dumps(worker))
    return start


def test_the_recorded_starts_are_whole() -> None:
    assert routes.not_whole(TP2, tp_size=2) is None
    written = min(json.loads(p.read_text())["written_at"] for p in TP2.glob("*.json"))
    assert routes.not_whole(TP2, tp_size=2, since=written) is None
    said = routes.not_whole(TP2, tp_size=4)
    assert (
        said is not None
        and "no file of tensor parallel rank 2 of 4; no file of tensor parallel rank 3" in said
    )
    said = routes.not_whole(TP2, tp_size=1)  # the files say 2: a start of another engine size
    assert said is not None and f"{RANK0}: rank 0 of tensor parallel 2, the engine's is 1" in said


def test_a_lost_worker_file_is_named_where_the_sums_cannot_see_it(tmp_path: Path) -> None:
    start = _tp1(tmp_path)
    assert routes.not_whole(start, tp_size=1) is None
    (start / "EngineCore_DP0-22801.json").unlink()  # the engine core's file lost, the front end's kept
    said = routes.not_whole(start, tp_size=1)
    assert said is not None and "\n" not in said
    assert said.startswith(f"the route attestation of this engine start in {start} is not whole: ")
    assert "no file of tensor parallel rank 0 of 1" in said
    tp2 = _copy(tmp_path)
    (tp2 / RANK1).unlink()
    assert "no file of tensor parallel rank 1 of 2:" in (routes.not_whole(tp2, tp_size=2) or "")


def test_an_emptied_or_cut_file_is_named(tmp_path: Path) -> None:
    start = _copy(tmp_path)
    (start / RANK1).write_text("")
    said = routes.not_whole(start, tp_size=2) or ""
    assert f"{RANK1}: unreadable route attestation (ValueError: the file is empty (0 bytes))" in said
    assert "no file of tensor parallel rank 1 of 2" in said
    (start / RANK1).write_text((TP2 / RANK1).read_text()[:700])  # cut mid-way
    assert f"{RANK1}: unreadable route attestation (JSONDecodeError" in (routes.not_whole(start, 2) or "")


def test_a_file_of_another_start_is_named(tmp_path: Path) -> None:
    start = _copy(tmp_path)
    shutil.copy(TP2 / RANK0, start / "VllmWorker-0-9999.json")  # an earlier start's rank 0, left behind
    said = routes.not_whole(start, tp_size=2) or ""
    assert f"rank 0 in 2 files ({RANK0}, VllmWorker-0-9999.json)" in said
    written = json.loads((TP2 / RANK0).read_text())["written_at"]
    said = routes.not_whole(start, tp_size=2, since=written + 1) or ""  # this start began after it
    assert "VllmWorker-0-9999.json: written before this engine start began (another start's file)" in said
    # the launcher sets such files aside before a start: the resumed start is judged on its own
    launcher._set_aside(start)
    assert sorted(p.name for p in (start / "earlier-0").iterdir()) == sorted(
        [MAIN, RANK0, RANK1, "VllmWorker-0-9999.json"]
    )
    assert not list(start.glob("*.json"))


def test_files_of_a_plugin_before_ranks_are_counted(tmp_path: Path) -> None:
    start = _tp1(tmp_path)
    for path in start.glob("*.json"):  # attestation schema 2: no tp_rank / tp_size
        data = json.loads(path.read_text())
        data["schema_version"] = 2
        del data["tp_rank"], data["tp_size"]
        path.write_text(json.dumps(data))
    assert routes.not_whole(start, tp_size=1) is None
    (start / "EngineCore_DP0-22801.json").unlink()
    said = routes.not_whole(start, tp_size=1) or ""
    assert "0 files of processes that loaded the model, the engine has 1" in said


def _child_ending_with(said: str):  # type: ignore[no-untyped-def]
    """segment.run_child's stand-in: the engine started, then the child ended with `said` (the
    attestation check's line, as the launcher reports it)."""

    def child(spec, arm, log_path, on_event, attest_dir, stall):  # type: ignore[no-untyped-def]
        on_event({"event": "engine_ready"})
        return ChildOutcome(0, said, str(log_path), said)

    return child


def _result(launches: list[dict], counts: dict) -> dict:
    return {"env": ENV, "engine_args": {"tensor_parallel_size": 1}, "routes": counts, "launches": launches}


def test_a_start_kept_as_not_whole_fails_the_route_gates_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, lost = _tp1(tmp_path), tmp_path / "lost"
    shutil.copytree(whole, lost)
    (lost / "EngineCore_DP0-22801.json").unlink()
    # Before: the two starts' sums pass routes.<route>.ran: the second start's counts are simply gone.
    counts = merge_routes(routes.collect(whole), routes.collect(lost))
    before = _result([{"segment": 0}, {"segment": 1}], counts)
    assert all(g.passed for g in routes.ran_gates(before))
    # The launcher's answer for the second start, kept on its launches entry by run_segment.
    result = {"launches": [{"segment": 0}], "routes": routes.collect(whole), "dropped_env": [],
              "inherited_env": None, "shims": {}}  # fmt: skip
    spec = {"engine_args": {"tensor_parallel_size": 1}}
    assert launcher.attestation_lost(whole, ENV, spec, since=None) is None
    said = launcher.attestation_lost(lost, ENV, spec, since=None)
    assert said is not None

    monkeypatch.setattr(segment, "run_child", _child_ending_with(said))
    saved: list[dict] = []
    with pytest.raises(EngineError, match="candidate launch 1: the route attestation .* is not whole"):
        segment.run_segment(
            {}, arm_env("candidate", ENV, os.environ), tmp_path / "log", lost, result,
            lambda ev: result["launches"].append({"segment": 1}), saved.append, "candidate launch 1",
        )  # fmt: skip
    kept = saved[-1]
    assert kept["launches"][1]["attestation_lost"] == said
    validate("speed", {**_speed_stub(), "launches": kept["launches"]}, "kept.json")  # a typed field
    gates = {g.name: g for g in routes.ran_gates({**_result(kept["launches"], kept["routes"])})}
    for route in ("fp16_gemv", "fused_hc_fp16"):
        gate = gates[f"routes.{route}.ran"]
        assert not gate.passed and gate.severity == "error"
        assert gate.detail.startswith("engine start 1: the route attestation of this engine start in ")
        assert "no file of tensor parallel rank 0 of 1" in gate.detail


def test_an_emptied_file_keeps_the_start_with_its_reason_not_a_lost_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _copy(tmp_path)
    (start / RANK1).write_text("")
    said = launcher.attestation_lost(start, ENV, {"engine_args": {"tensor_parallel_size": 2}}, None)
    result = {"launches": [], "routes": {}, "dropped_env": [], "inherited_env": None, "shims": {}}

    monkeypatch.setattr(segment, "run_child", _child_ending_with(said))
    saved: list[dict] = []
    with pytest.raises(EngineError, match="unreadable route attestation"):
        segment.run_segment(
            {}, arm_env("candidate", ENV, os.environ), tmp_path / "log", start, result,
            lambda ev: result["launches"].append({"segment": 0}), saved.append, "x",
        )  # fmt: skip
    assert saved and saved[-1]["launches"][0]["attestation_lost"] == said  # saved, not lost to collect


def _speed_stub() -> dict:
    """The smallest speed result the records accept around a `launches` list (golden fixture's)."""
    return json.loads((REPO / "tests" / "golden" / "speed_control.json").read_text())


def test_an_emptied_file_of_a_start_that_died_is_kept_with_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _copy(tmp_path)
    (start / RANK1).write_text("")
    result = {"launches": [], "routes": {}, "dropped_env": [], "inherited_env": None, "shims": {}}

    def child(spec, arm, log_path, on_event, attest_dir, stall):  # type: ignore[no-untyped-def]
        on_event({"event": "engine_ready"})
        raise EngineError("the engine child was killed by SIGKILL")

    monkeypatch.setattr(segment, "run_child", child)
    saved: list[dict] = []
    with pytest.raises(EngineError, match="killed by SIGKILL"):  # the failure in flight is what is said
        segment.run_segment(
            {}, arm_env("candidate", ENV, os.environ), tmp_path / "log", start, result,
            lambda ev: result["launches"].append({"segment": 0}), saved.append, "x",
        )  # fmt: skip
    lost = saved[-1]["launches"][0]["attestation_lost"]
    assert lost.endswith(f"{RANK1}: unreadable route attestation (ValueError: the file is empty (0 bytes))")
