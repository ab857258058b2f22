"""qgate.ablate without vLLM: factors, designs, effects, interaction, attestation, report, CLI exit codes.

Synthetic arm results are built from the golden speed fixture with known per-rep timings, so every
expected effect is known in advance.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import yaml
from conftest import CONTRACTS
from typer.testing import CliRunner

from qgate import ablate, stats
from qgate.ablate import AblationError, Factor
from qgate.cli.ablate import ablate as ablate_cmd
from qgate.compare import OutputExists, refuse_overwrite
from qgate.contract import LoadedContract, load_contract
from qgate.stats import StatsConfig

GOLDEN = Path(__file__).parent / "golden" / "speed_control.json"
GEMV = "VLLM_SM70_QWEN38_FP16_GEMV"
IMPL = "QGATE_ROUTE_IMPL_FP16_GEMV"
HC = "VLLM_SM70_QWEN38_FUSED_HC_FP16"
PLACEBO = "QGATE_ABLATE_PLACEBO"


def contract(tmp: Path, control: dict, candidate: dict, **engine: Any) -> LoadedContract:
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["arms"] = {"control": {"env": control}, "candidate": {"env": candidate}}
    if engine:
        data["arms"]["candidate"]["engine"] = engine
    elif control == candidate:
        # An A/A on purpose (issue 45: else the contract refuses it): ablate's refusal is the subject.
        data["aa"] = True
    data["speed"].update(input_tokens=64, output_tokens=16, repetitions=5)
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_contract(path)


SLOW = {GEMV: "1", IMPL: "slow_routes:slow_gemv"}


@pytest.fixture()
def two(tmp_path: Path) -> LoadedContract:
    """Two factors: the GEMV route with a slowed override, and a placebo env variable."""
    return contract(tmp_path, {GEMV: "0", "SHARED": "x"}, {**SLOW, PLACEBO: "1", "SHARED": "x"})


# --- factors and designs -----------------------------------------------------------------------------


def test_factors_group_a_route_with_its_override_and_leave_shared_vars_in_the_base() -> None:
    factors = ablate.derive_factors({GEMV: "0", "A": "1", "B": "2"}, {**SLOW, "A": "1", "C": "3"})
    assert [(f.name, f.kind) for f in factors] == [("fp16_gemv", "route"), ("B", "env"), ("C", "env")]
    assert factors[0].values == ((GEMV, "0", "1"), (IMPL, None, "slow_routes:slow_gemv"))
    assert factors[1].values == (("B", "2", None),)


def test_arm_env_moves_only_the_named_factors() -> None:
    control = {GEMV: "0", "B": "2"}
    factors = ablate.derive_factors(control, {**SLOW, "C": "3"})
    assert ablate.arm_env(control, factors, ["fp16_gemv"]) == {**SLOW, "B": "2"}
    assert ablate.arm_env(control, factors, ["B", "C"]) == {GEMV: "0", "C": "3"}
    assert ablate.arm_env(control, factors, []) == control


@pytest.mark.parametrize("design", ablate.DESIGNS)
def test_two_factors_give_the_four_arms_of_the_factorial_in_every_design(
    two: LoadedContract, design: str
) -> None:
    factors, arms = ablate.plan_arms(two, design)
    assert [f.name for f in factors] == ["fp16_gemv", PLACEBO]
    assert [a.name for a in arms][::3] == ["control", "candidate"]
    assert {a.name for a in arms} == {"control", "only-fp16_gemv", f"only-{PLACEBO}", "candidate"}
    only_gemv = next(a for a in arms if a.name == "only-fp16_gemv")
    assert only_gemv.env == {**SLOW, "SHARED": "x"}
    assert set(only_gemv.roles) == {"alone:fp16_gemv", f"leave-one-out:{PLACEBO}"}
    assert arms[-1].env == two.contract.env_for("candidate") and arms[0].env == two.contract.env_for(
        "control"
    )


@pytest.mark.parametrize(
    ("design", "names"),
    [
        ("one-at-a-time", ["control", "only-fp16_gemv", "only-A", "only-B", "candidate"]),
        ("leave-one-out", ["control", "without-fp16_gemv", "without-A", "without-B", "candidate"]),
        ("both", ["control", "only-fp16_gemv", "only-A", "only-B", "without-fp16_gemv", "without-A",
                  "without-B", "candidate"]),
    ],
)  # fmt: skip
def test_three_factor_designs(tmp_path: Path, design: str, names: list[str]) -> None:
    loaded = contract(tmp_path, {GEMV: "0"}, {GEMV: "1", "A": "1", "B": "1"})
    _, arms = ablate.plan_arms(loaded, design)
    assert [a.name for a in arms] == names


def test_full_factorial_of_four_factors(tmp_path: Path) -> None:
    loaded = contract(tmp_path, {}, {GEMV: "1", "A": "1", "B": "1", "C": "1"})
    _, arms = ablate.plan_arms(loaded, "full")
    assert len(arms) == 16 and len({frozenset(a.factors_on) for a in arms}) == 16
    assert arms[0].name == "control" and arms[-1].name == "candidate"
    assert "with-fp16_gemv+A" in [a.name for a in arms]


@pytest.mark.parametrize(
    ("control", "candidate", "engine", "design", "message"),
    [
        ({GEMV: "1"}, {GEMV: "1"}, {}, "both", "arms.control.env equals arms.candidate.env"),
        ({GEMV: "0"}, {GEMV: "1"}, {"max_num_seqs": 2}, "both", "arms.*.engine differ in max_num_seqs"),
        ({GEMV: "0"}, {GEMV: "1"}, {}, "random", "--design 'random': expected one of both"),
        ({}, {f"V{i}": "1" for i in range(6)}, {}, "full", "--design full with 6 factors is 64 arms"),
    ],
)
def test_plan_refuses_what_cannot_be_ablated(
    tmp_path: Path, control: dict, candidate: dict, engine: dict, design: str, message: str
) -> None:
    loaded = contract(tmp_path, control, candidate, **engine)
    with pytest.raises(AblationError) as err:
        ablate.plan_arms(loaded, design)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- analysis on synthetic results -------------------------------------------------------------------

TEMPLATE = json.loads(GOLDEN.read_text())


def result(loaded: LoadedContract, arm: ablate.Arm, tpot_ms: list[float], tokens: list[int] | None = None,
           hits: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """A complete speed result of one arm with the given per-rep TPOT (tok/s = 1000 / TPOT)."""
    res = copy.deepcopy(TEMPLATE)
    res.update(arm=arm.name, env=dict(arm.env), engine_args=loaded.contract.engine_for("control"))
    res["contract"].update(sha256=loaded.sha256, path=loaded.path)
    res["workload"].update(repetitions=len(tpot_ms), launches=1)  # the fixture runs two: one here
    res["launches"] = res["launches"][:1]
    base = res["reps"][0]
    res["reps"] = [
        {**base, "index": i, "tpot_ms": t, "decode_tok_s": 1000.0 / t, "ttft_ms": 20.0 + i,
         "token_ids": list(tokens or base["token_ids"])}
        for i, t in enumerate(tpot_ms)
    ]  # fmt: skip
    on = set(ablate.routes.switched_on(arm.env))
    res["routes"] = {r: {"hits": 0, "fallbacks": {}, "roles": {}} for r in ablate.routes.ROUTES}
    for r, n in (hits if hits is not None else {r: 100 for r in on}).items():
        res["routes"][r] = {"hits": n, "fallbacks": {}, "roles": {"qkv_proj": n} if n else {}}
    return res


JITTER = [0.0, 0.03, -0.02, 0.01, -0.03]  # ms: reps of one arm are close but not equal


def synthetic(loaded: LoadedContract, slow_ms: float = 9.0, placebo_ms: float = 0.0, **kw: Any) -> tuple:
    """Arms whose TPOT is 3 ms + slow_ms when the GEMV factor is on + placebo_ms when the placebo is."""
    factors, arms = ablate.plan_arms(loaded, "both")
    speed = {}
    for a in arms:
        t = 3.0 + slow_ms * ("fp16_gemv" in a.factors_on) + placebo_ms * (PLACEBO in a.factors_on)
        speed[a.name] = result(loaded, a, [t + j for j in JITTER], **kw.get(a.name, {}))
    return factors, arms, speed


def record_of(loaded: LoadedContract, factors: list, arms: list, speed: dict) -> dict[str, Any]:
    paths = {a.name: f"speed/{a.name}.json" for a in arms}
    return ablate.build_record(loaded, "both", factors, arms, speed, {}, {"ran": False, "detail": "-"}, paths)


def test_the_slowed_route_takes_the_blame_and_the_placebo_none(two: LoadedContract) -> None:
    rec = record_of(two, *synthetic(two))
    assert rec["kind"] == "ablation" and rec["schema_version"] == ablate.ABLATION_SCHEMA_VERSION == 4
    assert rec["status"] == "OK", rec["reasons"]
    eff = rec["effects"]
    for e in (eff["alone"]["fp16_gemv"], eff["leave_one_out"]["fp16_gemv"], eff["candidate"]):
        assert e["decode"]["verdict"] == "regressed" and e["decode"]["ci_high"] < 1
        assert e["tpot_delta_ms"]["ci_low"] > 8.5 and e["tpot_delta_ms"]["ci_high"] < 9.5
    for e in (eff["alone"][PLACEBO], eff["leave_one_out"][PLACEBO]):
        assert e["decode"]["verdict"] == "no significant change", e["decode"]["reason"]
        assert e["tpot_delta_ms"]["ci_low"] < 0 < e["tpot_delta_ms"]["ci_high"]
    assert eff["leave_one_out"]["fp16_gemv"]["reference"] == f"only-{PLACEBO}"


def test_additive_effects_show_no_interaction_on_the_tpot_scale(two: LoadedContract) -> None:
    rec = record_of(two, *synthetic(two, slow_ms=2.0, placebo_ms=1.0))
    inter = rec["effects"]["interaction"]
    assert set(inter) == {"alone", "leave_one_out"}
    for v in inter.values():
        assert abs(v["tpot_ms"]["estimate"]) < 1e-9
        assert v["tpot_ms"]["ci_low"] < 0 < v["tpot_ms"]["ci_high"]
    # On the % scale the same additive effects leave a remainder: -50 % - (-40 % - 25 %) = +15 points
    # (leave-one-out's references are the slower arms: for two factors its remainder happens to be 0).
    assert inter["alone"]["decode_pct"]["estimate"] == pytest.approx(15.0, abs=0.5)
    assert inter["leave_one_out"]["decode_pct"]["estimate"] == pytest.approx(0.0, abs=0.5)


def test_a_real_interaction_is_found(two: LoadedContract) -> None:
    factors, arms, speed = synthetic(two, slow_ms=2.0, placebo_ms=1.0)
    res = speed["candidate"]  # both on together cost 3 ms more than the sum
    for rep in res["reps"]:
        rep["tpot_ms"] += 3.0
        rep["decode_tok_s"] = 1000.0 / rep["tpot_ms"]
    for inter in record_of(two, factors, arms, speed)["effects"]["interaction"].values():
        assert inter["tpot_ms"]["ci_low"] > 2.5 and inter["tpot_ms"]["ci_high"] < 3.5, inter["basis"]


def test_a_switched_on_route_without_hits_is_an_error(two: LoadedContract) -> None:
    factors, arms, speed = synthetic(two, **{f"only-{PLACEBO}": {}, "only-fp16_gemv": {"hits": {}}})
    rec = record_of(two, factors, arms, speed)
    assert rec["status"] == "ERROR"
    assert any(r.startswith("only-fp16_gemv: routes.fp16_gemv.ran:") for r in rec["reasons"]), rec["reasons"]
    row = next(a for a in rec["arms"] if a["name"] == "only-fp16_gemv")
    assert not row["attested"]


def test_hits_in_a_route_that_is_off_are_an_error(two: LoadedContract) -> None:
    _, arms, _ = synthetic(two)
    factors, arms, speed = synthetic(two, **{f"only-{PLACEBO}": {"hits": {"fp16_gemv": 5}}})
    rec = record_of(two, factors, arms, speed)
    assert rec["status"] == "ERROR"
    assert f"only-{PLACEBO}: routes.off_clean: hits in routes switched off: fp16_gemv: 5" in rec["reasons"]


def test_an_incomplete_or_foreign_arm_is_an_error(two: LoadedContract) -> None:
    factors, arms, speed = synthetic(two)
    speed["candidate"]["complete"] = False
    speed["only-fp16_gemv"]["prompt"]["sha256"] = "ff" * 32
    speed[f"only-{PLACEBO}"]["env"] = {"SHARED": "x"}
    rec = record_of(two, factors, arms, speed)
    reasons = "\n".join(rec["reasons"])
    assert rec["status"] == "ERROR"
    assert "candidate result complete: complete = False" in reasons
    assert "only-fp16_gemv: comparable with control: refuse to compare: prompt.sha256" in reasons
    assert f"only-{PLACEBO}: env as planned" in reasons


def test_a_statistic_that_cannot_be_computed_is_an_error(two: LoadedContract) -> None:
    factors, arms, speed = synthetic(two)
    speed[f"only-{PLACEBO}"]["reps"] = speed[f"only-{PLACEBO}"]["reps"][:1]
    speed[f"only-{PLACEBO}"]["workload"]["repetitions"] = 1
    rec = record_of(two, factors, arms, speed)
    assert rec["status"] == "ERROR"
    assert any(r.startswith(f"effect alone {PLACEBO} computed:") for r in rec["reasons"]), rec["reasons"]


def test_a_run_cut_between_launches_names_the_launches_not_nan(two: LoadedContract) -> None:
    """An ablation cut after the first of its launches (50-prod-ablate.sh at a device call's end, then
    --report-only): every effect is an ERROR that says the reps come from fewer launches than the run
    planned, and the note says how many ran, not that the contract asks for one."""
    factors, arms, speed = synthetic(two)
    for res in speed.values():
        res["workload"]["launches"] = 2  # planned 2, the reps are all from launch 0
    rec = record_of(two, factors, arms, speed)
    assert rec["status"] == "ERROR"
    why = "control reps: 1 distinct launch ids [0], the workload ran 2 launches"
    assert f"effect candidate computed: {why}" in rec["reasons"], rec["reasons"]
    assert f"effect alone fp16_gemv computed: {why}" in rec["reasons"]
    assert not any("non-finite" in r for r in rec["reasons"])
    planned = two.contract.speed.launches
    note = f"only 1 of speed.launches = {planned} engine starts an arm has run: resume it (--resume)"
    assert rec["notes"] == [note]


def test_token_divergence_per_arm(two: LoadedContract) -> None:
    tokens = list(TEMPLATE["reps"][0]["token_ids"])
    moved = tokens[:3] + [9999] + tokens[4:]
    factors, arms, speed = synthetic(
        two, **{"only-fp16_gemv": {"tokens": moved}, "candidate": {"tokens": moved}}
    )
    rows = {a["name"]: a["tokens"] for a in record_of(two, factors, arms, speed)["arms"]}
    assert (
        rows["only-fp16_gemv"]["first_diverging_index"] == 3
        and not rows["only-fp16_gemv"]["identical_to_control"]
    )
    assert rows[f"only-{PLACEBO}"]["identical_to_control"] and rows["control"]["identical_across_reps"]


def _audit_of(control: dict, candidate: dict, at: int, margin: float) -> dict:
    """The control's result with an audit that scored every rep's candidate and own tokens from `at`,
    every candidate token at `margin` nats, every own token at 0."""
    from qgate.results import ids_sha256

    reps = []
    for c, t in zip(control["reps"], candidate["reps"], strict=True):
        for arm, ids, m in (("candidate", t["token_ids"], margin), ("control", c["token_ids"], 0.0)):
            n = len(ids) - at
            reps.append({"index": t["index"], "arm": arm, "prompt_sha256": t["prompt_sha256"],
                         "token_ids_sha256": ids_sha256(ids), "from": at, "top_ids": [7] * n,
                         "margins": [m] * n})  # fmt: skip
    return {**control, "audit": {"reps": reps, "routes": {}}}


def test_the_notes_say_whether_the_candidates_timed_output_was_audited(two: LoadedContract) -> None:
    """A device call cut before the audit's engine start (session 8) left the ablation OK and silent
    about it: its effects are speed figures of a candidate whose output nobody checked."""
    tokens = list(TEMPLATE["reps"][0]["token_ids"])
    moved = tokens[:3] + [9999] * (len(tokens) - 3)
    factors, arms, speed = synthetic(two, candidate={"tokens": moved})
    (note,) = [n for n in record_of(two, factors, arms, speed)["notes"] if "audit" in n]
    assert note.startswith("the candidate's timed output is not cleared by the audit (ERROR): ")
    assert "no audit scored rep 0's" in note and "`qgate compare` of speed/control.json" in note
    speed["control"] = _audit_of(speed["control"], speed["candidate"], 3, 0.0)
    (note,) = [n for n in record_of(two, factors, arms, speed)["notes"] if "audit" in n]
    assert note.startswith("the candidate's timed output, audited (MLPerf TEST01): 5 of 5 reps differ")
    speed["control"] = _audit_of(speed["control"], speed["candidate"], 3, 9.0)
    rec = record_of(two, factors, arms, speed)
    (note,) = [n for n in rec["notes"] if "audit" in n]
    assert note.startswith("the candidate's timed output is not cleared by the audit (FAIL): ")
    assert rec["status"] == "OK"  # the ablation attributes speed; compare gives the verdict
    assert not any("audit" in n for n in record_of(two, *synthetic(two))["notes"])  # same tokens


def test_bootstrap_estimate_is_seeded_and_refuses_too_few_samples() -> None:
    cfg = StatsConfig(bootstrap_resamples=2000)
    data = {"a": np.array([1.0, 2.0, 3.0, 4.0]), "b": np.array([2.0, 2.5, 3.5])}
    one = stats.bootstrap_estimate(data, lambda m: m["b"] - m["a"], cfg)
    assert one == stats.bootstrap_estimate(data, lambda m: m["b"] - m["a"], cfg)
    assert one["estimate"] == pytest.approx(8 / 3 - 2.5)
    assert one["ci_low"] < one["estimate"] < one["ci_high"]
    bad = stats.bootstrap_estimate({"a": np.array([1.0])}, lambda m: m["a"], cfg)
    assert bad["error"] and bad["estimate"] is None


def test_report_files_and_reload(tmp_path: Path, two: LoadedContract) -> None:
    rec = record_of(two, *synthetic(two))
    paths = ablate.write_ablation(rec, tmp_path)
    md = Path(paths["report"]).read_text()
    assert md.startswith("# Ablation: smoke-cpu v1: OK")
    for want in (
        "## Factors",
        "## Arms",
        "## Effects",
        "## Interaction",
        "## Route attestation",
        "regressed",
    ):
        assert want in md
    assert Path(paths["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ablate.load_ablation(paths["record"])["effects"] == json.loads(json.dumps(rec["effects"]))


def _sequential_record(launches: int, decision: str) -> dict[str, Any]:
    from qgate.speed import sequential

    design = sequential.Design.plan(0.05, 2, 6)
    looks = [
        sequential.Look(i + 1, n, 0.5, 0.4, 0.6, 3.0, 4.0, 2.0, 2.0, "continue", "neither bound decides")
        for i, n in enumerate(range(2, launches))
    ]
    looks.append(
        sequential.Look(len(looks) + 1, launches, 0.5, 0.4, 0.6, 3.0, 4.0, 2.0, 2.0, decision, "shown")
    )
    return sequential.record(design, looks)


def test_an_ablation_run_until_decided_keeps_its_looks_and_says_where_it_stopped(
    tmp_path: Path, two: LoadedContract
) -> None:
    factors, arms, speed = synthetic(two)
    seq = _sequential_record(4, "FAIL")
    for res in speed.values():
        res["sequential"] = seq
    rec = record_of(two, factors, arms, speed)
    assert rec["sequential"] == seq
    assert any(
        "stopped at 4 launches per arm, the candidate against the control FAIL" in n for n in rec["notes"]
    )
    md = Path(ablate.write_ablation(rec, tmp_path)["report"]).read_text()
    assert "### Sequential looks (--until-decided)" in md and "Stopped: FAIL after 4 launches per arm" in md
    fixed = record_of(two, *synthetic(two))
    assert fixed["sequential"] is None and not any("until-decided" in n for n in fixed["notes"])


def test_until_decided_runs_every_derived_arm_through_the_sequential_speed_run(
    tmp_path: Path, two: LoadedContract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring: --until-decided hands every arm's plan to run_speed_until_decided (which looks at
    control against candidate); the fixed design still calls run_speed."""
    calls: list[tuple[str, Any, list[str]]] = []

    def fake(name: str) -> Any:
        def run(loaded: LoadedContract, out: Path, *args: Any, **kw: Any) -> Any:
            calls.append((name, args[0] if args else None, [p.name for p in kw["plans"]]))
            raise ablate.AblationError("stop here")  # the arms are not run in this test

        return run

    monkeypatch.setattr(ablate, "run_speed", fake("fixed"))
    monkeypatch.setattr(ablate, "run_speed_until_decided", fake("sequential"))
    for kw in ({}, {"max_launches": 7}):
        with pytest.raises(ablate.AblationError):
            ablate.run_ablation(two, tmp_path / str(len(calls)), **kw)
    names = [a.name for a in ablate.plan_arms(two, "both")[1]]
    assert calls == [("fixed", None, names), ("sequential", 7, names)]


