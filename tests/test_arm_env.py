"""An arm's environment is computed once per arm (engine/preflight.py `ArmEnv`), carried to the launcher
and recorded as it is: the two arms of a run differ in what their engines see and in what their results
record only by the switches the contract declares for them. The engine child is scripted (the subject
is the env handed to the launcher and the records; a real engine's env is test_speed_e2e.py's)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_engine import OUT

from qgate import models
from qgate.contract import load_contract
from qgate.engine import launcher, procs, segment
from qgate.engine.lifeline import LIFELINE_ENV, PIDS_ENV
from qgate.engine.preflight import ArmEnv, arm_env
from qgate.speed.run import arm_path, run_speed
from qgate.speed.workload import rep_record

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
SWITCH = "VLLM_SM70_QWEN38_FP16_GEMV"
SHELL = {
    SWITCH: "1",  # both arms declare it: each arm's own value wins
    "QGATE_HC_PHASE_STOP": "2",  # a kernel knob neither arm sets: dropped from both
    "VLLM_SM70_OTHER_KNOB": "1",
    "QGATE_CPU_ISA": "avx512",  # only the candidate declares it (its own value): dropped from the control
    "OMP_NUM_THREADS": "2",  # can change what vLLM does: passed on and recorded, the same for both
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


class _Child:
    """Stands in for the launcher's run_child (engine/segment.py calls it): keeps the ArmEnv each
    launch was handed and the env its child would start with, and answers the spec's reps."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ArmEnv, dict[str, str]]] = []

    def __call__(self, spec: dict, env: ArmEnv, log: Path, on_event: Any, attest: Path, stall: Any) -> Any:
        self.seen.append((env.name, env, launcher.child_env(env, None)))
        out = {**OUT, "num_prompt_tokens": spec["input_tokens"]}
        on_event({"event": "engine_ready", "fingerprint": {"cpu": "x"}, "engine_start_s": 0.1})
        on_event({"event": "prompt", "input_tokens": spec["input_tokens"], "sha256": "p"})
        for i in spec["rep_indices"]:
            on_event({"event": "rep", "rep": rep_record(out, 0.2, i, spec["launch"], True)})
        return launcher.ChildOutcome(0, None, str(log))


def _differing(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_both_arms_differ_only_by_the_declared_switches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SHELL.items():
        monkeypatch.setenv(key, value)
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["speed"].update(repetitions=2, launches=2)
    data["arms"]["candidate"]["env"]["QGATE_CPU_ISA"] = "avx2"  # a knob only the candidate declares
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    loaded, out = load_contract(tmp_path / "c.yaml"), tmp_path / "out"
    declared = {a: loaded.contract.env_for(a) for a in ("control", "candidate")}
    segments = _Child()
    monkeypatch.setattr(segment, "run_child", segments)
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    run_speed(loaded, out)

    by_arm: dict[str, list[tuple[ArmEnv, dict]]] = {}
    for arm, env, child in segments.seen:
        by_arm.setdefault(arm, []).append((env, child))
    assert [len(v) for v in by_arm.values()] == [2, 2]
    # Built once per arm: every launch of an arm is handed the same record.
    assert all(v[0][0] is v[1][0] for v in by_arm.values())
    control, candidate = by_arm["control"][0][0], by_arm["candidate"][0][0]
    assert dict(control.declared) == declared["control"] and dict(candidate.declared) == declared["candidate"]
    switches = set(declared["candidate"])
    assert switches == {SWITCH, "QGATE_CPU_ISA"}
    # What the engines start from, and what reaches the child (the launcher's own variables apart).
    assert _differing(dict(control.process), dict(candidate.process)) == switches
    own = {procs.RUN_ENV, PIDS_ENV, LIFELINE_ENV}
    children = [{k: v for k, v in child.items() if k not in own} for _, child in by_arm["control"][:1]]
    children += [{k: v for k, v in child.items() if k not in own} for _, child in by_arm["candidate"][:1]]
    assert _differing(*children) <= switches
    assert "QGATE_HC_PHASE_STOP" not in candidate.process and "QGATE_HC_PHASE_STOP" not in control.process
    assert control.process["OMP_NUM_THREADS"] == candidate.process["OMP_NUM_THREADS"] == "2"

    # What the results record, as the ArmEnv holds it.
    saved = {a: json.loads(arm_path(out, a).read_text()) for a in ("control", "candidate")}
    assert _differing(saved["control"]["env"], saved["candidate"]["env"]) == switches
    assert saved["control"]["inherited_env"] == saved["candidate"]["inherited_env"]
    recorded = saved["control"]["inherited_env"]
    assert {k: recorded.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE")} == {
        "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1"
    }  # fmt: skip
    dropped = set(saved["control"]["dropped_env"]) ^ set(saved["candidate"]["dropped_env"])
    assert dropped == {"QGATE_CPU_ISA"} and "QGATE_HC_PHASE_STOP" in saved["candidate"]["dropped_env"]
    for arm, env in (("control", control), ("candidate", candidate)):
        assert {k: saved[arm][k] for k in ("env", "dropped_env", "inherited_env")} == env.record()


def test_an_arm_env_is_a_frozen_record() -> None:
    env = arm_env("candidate", {SWITCH: "1"}, {"PATH": "/bin", "QGATE_STRAY": "1", "OMP_NUM_THREADS": "1"})
    assert env.dropped == ("QGATE_STRAY",) and env.process[SWITCH] == "1" and "QGATE_STRAY" not in env.process
    with pytest.raises(TypeError):
        env.process["X"] = "1"  # type: ignore[index]
    with pytest.raises(AttributeError):
        env.name = "control"  # type: ignore[misc]
    assert dict(env.inherited) == {"OMP_NUM_THREADS": "1"} and os.environ.get("QGATE_STRAY") is None


def test_the_child_starts_with_the_arm_env_and_refuses_a_runner_naming_nothing(tmp_path: Path) -> None:
    """A real engine child (no vLLM: the runner is resolved before the engine starts) started by the
    launcher with an ArmEnv: a spec whose runner names no function ends in one line, exit 1."""
    env = arm_env("candidate", {SWITCH: "1"}, os.environ)
    events: list[dict] = []
    spec = {"runner": "qgate.speed.workload:no_such_runner", "model_path": str(tmp_path), "engine_args": {}}
    out = launcher.run_child(spec, env, tmp_path / "log", events.append, tmp_path / "attest", 60.0)
    said = "ValueError: runner 'qgate.speed.workload:no_such_runner': qgate.speed.workload has no function"
    assert out.returncode == 1 and out.error is not None and out.error.startswith(said), out
    assert events == [{"event": "error", "message": out.error}]
    assert "vllm" not in (tmp_path / "log").read_text().lower()  # refused before vLLM was imported
