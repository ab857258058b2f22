"""`qgate compare` through Typer's CliRunner: exit codes, inputs as files or run directories, outputs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from qgate.cli.compare import app
from typer.testing import CliRunner

_spec = importlib.util.spec_from_file_location(
    "golden_support", Path(__file__).parent / "golden" / "support.py"
)
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)
runner = CliRunner()


@pytest.fixture
def contract(tmp_path: Path) -> Path:
    path = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, path)
    return path


@pytest.fixture(autouse=True)
def routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "qgate.routes", support.standin_routes())


def pair_files(tmp_path: Path, contract: Path, edit=None) -> tuple[Path, Path]:
    control, candidate = (support.rehash(r, contract) for r in support.load_pair())
    if edit is not None:
        edit(control, candidate)
    return (
        support.write_json(tmp_path / "a" / "control.json", control),
        support.write_json(tmp_path / "b" / "candidate.json", candidate),
    )


def invoke(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_pass_exits_0_and_writes_report_json_and_png(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    out = tmp_path / "out"
    res = invoke(ctrl, cand, "--contract", contract, "--out", out)
    assert res.exit_code == 0, res.output
    assert "verdict: PASS" in res.output and str(out / "report.md") in res.output
    record = json.loads((out / "verdict.json").read_text())
    assert (record["kind"], record["schema_version"], record["verdict"]) == ("verdict", 1, "PASS")
    assert {"name", "passed", "detail"} <= set(record["gates"][0])
    assert record["stats"]["decode_tok_s"]["welch_p"] < 0.05
    assert (out / "report.md").read_text().startswith("# qgate verdict: PASS")
    assert (out / "speed.png").read_bytes()[:4] == b"\x89PNG"


def test_run_directories_pick_each_arm(tmp_path: Path, contract: Path) -> None:
    control, candidate = (support.rehash(r, contract) for r in support.load_pair())
    for run, arm, data in (("run1", "control", control), ("run2", "candidate", candidate)):
        support.write_json(tmp_path / run / "speed" / f"{arm}.json", data)
    # A decoy candidate in the control's run directory must not be used.
    support.write_json(tmp_path / "run1" / "speed" / "candidate.json", {"kind": "speed", "schema_version": 1})
    res = invoke(tmp_path / "run1", tmp_path / "run2", "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    inputs = json.loads((tmp_path / "out" / "verdict.json").read_text())["inputs"]["speed"]
    assert inputs["control"].endswith("run1/speed/control.json")
    assert inputs["candidate"].endswith("run2/speed/candidate.json")


def test_contract_defaults_to_the_one_the_results_name(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    res = invoke(ctrl, cand, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output


def test_fail_exits_1(tmp_path: Path, contract: Path) -> None:
    def slow_rep(control: dict, candidate: dict) -> None:
        candidate["reps"][0]["decode_tok_s"] = 50.0

    ctrl, cand = pair_files(tmp_path, contract, slow_rep)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 1, res.output
    assert "verdict: FAIL" in res.output and "every candidate rep >= 55 tok/s" in res.output


def test_mismatched_arms_exit_3_and_list_differences(tmp_path: Path, contract: Path) -> None:
    def other_vllm(control: dict, candidate: dict) -> None:
        candidate["fingerprint"]["vllm"] = "0.31.0"
        candidate["model"]["config_sha256"] = "1" * 64

    ctrl, cand = pair_files(tmp_path, contract, other_vllm)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "refuse to compare" in res.output
    assert "fingerprint.vllm" in res.output and "model.config_sha256" in res.output
    assert json.loads((tmp_path / "out" / "verdict.json").read_text())["verdict"] == "ERROR"


def test_statistic_that_cannot_be_computed_exits_3(tmp_path: Path, contract: Path) -> None:
    def constant(control: dict, candidate: dict) -> None:
        for arm in (control, candidate):
            for rep in arm["reps"]:
                rep["decode_tok_s"] = 60.0

    ctrl, cand = pair_files(tmp_path, contract, constant)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "zero variance" in res.output


def test_contract_hash_mismatch_exits_3(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    other = tmp_path / "other.yaml"
    other.write_text(contract.read_text().replace("min_decode_tok_s: 55", "min_decode_tok_s: 40"))
    res = invoke(ctrl, cand, "--contract", other, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "contract in hand" in res.output


@pytest.mark.parametrize("case", ["missing file", "bad json", "bad contract", "no speed section", "no out"])
def test_usage_and_contract_errors_exit_2_with_one_line(tmp_path: Path, contract: Path, case: str) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    args: list[object] = [ctrl, cand, "--contract", contract, "--out", tmp_path / "out"]
    if case == "missing file":
        args[1] = tmp_path / "nope.json"
    elif case == "bad json":
        cand.write_text("{not json")
    elif case == "bad contract":
        contract.write_text(contract.read_text().replace("repetitions: 5", "repetitions: five"))
    elif case == "no speed section":
        text = contract.read_text()
        contract.write_text(text[: text.index("speed:")])
    else:
        args = args[:4]
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    if case != "no out":
        assert res.output.count("qgate: error:") == 1
    assert not (tmp_path / "out" / "verdict.json").exists()


@pytest.mark.skipif(importlib.util.find_spec("qgate.routes") is None, reason="qgate.routes not there yet")
def test_fixture_pair_passes_with_the_real_route_attestation(
    tmp_path: Path, contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "qgate.routes")
    ctrl, cand = pair_files(tmp_path, contract)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