def test_factor_dict_shape() -> None:
    f = Factor("fp16_gemv", "route", ((GEMV, "0", "1"),))
    assert f.to_dict() == {
        "name": "fp16_gemv",
        "kind": "route",
        "vars": {GEMV: {"control": "0", "candidate": "1"}},
    }


# --- CLI wiring --------------------------------------------------------------------------------------


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(ablate_cmd)
    app.command("noop", hidden=True)(lambda: None)  # two commands: Typer keeps `ablate` as a subcommand
    return app


def test_cli_refuses_a_contract_with_nothing_to_ablate(tmp_path: Path) -> None:
    loaded = contract(tmp_path, {GEMV: "1"}, {GEMV: "1"})
    out = CliRunner().invoke(_cli(), ["ablate", "--contract", loaded.path, "--out", str(tmp_path / "o")])
    assert out.exit_code == 2
    assert "qgate: error:" in out.output and "nothing to ablate" in out.output
    assert "Traceback" not in out.output


def test_cli_refuses_an_unknown_design(tmp_path: Path) -> None:
    loaded = contract(tmp_path, {GEMV: "0"}, {GEMV: "1"})
    args = ["ablate", "--contract", loaded.path, "--out", str(tmp_path / "o"), "--design", "random"]
    out = CliRunner().invoke(_cli(), args)
    assert out.exit_code == 2 and "random" in out.output


