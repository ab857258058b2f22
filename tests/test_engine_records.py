"""A launch that dies keeps the same env accounting as one that finishes (issue 39): the QGATE_* and
VLLM_SM70_* variables the launcher drops from the shell are in the kept record's `dropped_env`.

The engine child is replaced by one that dies after a rep (the subject is run_segment's bookkeeping;
a real engine killed mid-run is test_stop_signals.py's, which checks the same field on real stops)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qgate.engine import segment
from qgate.engine.launcher import EngineError
from qgate.engine.preflight import arm_env


def _result() -> dict:
    return {"launches": [], "routes": {}, "dropped_env": [], "inherited_env": None, "shims": {}}


@pytest.mark.parametrize("dies", [True, False])
def test_a_killed_launch_records_the_dropped_env_as_a_finished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies: bool
) -> None:
    monkeypatch.setenv("QGATE_FROM_THE_SHELL", "1")
    monkeypatch.setenv("VLLM_SM70_OTHER_KNOB", "1")

    def child(spec, arm, log_path, on_event, attest_dir, stall):  # type: ignore[no-untyped-def]
        on_event({"event": "engine_ready"})
        if dies:
            raise EngineError("the engine child was killed by SIGKILL")
        from qgate.engine.launcher import ChildOutcome

        return ChildOutcome(0, None, str(log_path))

    monkeypatch.setattr(segment, "run_child", child)
    saved: list[dict] = []
    result = _result()
    arm = arm_env("x", {"VLLM_SM70_QWEN38_FP16_GEMV": "1"}, os.environ)

    def on_event(ev: dict) -> None:
        result["launches"].append({"segment": 0})

    run = lambda: segment.run_segment(  # noqa: E731
        {},
        arm,
        tmp_path / "log",
        tmp_path / "attest",
        result,
        on_event,
        lambda r: saved.append(dict(r)),
        "x",
    )
    if dies:
        with pytest.raises(EngineError):
            run()
    else:
        run()
    assert saved and {"QGATE_FROM_THE_SHELL", "VLLM_SM70_OTHER_KNOB"} <= set(saved[-1]["dropped_env"])
    assert "VLLM_SM70_QWEN38_FP16_GEMV" not in saved[-1]["dropped_env"]  # the arm sets it


def test_a_resume_from_another_environment_is_refused_naming_each_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The 2026-12-05 GPU session: a call script that sourced its env twice doubled PYTHONPATH, and the
    # next call's resume was refused without saying what the two values were.
    def child(*args: object) -> None:
        raise AssertionError("no engine starts after a refused resume")

    monkeypatch.setattr(segment, "run_child", child)
    monkeypatch.setenv("PYTHONPATH", "/a:/b:/a:/b")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = _result()
    result["launches"] = [{"segment": 0}]
    result["inherited_env"] = {"PYTHONPATH": "/a:/b:/a:/b", "OMP_NUM_THREADS": "4"}
    arm = arm_env("x", {}, os.environ)
    monkeypatch.setenv("PYTHONPATH", "/a:/b")
    arm_now = arm_env("x", {}, os.environ)
    args = ({}, arm_now, tmp_path / "log", tmp_path / "attest", result, lambda ev: None, lambda r: None)
    with pytest.raises(segment.ResultError) as err:
        segment.run_segment(*args, "candidate launch 2")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("candidate launch 2: the environment differs")
    assert "OMP_NUM_THREADS was '4', now '<unset>'" in msg
    assert "PYTHONPATH was '/a:/b:/a:/b', now '/a:/b'" in msg
    # the same environment resumes (the child runs)
    result["inherited_env"] = dict(arm.inherited)
    with pytest.raises(AssertionError, match="no engine starts"):
        segment.run_segment(
            {}, arm, tmp_path / "log", tmp_path / "attest", result, lambda ev: None, lambda r: None, "x"
        )


def test_run_arms_refuses_a_resume_from_another_environment_before_the_pre_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pre-flight's children import vLLM (a minute on the GPU machine): a resume that cannot go on
    # is refused before them, naming the value then and now.
    from qgate.engine import arms

    def preflight(envs: object, machine: bool = True) -> None:
        raise AssertionError("the pre-flight ran before the refusal")

    monkeypatch.setattr(arms, "check_arm_envs", preflight)
    monkeypatch.setenv("PYTHONPATH", "/a:/b")

    # what this shell passes on (nox sets TORCHINDUCTOR_*, TRITON_*), PYTHONPATH as the kept launch had it
    kept_env = {**arm_env("candidate", {}, os.environ).inherited, "PYTHONPATH": "/a:/b:/a:/b"}

    class Kept:  # a workload whose kept result ran its launch with another PYTHONPATH
        kind, runner, launches = "speed", "unused", 2

        def open(self, plan: arms.ArmPlan, model: dict) -> dict:
            return {**_result(), "launches": [{"segment": 0}], "inherited_env": dict(kept_env)}

    plan = arms.ArmPlan("candidate", {}, {})
    with pytest.raises(segment.ResultError, match="PYTHONPATH was '/a:/b:/a:/b', now '/a:/b'"):
        arms.run_arms(None, tmp_path / "run", Kept(), plans=[plan], model=lambda: ("/m", {}))  # type: ignore[arg-type]
    # the same environment is not refused: the pre-flight comes next
    monkeypatch.setenv("PYTHONPATH", "/a:/b:/a:/b")
    with pytest.raises(AssertionError, match="the pre-flight ran"):
        arms.run_arms(None, tmp_path / "run", Kept(), plans=[plan], model=lambda: ("/m", {}))  # type: ignore[arg-type]
