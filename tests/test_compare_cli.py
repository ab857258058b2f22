"""`qgate compare` through Typer's CliRunner: exit codes, inputs as files or run directories, outputs."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qgate import routes
from qgate.cli.compare import app

_spec = importlib.util.spec_from_file_location(
    "golden_support", Path(__file__).parent / "golden" / "support.py"
)
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)
runner = CliRunner()


@pytest.fixture
def contract(tmp_path: Path) -> Path:
    path = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, path)
    return path


def pair_files(tmp_path: Path, contract: Path, edit=None) -> tuple[Path, Path]:
    control, candidate = (support.rehash(r, contract) for r in support.load_pair())
    if edit is not None:
        edit(control, candidate)
    return (
        support.write_json(tmp_path / "a" / "control.json", control),
        support.write_json(tmp_path / "b" / "candidate.json", candidate),
    )


def invoke(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_pass_exits_0_and_writes_report_json_and_png(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    out = tmp_path / "out"
    res = invoke(ctrl, cand, "--contract", contract, "--out", out)
    assert res.exit_code == 0, res.output
    assert "verdict: PASS" in res.output and str(out / "report.md") in res.output
    record = json.loads((out / "verdict.json").read_text())
    assert (record["kind"], record["schema_version"], record["verdict"]) == ("verdict", 2, "PASS")
    assert {"name", "passed", "detail"} <= set(record["gates"][0])
    assert record["stats"]["decode_tok_s"]["welch_p"] < 0.05
    assert (out / "report.md").read_text().startswith("# qgate verdict: PASS")
    assert (out / "speed.png").read_bytes()[:4] == b"\x89PNG"


def test_run_directories_pick_each_arm(tmp_path: Path, contract: Path) -> None:
    control, candidate = (support.rehash(r, contract) for r in support.load_pair())
    for run, arm, data in (("run1", "control", control), ("run2", "candidate", candidate)):
        support.write_json(tmp_path / run / "speed" / f"{arm}.json", data)
    # A decoy candidate in the control's run directory must not be used.
    support.write_json(tmp_path / "run1" / "speed" / "candidate.json", {"kind": "speed", "schema_version": 1})
    res = invoke(tmp_path / "run1", tmp_path / "run2", "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    inputs = json.loads((tmp_path / "out" / "verdict.json").read_text())["inputs"]["speed"]
    assert inputs["control"].endswith("run1/speed/control.json")
    assert inputs["candidate"].endswith("run2/speed/candidate.json")


def test_contract_defaults_to_the_one_the_results_name(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    res = invoke(ctrl, cand, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output


def test_fail_exits_1(tmp_path: Path, contract: Path) -> None:
    def slow_rep(control: dict, candidate: dict) -> None:
        for rep in candidate["reps"]:  # the candidate's mean shown below the 55 tok/s floor
            rep["decode_tok_s"] -= 7.0

    ctrl, cand = pair_files(tmp_path, contract, slow_rep)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 1, res.output
    assert "verdict: FAIL" in res.output and "candidate mean decode >= 55 tok/s" in res.output


def test_mismatched_arms_exit_3_and_list_differences(tmp_path: Path, contract: Path) -> None:
    def other_vllm(control: dict, candidate: dict) -> None:
        candidate["fingerprint"]["vllm"] = "0.31.0"
        candidate["model"]["config_sha256"] = "1" * 64

    ctrl, cand = pair_files(tmp_path, contract, other_vllm)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "refuse to compare" in res.output
    assert "fingerprint.vllm" in res.output and "model.config_sha256" in res.output
    assert json.loads((tmp_path / "out" / "verdict.json").read_text())["verdict"] == "ERROR"


def test_statistic_that_cannot_be_computed_exits_3(tmp_path: Path, contract: Path) -> None:
    def constant(control: dict, candidate: dict) -> None:
        for arm in (control, candidate):
            for rep in arm["reps"]:
                rep["decode_tok_s"] = 60.0

    ctrl, cand = pair_files(tmp_path, contract, constant)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "zero variance" in res.output


def test_contract_hash_mismatch_exits_3(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    other = tmp_path / "other.yaml"
    other.write_text(contract.read_text().replace("min_decode_tok_s: 55", "min_decode_tok_s: 40"))
    res = invoke(ctrl, cand, "--contract", other, "--out", tmp_path / "out")
    assert res.exit_code == 3, res.output
    assert "contract in hand" in res.output


@pytest.mark.parametrize(
    "case", ["missing file", "bad json", "bad contract", "no speed section", "no out", "verdict as input"]
)
def test_usage_and_contract_errors_exit_2_with_one_line(tmp_path: Path, contract: Path, case: str) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    args: list[object] = [ctrl, cand, "--contract", contract, "--out", tmp_path / "out"]
    if case == "missing file":
        args[1] = tmp_path / "nope.json"
    elif case == "bad json":
        cand.write_text("{not json")
    elif case == "bad contract":
        contract.write_text(contract.read_text().replace("repetitions: 5", "repetitions: five"))
    elif case == "no speed section":
        text = contract.read_text()
        contract.write_text(text[: text.index("speed:")])
    elif case == "verdict as input":
        support.write_json(cand, {"kind": "verdict", "schema_version": 1})
    else:
        args = args[:4]
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    if case != "no out":
        assert res.output.count("qgate: error:") == 1
    assert not (tmp_path / "out" / "verdict.json").exists()


def test_fixture_pair_passes_with_the_real_route_attestation(tmp_path: Path, contract: Path) -> None:
    ctrl, cand = pair_files(tmp_path, contract)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output


# ---- issue 30: comparisons that are not one are refused (one line, exit 2) ---------------------------


def test_the_same_file_as_both_arms_is_refused(tmp_path: Path, contract: Path) -> None:
    ctrl, _ = pair_files(tmp_path, contract)
    res = invoke(ctrl, ctrl, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "the same file as control and candidate" in res.output, res.output
    assert not (tmp_path / "out" / "verdict.json").exists()


def test_a_copy_of_one_run_as_the_other_arm_is_refused(tmp_path: Path, contract: Path) -> None:
    ctrl, _ = pair_files(tmp_path, contract)
    copy = json.loads(ctrl.read_text())
    copy.update(arm="candidate", env={"VLLM_SM70_QWEN38_FP16_GEMV": "1"})
    cand = support.write_json(tmp_path / "c" / "candidate.json", copy)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "the same run" in res.output, res.output


def test_an_aa_must_be_asked_for(tmp_path: Path, contract: Path) -> None:
    def same_env(control: dict, candidate: dict) -> None:
        candidate["env"] = dict(control["env"])

    ctrl, cand = pair_files(tmp_path, contract, same_env)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "A/A" in res.output and "--aa" in res.output, res.output
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out", "--aa")
    assert "pass --aa" not in res.output and (tmp_path / "out" / "verdict.json").exists(), res.output
    assert json.loads((tmp_path / "out" / "verdict.json").read_text())["aa"] is True


def test_an_unwritable_out_is_one_line_exit_2(tmp_path: Path, contract: Path) -> None:
    # A folder under a file cannot be made, whoever runs the test (root ignores a read-only mode).
    ctrl, cand = pair_files(tmp_path, contract)
    (tmp_path / "a-file").write_text("x")
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "a-file" / "out")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and str(tmp_path / "a-file") in res.output, res.output


# ---- real vLLM on the CPU (tiny model); no mock anywhere -------------------------------------------
# The shared smoke run (conftest.speed_run) is compared in test_speed_e2e.py, the module that reads it
# (one module, one xdist worker). The two calibration tests need their own engine starts: each has
# its own candidate env (none, a 5 ms step delay) and so its own contract, and compare
# refuses results run under another contract (contract.sha256); within a test both arms come from one
# `qgate run` with interleaved launches, which is what the verdict assumes.


def _real_contract(tmp: Path, name: str, candidate_env: dict[str, str] | None, **speed: object) -> Path:
    # The in-process engine (small_contract) in both arms: the subject is the statistics on real decode
    # timings of real engine starts, not vLLM's process layout.
    from conftest import small_contract

    path = small_contract(tmp, name, **speed)
    data = yaml.safe_load(path.read_text())
    data["name"] = name.removesuffix(".yaml")
    # The candidate is the control plus candidate_env (None: an A/A, the candidate is the control).
    data["arms"]["candidate"]["env"] = dict(data["arms"]["control"]["env"]) | (candidate_env or {})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_and_compare(
    tmp: Path, contract: Path, env: dict[str, str] | None = None, aa: bool = False
) -> tuple[int, dict, str]:
    from conftest import qgate

    out = tmp / "run"
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cmp = qgate("compare", str(out), str(out), "--out", str(tmp / "cmp"), *(["--aa"] if aa else []))
    assert cmp.returncode in (0, 1, 3, 4), cmp.stderr[-3000:]
    return cmp.returncode, json.loads((tmp / "cmp" / "verdict.json").read_text()), cmp.stdout


def _slow_step_env(delay_ms: float) -> dict[str, str]:
    """A known per-step delay, added to the control's env (tests/fixtures/slow_step: no route involved)."""
    return {
        "PYTHONPATH": str(Path(__file__).parent / "fixtures" / "slow_step"),
        "QGATE_SLOW_STEP_MS": str(delay_ms),
    }