def test_the_documented_example_contract_plans_the_four_arms(tmp_path: Path) -> None:
    import re

    text = (Path(__file__).parents[1] / "docs" / "ablate.md").read_text()
    yaml_block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert yaml_block is not None
    (tmp_path / "doc.yaml").write_text(yaml_block.group(1))
    factors, arms = ablate.plan_arms(load_contract(tmp_path / "doc.yaml"))
    assert [f.name for f in factors] == ["fp16_gemv", PLACEBO]
    assert [a.name for a in arms] == ["control", "only-fp16_gemv", f"only-{PLACEBO}", "candidate"]


def test_cli_refuses_an_out_dir_holding_an_ablation_report(tmp_path: Path) -> None:
    """No earlier ablation is overwritten without --resume or --force; refused before any engine start."""
    loaded = contract(tmp_path, {GEMV: "0"}, {GEMV: "1"})
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "ablation.json").write_text("{}")
    out = CliRunner().invoke(_cli(), ["ablate", "--contract", loaded.path, "--out", str(out_dir)])
    assert out.exit_code == 2, out.output
    assert out.output.count("qgate: error:") == 1 and "Traceback" not in out.output
    assert f"{out_dir}: already holds a report (ablation.json)" in out.output
    assert "pass --resume to continue that ablation or --force to overwrite its report" in out.output
    assert (out_dir / "ablation.json").read_text() == "{}"
    with pytest.raises(OutputExists):
        refuse_overwrite(out_dir, ablate.REPORT_FILES, False)
    refuse_overwrite(out_dir, ablate.REPORT_FILES, True)  # --force (or --resume) lets it through


