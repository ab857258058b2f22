"""Issue 44's zoo, screen side: gamed GEMV routes (tests/fixtures, never shipped) caught by the operator
screen on the candidate's own code, and the screen's blind spots (qgate.ops.seen) named. No engine: the
screen runs the overrides as the demo's does (qgate.ops.run.run_ops with the arm's plan env)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONTRACTS

from qgate import demo
from qgate.contract import load_contract
from qgate.ops import seen
from qgate.ops.run import run_ops

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GEMV_SWITCH = "VLLM_SM70_QWEN38_FP16_GEMV"


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-cpu.yaml with two small GEMV shapes and 8 trials: 18 calls per shape, seconds on 2 cores."""
    doc = yaml.safe_load((CONTRACTS / "demo-cpu.yaml").read_text())
    doc["ops"] = {
        "routes": ["fp16_gemv"],
        "trials": 8,
        "default_shapes": False,
        "shapes": {"fp16_gemv": [{"n": 96, "k": 128}, {"n": 64, "k": 2048}]},
    }
    path = tmp_path_factory.mktemp("zoo") / "small-demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("sign", "outputs over the forward-error bound"),
        # a stale call among the trials is over the bound; among the seen-input probe's it is fast
        ("stale", "outputs over the forward-error bound|faster on an input it has seen"),
        ("precision", "outputs over the forward-error bound"),
        ("truncated", "outputs over the forward-error bound"),
        ("address-memo", "new contents at the same addresses gave another result"),
    ],
)
def test_the_demo_screen_runs_the_faulty_candidates_code_and_fails_it(
    small_demo: Path, tmp_path: Path, kind: str, why: str
) -> None:
    plan = demo.make_plan(small_demo, tmp_path / "out", faulty=kind)
    plan.out.mkdir()
    gate = demo.run_screen_gate(plan)
    assert gate.verdict == "FAIL", gate
    assert demo.FAULTY_KINDS[kind].impl in gate.figure  # it says whose code it screened
    assert all(any(w in r for w in why.split("|")) for r in gate.reasons), gate.reasons
    assert len(gate.reasons) == 2, gate.reasons  # both shapes


def test_a_memo_of_exact_results_is_caught_by_its_speed_on_inputs_it_has_seen(tmp_path: Path) -> None:
    """TEST04 at the op (qgate.ops.seen_inputs): bit-exact, so every output check passes it; at the demo's
    long projections (a GEMV of ~100 us here) a hit costs a hash. The real route costs the same twice."""
    doc = yaml.safe_load((CONTRACTS / "demo-cpu.yaml").read_text())
    doc["ops"] = {"routes": ["fp16_gemv"], "trials": 4, "default_shapes": False,
                  "shapes": {"fp16_gemv": [{"n": 16384, "k": 128}, {"n": 128, "k": 8192}]}}  # fmt: skip
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = demo.make_plan(path, tmp_path / "out", faulty="memo")
    plan.out.mkdir()
    gate = demo.run_screen_gate(plan)
    assert gate.verdict == "FAIL" and len(gate.reasons) == 2, gate.reasons
    assert all("faster on an input it has seen" in r and "a result cache" in r for r in gate.reasons)
    honest = demo.make_plan(path, tmp_path / "honest")
    honest.out.mkdir()
    assert demo.run_screen_gate(honest).verdict == "PASS"


def test_a_route_that_copies_into_its_input_is_named(small_demo: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(small_demo.read_text())
    doc["ops"]["shapes"]["fp16_gemv"] = [{"n": 128, "k": 128}, {"n": 64, "k": 128}]  # square and not
    path = tmp_path / "square.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = demo.make_plan(path, tmp_path / "out", faulty="inplace")
    plan.out.mkdir()
    gate = demo.run_screen_gate(plan)
    assert gate.verdict == "FAIL" and len(gate.reasons) == 1, gate.reasons  # the square shape only
    (why,) = gate.reasons
    assert why.startswith("fp16_gemv 128x128: ") and "wrote to its inputs (argument 1)" in why
    assert "an output shares memory with an input (argument 1)" in why


def test_the_real_routes_screen_passes_with_nothing_unseen(small_demo: Path, tmp_path: Path) -> None:
    plan = demo.make_plan(small_demo, tmp_path / "out")
    plan.out.mkdir()
    gate = demo.run_screen_gate(plan)
    assert gate.verdict == "PASS" and gate.unseen == [] and "the routes' kernels" in gate.figure, gate


def test_a_stale_route_that_skips_less_often_than_the_screen_calls_is_missed(tmp_path: Path) -> None:
    """The screen's reach (docs/integrity.md): it makes trials + 5 calls per shape (+ 24 where a call takes
    50 us or more); a route stale only
    every 1000th call passes it, and only the engine gates (quality, the timed-output audit) can see it."""
    sys.path.insert(0, str(FIXTURES))
    try:
        import stale_routes

        doc = yaml.safe_load((CONTRACTS / "demo-cpu.yaml").read_text())
        doc["ops"] = {"routes": ["fp16_gemv"], "trials": 4, "default_shapes": False,
                      "shapes": {"fp16_gemv": [{"n": 32, "k": 64}]}}  # fmt: skip
        doc["arms"]["candidate"]["env"].update(
            {"QGATE_ROUTE_IMPL_FP16_GEMV": "stale_routes:stale_gemv", "PYTHONPATH": str(FIXTURES)}
        )
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(doc))
        every, stale_routes._EVERY = stale_routes._EVERY, 1000
        stale_routes._calls = 0
        try:
            record = run_ops(load_contract(path), tmp_path, device="cpu", arm="candidate")
        finally:
            stale_routes._EVERY = every
        assert record["passed"] and record["overrides"] == {"fp16_gemv": "stale_routes:stale_gemv"}
        # 4 trials + the determinism call + the in-place trial's two + the seen-input probe's two, and its
        # 2 x 12 pairs where a call takes 50 us or more (the machine's load decides)
        assert stale_routes._calls in (9, 33), stale_routes._calls
    finally:
        sys.path.remove(str(FIXTURES))