# A busy wait before every model step (one decoded token at batch one). In the multi-process engine vLLM
# overlaps the model step with the output processing of the previous one, so a wait cost less than its
# length and depended on the load (0.5 ms: -8.7 % quiet to -24 % at load ~4). The in-process engine
# these tests run (conftest.IN_PROCESS_ENGINE) has nothing to overlap. It decoded the tiny model at
# ~900-1000 tok/s (~1 ms a token) where this was first measured, and at ~120-175 tok/s (~6-8 ms) on the
# 2-core machine of 2 Dec 2026, with or without qgate's plugin (VLLM_PLUGINS=""), where a 1.0 ms wait
# was -0.2 to -13 %: 5.0 ms is "at least 25 %" at either speed (about -40 % at 150 tok/s, -80 % at
# 1000).
STEP_MS_25 = 5.0


def _print_figures(label: str, record: dict) -> None:
    figs, decode = record["figures"], record["stats"]["decode_tok_s"]
    comps = figs["variance_components"]
    parts = [
        f"{arm}: between CV {c['cv_between_pct']}, within CV {c['cv_within_pct']}, df {c['df']}"
        for arm, c in comps.items()
        if c
    ]
    print(
        f"\n{label}: {record['verdict']}; decode change {figs['throughput_change_pct']:+.2f} %, "
        f"Welch-t CI [{decode['t_ci_low']:.4f}, {decode['t_ci_high']:.4f}], "
        f"NI {figs['non_inferiority']['outcome']}; {'; '.join(parts)}; "
        f"sample size: {figs['non_inferiority']['sample_size']}"
    )