# --- the decode-step timeline (--timeline: qgate.timeline, report/timeline.py) ------------------------

TIMELINE = Path(__file__).parent / "fixtures" / "timeline" / "h200-prodshape-bf16"


def test_the_timeline_rides_in_the_record_and_the_report_and_only_when_given(
    tmp_path: Path, two: LoadedContract
) -> None:
    from qgate.report.ablation import render_ablation
    from qgate.timeline import read_timeline

    factors, arms, speed = synthetic(two)
    paths = {a.name: f"speed/{a.name}.json" for a in arms}
    quality = {"ran": False, "detail": "-"}
    tl = read_timeline(TIMELINE)
    rec = ablate.build_record(two, "both", factors, arms, speed, {}, quality, paths, tl)
    written = ablate.write_ablation(rec, tmp_path)
    back = ablate.load_ablation(written["record"])
    assert back["timeline"]["arms"]["candidate"]["gpu_busy_us_per_step"] == 1908.49
    md = Path(written["report"]).read_text()
    title = "## Decode-step timeline (torch profiler, not a gate)"
    assert md.index("## Route attestation") < md.index(title) < md.index("## Quality")
    assert "GPU busy -145 us a step (-7.1 %), host gap -32 us" in md and "host-bound" in md
    plain = record_of(two, factors, arms, speed)
    assert plain["timeline"] is None and title not in render_ablation(plain)
    # a record of schema 3 (no timeline key) renders as a record without a timeline
    old = {k: v for k, v in plain.items() if k != "timeline"}
    assert render_ablation(old) == render_ablation(plain)
    Path(written["record"]).write_text(json.dumps({**back, "timeline": {"kind": "speed"}}))
    with pytest.raises(ablate.ResultError, match="timeline = "):
        ablate.load_ablation(written["record"])