def test_blind_spots_name_unscreened_routes_startup_hooks_and_shadowing_packages(tmp_path: Path) -> None:
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text("")
    (tmp_path / "shadow" / "qgate_kernels").mkdir(parents=True)
    (tmp_path / "shadow" / "vllm.py").write_text("")
    (tmp_path / "plain" / "pkg").mkdir(parents=True)
    (tmp_path / "plain" / "my_routes.py").write_text("")
    env = {
        GEMV_SWITCH: "1",
        "VLLM_SM70_QWEN38_FUSED_HC_FP16": "1",
        "QGATE_ROUTE_IMPL_FUSED_HC_FP16": "my_routes:hc",
        "PYTHONPATH": ":".join(str(tmp_path / d) for d in ("hooks", "shadow", "plain", "missing")),
    }
    spots = seen.blind_spots(env, ["fp16_gemv"])
    assert spots == [
        "route fused_hc_fp16 is switched on but not in ops.routes: its override "
        "QGATE_ROUTE_IMPL_FUSED_HC_FP16=my_routes:hc was not screened",
        f"PYTHONPATH entry {tmp_path / 'hooks'} holds sitecustomize: code every engine process runs at "
        "start-up, which the screen does not run",
        f"PYTHONPATH entry {tmp_path / 'shadow'} holds qgate_kernels, vllm: the engine imports that copy, "
        "the screen the installed one",
    ]
    assert seen.blind_spots({GEMV_SWITCH: "1", "PYTHONPATH": str(FIXTURES)}, ["fp16_gemv"]) == []
    assert seen.blind_spots({GEMV_SWITCH: "0", "VLLM_SM70_QWEN38_FUSED_HC_FP16": "0"}, []) == []


def test_the_checkout_itself_on_the_arms_pythonpath_is_no_blind_spot() -> None:
    """The harness's own source folders provide the very copies the screen imported."""
    import qgate_kernels

    kernels = Path(qgate_kernels.__file__).resolve().parents[1]
    assert seen.blind_spots({GEMV_SWITCH: "1", "PYTHONPATH": str(kernels)}, ["fp16_gemv"]) == []


def test_env_the_candidate_sets_otherwise_than_the_control_is_a_blind_spot() -> None:
    control = {GEMV_SWITCH: "0", "OMP_NUM_THREADS": "1", "VLLM_CPU_SGL_KERNEL": "0"}
    cand = {
        GEMV_SWITCH: "1",
        "OMP_NUM_THREADS": "1",
        "QGATE_ROUTE_IMPL_FP16_GEMV": "m:f",
        "MY_BACKEND": "fast",
    }
    assert seen.blind_spots(cand, ["fp16_gemv"], control) == [
        "env MY_BACKEND=fast differs from the control's (unset): not a route switch or override, and what "
        "it changes in the engine the screen does not run",
        "env VLLM_CPU_SGL_KERNEL unset differs from the control's ('0'): not a route switch or override, "
        "and what it changes in the engine the screen does not run",
    ]
    assert seen.blind_spots(cand, ["fp16_gemv"]) == []  # without the control's env: not judged


def test_run_ops_arm_with_a_blind_spot_says_so_and_exits_4(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from qgate.cli import app

    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text("")
    doc = yaml.safe_load((CONTRACTS / "demo-cpu.yaml").read_text())
    doc["ops"] = {"routes": ["fp16_gemv"], "trials": 2, "default_shapes": False,
                  "shapes": {"fp16_gemv": [{"n": 32, "k": 64}]}}  # fmt: skip
    doc["arms"]["candidate"]["env"]["PYTHONPATH"] = str(tmp_path / "hooks")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(
        app,
        ["run", "ops", "-c", str(path), "-o", str(tmp_path / "o"), "--device", "cpu", "--arm", "candidate"],
    )
    assert res.exit_code == 4, res.output
    assert "Not seen by this screen (it cannot vouch for arm `candidate`):" in res.output
    assert "holds sitecustomize: code every engine process runs at start-up" in res.output