@pytest.mark.vllm
def test_real_aa_at_the_2_percent_margin_follows_its_ci(tmp_path: Path) -> None:
    """The same env in both arms, two interleaved engine starts each, judged at the production
    contract's 2 % margin: never improved or regressed, never FAIL; the verdict is the one its own
    Welch-t CI of the decode ratio gives against 0.98 (PASS only when the whole interval is above,
    else INCONCLUSIVE with a sample-size estimate in the record and the report), the exit code follows,
    and the variance components of both arms are reported.

    Not alone on the machine: it runs beside the other xdist worker's engines, the kind of load whose
    launch offsets the launch as the unit is there for (df ~1-2 per arm: a false change needs |t| > 4.3).
    The A/A is also the 2 % margin's test: a real run whose CI against 0.98 can fall on either side of
    it (a run with a 0.03 ms wait per step did that, in the multi-process engine -17.6 % to +18.8 % on
    fresh-clone CI machines, so its assertions were these); calibration against known effects is
    test_stats' simulations and the 25 % test here.
    """
    contract = _real_contract(tmp_path, "aa-cpu.yaml", None, output_tokens=128, launches=2, repetitions=4)
    data = yaml.safe_load(contract.read_text())
    data["speed"]["gates"]["max_decode_regression_pct"] = 2
    contract.write_text(yaml.safe_dump(data, sort_keys=False))
    code, record, stdout = _run_and_compare(tmp_path, contract, aa=True)
    _print_figures("real A/A, 2 x 4, margin 2 %", record)
    decode, ni = record["stats"]["decode_tok_s"], record["figures"]["non_inferiority"]
    assert decode["verdict"] in ("no significant change", "inconclusive"), decode["reason"]
    assert record["verdict"] in ("PASS", "INCONCLUSIVE"), record["reasons"]
    assert code == {"PASS": 0, "INCONCLUSIVE": 4}[record["verdict"]]
    assert decode["unit"] == "launch" and record["speed"]["tokens"]["control_vs_candidate_identical"]
    low, high = decode["t_ci_low"], decode["t_ci_high"]
    outcome = "shown" if low > 0.98 else "inferior" if high < 0.98 else "undecided"
    assert ni["outcome"] == outcome, (low, high, ni)
    # The margin's gate follows the CI; a PASS needs it (another gate, the contract's decode floor or
    # the decode comparison's own conclusiveness, may still hold a shown margin at INCONCLUSIVE).
    gate = next(g for g in record["gates"] if g["name"] == "decode regression ruled out beyond 2 %")
    assert gate["passed"] == (outcome == "shown"), (gate, low, high)
    assert record["verdict"] != "PASS" or outcome == "shown", (record["reasons"], low, high)
    if record["verdict"] == "INCONCLUSIVE":
        assert "per arm" in ni["sample_size"]
        assert "per arm" in (tmp_path / "cmp" / "report.md").read_text()
    comp = record["figures"]["variance_components"]["control"]
    assert comp["cv_between_pct"] is not None and comp["cv_within_pct"] is not None