def test_cli_refuses_a_bad_timeline_before_any_engine_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = contract(tmp_path, {GEMV: "0"}, {GEMV: "1"})
    started: list[str] = []
    monkeypatch.setattr(ablate, "run_speed", lambda *a, **kw: started.append("speed"))
    monkeypatch.setattr(ablate, "run_speed_until_decided", lambda *a, **kw: started.append("sequential"))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "control.json").write_text((TIMELINE / "control.json").read_text())
    cand = json.loads((TIMELINE / "candidate.json").read_text())
    cand["gpu_busy_us_per_step"] = -1
    (profiles / "candidate.json").write_text(json.dumps(cand))
    out_dir = tmp_path / "o"
    for folder, want in (
        (tmp_path / "absent", "no such timeline folder"),
        (profiles, f"{profiles / 'candidate.json'}: gpu_busy_us_per_step = -1"),
    ):
        args = ["ablate", "--contract", loaded.path, "--out", str(out_dir), "--timeline", str(folder)]
        out = CliRunner().invoke(_cli(), args)
        assert out.exit_code == 2, out.output
        assert out.output.count("qgate: error:") == 1 and want in out.output and "Traceback" not in out.output
        assert not out_dir.exists()
    assert started == []


def test_a_probe_folder_with_variants_beyond_the_arms_is_matched_not_refused(
    tmp_path: Path, two: LoadedContract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode_probe.py --profile-tokens writes a profile per probe variant (cand-nopdl, control-2, ...):
    run_ablation keeps them all and records which are arms of its design."""
    from qgate.timeline import read_timeline

    profiles = tmp_path / "timeline"
    shutil.copytree(TIMELINE, profiles)
    shutil.copy(TIMELINE / "candidate.json", profiles / "cand-nopdl.json")
    seen: list[Any] = []
    monkeypatch.setattr(ablate, "run_speed", lambda *a, **kw: None)
    monkeypatch.setattr(ablate, "run_quality_arms", lambda *a: {"ran": False, "detail": "-"})
    monkeypatch.setattr(ablate, "analyse", lambda *a: seen.append(a[-1]) or {})
    monkeypatch.setattr(ablate, "write_ablation", lambda rec, out: {})
    ablate.run_ablation(two, tmp_path / "o", timeline=read_timeline(profiles))
    (tl,) = seen
    assert list(tl["against_control"]) == ["cand-nopdl", "candidate"]
    assert {a: m["in_ablation"] for a, m in tl["ablation_arms"].items()} == {
        "control": True,
        "cand-nopdl": False,
        "candidate": True,
    }


def test_report_only_builds_the_report_from_the_results_on_disk_and_starts_no_engine(
    tmp_path: Path, two: LoadedContract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut by its time limit (the H200's of 2026-12-05) is read where there is no GPU: the arms'
    result files make the report, nothing is run; an arm missing is one line naming its file."""
    from qgate.results import ResultError

    factors, arms, speed = synthetic(two)
    for name, res in speed.items():
        path = ablate.arm_path(tmp_path, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res))

    def no_engine(*a: Any, **kw: Any) -> Any:
        raise AssertionError("--report-only started a run")

    for name in ("run_speed", "run_speed_until_decided", "run_quality_arms"):
        monkeypatch.setattr(ablate, name, no_engine)
    rec, paths = ablate.run_ablation(two, tmp_path, "both", report_only=True, max_launches=4)
    assert rec["status"] == "OK", rec["reasons"]
    assert rec["effects"]["alone"]["fp16_gemv"]["decode"]["verdict"] == "regressed"
    assert Path(paths["report"]).is_file()
    ablate.arm_path(tmp_path, arms[-1].name).unlink()
    with pytest.raises(ResultError, match=f"{arms[-1].name}.json"):
        ablate.run_ablation(two, tmp_path, "both", report_only=True, force=True)


@pytest.mark.parametrize("flag", ["--resume", "--until-decided"])
def test_cli_report_only_refuses_flags_that_run_engines_in_one_line(tmp_path: Path, flag: str) -> None:
    loaded = contract(tmp_path, {GEMV: "0"}, {GEMV: "1"})
    args = ["ablate", "--contract", loaded.path, "--out", str(tmp_path / "o"), "--report-only", flag]
    out = CliRunner().invoke(_cli(), args)
    assert out.exit_code == 2 and f"--report-only starts no engine: not with {flag}" in out.output
    assert "Traceback" not in out.output and not (tmp_path / "o").exists()
