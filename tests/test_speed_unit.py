"""The speed workload's arithmetic and refusals, against a hand-written adapter (no engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from qgate import models
from qgate.contract import load_contract
from qgate.engine import arms
from qgate.results import ResultError
from qgate.speed import run as speed_run
from qgate.speed.run import arm_path, run_seed, run_speed
from qgate.speed.workload import SpeedError, ids_sha256, rep_record, run_reps, synthetic_prompt

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
SPEC = {
    "input_tokens": 16, "output_tokens": 5, "greedy": True, "ignore_eos": True, "warmup": 1,
    "reset_prefix_cache": True, "prompt_seed": 3, "launch": 0, "rep_indices": [0, 1],
}  # fmt: skip


def _out(n: int = 5, first: float = 10.0, last: float = 10.4) -> dict:
    return {
        "token_ids": list(range(n)), "finish_reason": "length", "num_generation_tokens": n,
        "first_token_ts": first, "last_token_ts": last, "first_token_latency_s": 0.05,
        "scheduled_ts": first - 0.04,
    }  # fmt: skip


def test_decode_rate_is_tokens_after_first_over_first_to_last() -> None:
    rec = rep_record(_out(n=5, first=10.0, last=10.4), wall_s=0.5, index=2, launch=1, reset=True)
    assert rec["decode_tok_s"] == pytest.approx(4 / 0.4)
    assert rec["tpot_ms"] == pytest.approx(100.0)
    assert rec["ttft_ms"] == pytest.approx(50.0)
    assert rec["prefill_ms"] == pytest.approx(40.0)
    assert rec["engine_s"] == pytest.approx(0.44)
    assert rec["harness_overhead_s"] == pytest.approx(0.06)
    assert rec["token_ids_sha256"] == ids_sha256([0, 1, 2, 3, 4])
    assert (rec["index"], rec["launch"], rec["prefix_cache_reset"]) == (2, 1, True)


@pytest.mark.parametrize("n,first,last", [(1, 1.0, 1.0), (5, 2.0, 2.0), (5, 2.0, 1.0)])
def test_rate_that_cannot_be_computed_is_an_error(n: int, first: float, last: float) -> None:
    with pytest.raises(SpeedError):
        rep_record(_out(n, first, last), wall_s=1.0, index=0, launch=0, reset=True)


def test_prompt_is_deterministic_exact_length_and_avoids_special_ids() -> None:
    a = synthetic_prompt(50, 1000, seed=7, exclude=[0, 1, 2])
    assert a == synthetic_prompt(50, 1000, seed=7, exclude=[0, 1, 2])
    assert a != synthetic_prompt(50, 1000, seed=8, exclude=[0, 1, 2])
    assert len(a) == 1000 and not {0, 1, 2} & set(a) and max(a) < 50


class _Adapter:
    vocab_size = 64
    special_token_ids = [0]

    def __init__(self, reset_ok: bool) -> None:
        self.reset_ok = reset_ok
        self.calls: list[tuple[str, object]] = []

    def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset", None))
        return self.reset_ok

    def generate(self, prompt_token_ids: list[int], sampling: dict) -> dict:
        self.calls.append(("generate", dict(sampling)))
        self.prompts.append(list(prompt_token_ids))
        return _out()

    @property
    def prompts(self) -> list[list[int]]:
        return self.__dict__.setdefault("_prompts", [])


def test_reps_reset_before_every_generate_and_emit_records() -> None:
    adapter, events = _Adapter(reset_ok=True), []
    run_reps(adapter, SPEC, events.append)
    kinds = [e["event"] for e in events]
    assert kinds == ["prompt", "warmup", "rep", "rep"]
    assert [c[0] for c in adapter.calls] == ["reset", "generate"] * 3
    sampling = adapter.calls[1][1]
    assert sampling["temperature"] == 0.0 and sampling["ignore_eos"] is True
    assert sampling["max_tokens"] == sampling["min_tokens"] == 5
    assert [e["rep"]["index"] for e in events if e["event"] == "rep"] == [0, 1]


def test_every_rep_and_warmup_decodes_its_own_prompt_the_same_in_both_arms() -> None:
    """TEST04: rep i's prompt is drawn from (run seed, i): distinct within a run, the warm-up's its own,
    the same for rep i in another launch or arm, another under another seed; each rep records its hash."""
    first, events = _Adapter(reset_ok=True), []
    run_reps(first, {**SPEC, "rep_indices": [0, 1, 2, 3]}, events.append)
    warm, *reps = first.prompts
    assert len({tuple(p) for p in first.prompts}) == 5 and all(len(p) == 16 for p in first.prompts)
    assert not {0} & {t for p in first.prompts for t in p}  # no special id
    recs = [e["rep"] for e in events if e["event"] == "rep"]
    assert [r["prompt_sha256"] for r in recs] == [ids_sha256(p) for p in reps]
    assert events[1]["prompt_sha256"] == ids_sha256(warm) and events[1]["launch"] == 0
    # the other arm, a resumed or later launch: rep 2 alone gets rep 2's prompt; its warm-up another one
    other = _Adapter(reset_ok=True)
    run_reps(other, {**SPEC, "launch": 1, "rep_indices": [2]}, lambda e: None)
    assert other.prompts[1] == reps[2] and other.prompts[0] not in first.prompts
    reseeded = _Adapter(reset_ok=True)
    run_reps(reseeded, {**SPEC, "prompt_seed": 4, "rep_indices": [0]}, lambda e: None)
    assert reseeded.prompts[1] != reps[0]


def test_the_run_seed_is_drawn_unless_pinned_and_kept_by_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TEST05: no contract seed -> a fresh one per run (recorded); a pinned one is used as is; a folder
    holding an arm result keeps its seed (resume, the other arm run alone); two seeds there: refused."""
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    data["speed"]["prompt_seed"] = 11
    (tmp_path / "pinned.yaml").write_text(yaml.safe_dump(data))
    drawn, pinned = load_contract(tmp_path / "c.yaml"), load_contract(tmp_path / "pinned.yaml")
    seeds = {run_seed(drawn, tmp_path / f"out{i}") for i in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert run_seed(pinned, tmp_path / "out") == 11
    monkeypatch.setattr(arms, "run_segment", _ScriptedSegments())
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    monkeypatch.setattr(speed_run.secrets, "randbits", lambda bits: 123456789)
    out = tmp_path / "run"
    results = run_speed(drawn, out, arms=("control",))
    assert results["control"]["prompt"] | {"sha256": None} == {
        "input_tokens": drawn.contract.speed.input_tokens, "seed": 123456789, "seed_pinned": False,
        "sha256": None,
    }  # fmt: skip
    monkeypatch.setattr(speed_run.secrets, "randbits", lambda bits: 5)
    assert run_seed(drawn, out) == 123456789  # the candidate run alone into the same folder: same prompts
    candidate = run_speed(drawn, out, arms=("candidate",))["candidate"]
    assert candidate["prompt"]["seed"] == 123456789
    saved = json.loads(arm_path(out, "candidate").read_text())
    saved["prompt"]["seed"] = 7
    arm_path(out, "candidate").write_text(json.dumps(saved))
    with pytest.raises(ResultError, match="different prompt seeds"):
        run_seed(drawn, out)
    assert pinned.contract.speed.prompt() == {"input_tokens": pinned.contract.speed.input_tokens, "seed": 11,
                                              "seed_pinned": True}  # fmt: skip


def test_refused_prefix_cache_reset_fails_the_run() -> None:
    with pytest.raises(SpeedError, match="reset_prefix_cache"):
        run_reps(_Adapter(reset_ok=False), SPEC, lambda e: None)


class _ScriptedSegments:
    """Stands in for engine.segment.run_segment: one engine start answers the spec's reps."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int, list[int]]] = []

    def __call__(self, spec: dict, env: Any, log: Path, attest: Path, result: dict, on_event: Any,
                 save: Any, label: str) -> dict:  # fmt: skip
        self.starts.append((result["arm"], spec["launch"], list(spec["rep_indices"])))
        on_event({"event": "engine_ready", "fingerprint": {"cpu": "x"}, "engine_start_s": 0.1})
        on_event({"event": "prompt", "input_tokens": spec["input_tokens"], "sha256": "p"})
        for i in spec["rep_indices"]:
            rep = rep_record(_out(), wall_s=0.5, index=i, launch=spec["launch"], reset=True)
            on_event({"event": "rep", "rep": rep})
        save(result)
        return result


def test_speed_runs_on_the_spine_launches_interleaved_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["speed"].update({"repetitions": 4, "launches": 2})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    loaded, out = load_contract(tmp_path / "c.yaml"), tmp_path / "out"
    segments = _ScriptedSegments()
    monkeypatch.setattr(arms, "run_segment", segments)
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    results = run_speed(loaded, out)
    # Interleaved in the run's recorded first order (engine/order.py, tests/test_launch_order.py).
    first = results["control"]["launch_order"]["first"]
    assert sorted(first) == ["candidate", "control"]
    assert [(a, n) for a, n, _ in segments.starts] == [
        (first[0], 0),
        (first[1], 0),
        (first[0], 1),
        (first[1], 1),
    ]
    assert segments.starts[2][2] == [4, 5, 6, 7]
    for arm in ("control", "candidate"):
        saved = json.loads(arm_path(out, arm).read_text())
        assert saved == results[arm] and saved["complete"]
        assert [la["launch"] for la in saved["launches"]] == [0, 1]
        assert [r["index"] for r in saved["reps"]] == list(range(8))
    with pytest.raises(ResultError, match="pass --resume"):
        run_speed(loaded, out)
    run_speed(loaded, out, resume=True)  # complete: no engine start
    assert len(segments.starts) == 4


def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # Issue 30, defect 4: `qgate run speed --out` where no folder can be made was a traceback, exit 1.
    from typer.testing import CliRunner

    from qgate.cli import app

    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "out"
    res = CliRunner().invoke(
        app, ["run", "speed", "--contract", str(CONTRACTS / "smoke-cpu.yaml"), "--out", str(out)]
    )
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert lines[-1].startswith("qgate: error: ") and str(tmp_path / "a-file") in lines[-1], res.output


def test_the_workloads_name_their_child_side_by_import_path() -> None:
    """The engine child imports what a workload's `runner` names (the engine imports no workload)."""
    from qgate.engine.child import runner
    from qgate.quality import workload as quality_workload
    from qgate.quality.run import QualityWorkload
    from qgate.speed.run import SpeedWorkload

    assert runner(SpeedWorkload.runner) is run_reps
    assert runner(QualityWorkload.runner) is quality_workload.run
    for bad in ("qgate.speed.workload", "qgate.speed.workload:", ":run_reps"):
        with pytest.raises(ValueError, match="package.module:function"):
            runner(bad)


def test_the_audit_bar_counts_the_scored_reps_not_the_timed_ones() -> None:
    """The audit's engine start scores as many reps as differed: its bar counts them (N/?), where it
    showed 0 of the timed run's warmups + reps while it scored (seen on the H200: `0/5 audit: rep 3`)."""
    from types import SimpleNamespace

    from qgate.cli._progress import SpeedProgress
    from qgate.speed.run import AUDIT_ARM

    bars = SpeedProgress(SimpleNamespace(speed=SimpleNamespace(warmup=1, repetitions=4, launches=1)))
    bars(AUDIT_ARM, {"event": "engine_ready", "engine_start_s": 3.0}, {})
    for index in (0, 2, 3):
        bars(AUDIT_ARM, {"event": "audit", "audit": {"index": index}}, {})
    bars("control", {"event": "warmup", "index": 0}, {})
    audit, control = (bars._bar.tasks[bars._tasks[arm]] for arm in (AUDIT_ARM, "control"))
    assert (audit.completed, audit.total) == (3, None)
    assert (control.completed, control.total) == (1, 5)