@pytest.mark.vllm
def test_real_25_percent_slowdown_is_fail(tmp_path: Path) -> None:
    """Known effect: at least a 25 % decode slowdown (a busy wait before every model step); three starts
    per arm.

    In the in-process engine the 5.0 ms wait is about -40 % or more (see STEP_MS_25), and its launches spread
    by CV 2-4 % when the machine is quiet: three starts decide that (Welch-t on launch means, df ~4,
    the effect over 6 standard errors at a launch CV of 10 %). docs/compare.md's simulation (L = 3
    finds a 25 % slowdown at CV 15 % in about three quarters of the runs) is the harder case. So the
    test asks for FAIL when the run's launch offsets are within 8 %; when another job on the machine
    (or the other xdist worker: this test runs beside it, measured there FAIL at CI [0.46, 0.50]) shifts
    whole engine starts by more, an honest INCONCLUSIVE with its sample size is what it must say. Never
    PASS, never ERROR.
    """
    contract = _real_contract(
        tmp_path, "slow25-cpu.yaml", _slow_step_env(STEP_MS_25), output_tokens=128, launches=3, repetitions=3
    )
    code, record, stdout = _run_and_compare(tmp_path, contract)
    _print_figures("real 25 % slowdown, 3 x 3", record)
    assert record["speed"]["tokens"]["control_vs_candidate_identical"]
    assert record["figures"]["throughput_change_pct"] < -10
    between = max(c["cv_between_pct"] or 0.0 for c in record["figures"]["variance_components"].values())
    if between <= 8.0:
        assert record["verdict"] == "FAIL" and code == 1 and "verdict: FAIL" in stdout, record["reasons"]
        decode = record["stats"]["decode_tok_s"]
        assert (
            decode["verdict"] == "regressed" or record["figures"]["non_inferiority"]["outcome"] == "inferior"
        )
    else:
        assert record["verdict"] in ("FAIL", "INCONCLUSIVE") and code in (1, 4), record["reasons"]
        if record["verdict"] == "INCONCLUSIVE":
            assert "per arm" in record["figures"]["non_inferiority"]["sample_size"]


# ---- the SM70 Qwen3.8 kernel PR's numbers on the production contract (issue 16) -------------------------

PR_CONTROL_TOK_S = [65.872, 65.882, 65.856, 65.855, 65.853]
PR_CANDIDATE_TOK_S = [80.367, 80.451, 80.463, 81.560, 80.822]
PR_TTFT_MEDIAN_MS = {"control": 2777.6, "candidate": 2766.4}  # warm prefill medians, as published


def _pr_result(arm: str, tok_s: list[float], loaded: object) -> dict:
    """A speed result of one arm of the PR, under the production contract (its hash, engine args, env)."""
    control, _ = support.load_pair()
    result = json.loads(json.dumps(control))
    c = loaded.contract
    result.update(arm=arm, env=c.env_for(arm), engine_args=c.engine_for(arm))
    result["contract"] = {"name": c.name, "version": c.version, "sha256": loaded.sha256, "path": loaded.path}
    result["model"] = {"spec": c.model, "path": c.model, "config_sha256": "c0ffee" + "0" * 58}
    result["fingerprint"].update(gpu="4x Tesla V100-SXM2-32GB", driver="550.54.15")
    result["prompt"].update(input_tokens=c.speed.input_tokens, seed=c.speed.prompt_seed)
    w = c.speed
    result["workload"] = {
        "output_tokens": w.output_tokens,
        "greedy": w.greedy,
        "ignore_eos": w.ignore_eos,
        "warmup": w.warmup,
        "repetitions": w.repetitions,
        "reset_prefix_cache": w.reset_prefix_cache,
        "launches": w.launches,
    }
    # The PR publishes only the TTFT medians: each rep gets the median, +-0.1 ms so the spread is not 0.
    median = PR_TTFT_MEDIAN_MS[arm]
    for rep, tok, dt in zip(result["reps"], tok_s, (0.0, -0.1, 0.1, -0.1, 0.1), strict=True):
        rep.update(decode_tok_s=tok, tpot_ms=1000.0 / tok, ttft_ms=median + dt, launch=0)
        rep["token_ids"] = control["reps"][0]["token_ids"]
    on = arm == "candidate"
    listed = routes.listed_roles(c.env_for(arm))  # the contract's GEMV roles: each must show hits
    result["routes"] = {
        route: (
            {"hits": 96, "fallbacks": {}, "roles": dict.fromkeys(listed.get(route, ["decode"]), 96)}
            if on
            else {"hits": 0, "fallbacks": {}}
        )
        for route, var in support.STANDIN_ROUTES.items()
        if var in c.env_for(arm)
    }
    return result


def test_the_sm70_pr_numbers_pass_the_production_contract(tmp_path: Path) -> None:
    """The PR that qgate's contracts come from: +22.57 % decode, -18.41 % TPOT (its table), PASS."""
    from qgate.contract import load_contract

    contract = Path(__file__).resolve().parents[1] / "contracts" / "qwen38-sm70-tp4-decode.yaml"
    loaded = load_contract(contract)
    ctrl = support.write_json(tmp_path / "control.json", _pr_result("control", PR_CONTROL_TOK_S, loaded))
    cand = support.write_json(
        tmp_path / "candidate.json", _pr_result("candidate", PR_CANDIDATE_TOK_S, loaded)
    )
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    record = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert res.exit_code == 0 and record["verdict"] == "PASS", res.output
    figs = record["figures"]
    # The PR's table truncates to two decimals: +22.5754 % and -18.4152 %.
    assert 22.57 <= figs["throughput_change_pct"] < 22.58 and -18.42 < figs["tpot_change_pct"] <= -18.41
    assert figs["non_inferiority"]["outcome"] == "shown" and figs["non_inferiority"]["bound"] > 1.2
    assert record["stats"]["decode_tok_s"]["verdict"] == "improved"
    gates = {g["name"]: g["passed"] for g in record["gates"]}
    assert gates["decode regression ruled out beyond 2 %"] and gates["candidate mean decode >= 80 tok/s"]
