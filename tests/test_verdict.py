"""qgate.verdict and qgate.compare core: gates, refuse-to-compare, attestation, ERROR on failed statistics."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from golden import support

from qgate import comparable
from qgate import compare as compare_mod
from qgate import gate as gate_mod
from qgate.compare import Pair, build_verdict
from qgate.contract import LoadedContract, parse_contract
from qgate.gate import SEV_ERROR, SEV_INCONCLUSIVE, Gate, decide
from qgate.results import current_schema, ids_sha256
from qgate.speed import gates as vd
from qgate.stats import StatsConfig, compare_samples


@pytest.fixture(autouse=True)
def routes(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = support.standin_routes()
    monkeypatch.setattr(
        comparable, "routes", mod
    )  # the attestation's seam: verdict's plain import of qgate.routes
    return mod


def verdict_of(
    control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract | None = None
) -> dict:
    pair = Pair("speed", control, candidate, "control.json", "candidate.json")
    return build_verdict([pair], [], loaded or support.pinned_contract())


def _with_speed(**speed: Any) -> LoadedContract:
    """The pinned contract with other speed settings (the results' recorded workload must match it)."""
    loaded = support.pinned_contract()
    c = loaded.contract
    assert c.speed is not None
    return loaded.model_copy(
        update={"contract": c.model_copy(update={"speed": c.speed.model_copy(update=speed)})}
    )


def one_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """The fixture pair cut to its first launch: what a run of `launches: 1` records (5 reps per arm)."""
    control, candidate = support.load_pair()
    return support.one_launch(control), support.one_launch(candidate)


def gate(record: dict, prefix: str) -> dict:
    return next(g for g in record["gates"] if g["name"].startswith(prefix))


def test_decide_orders_error_over_fail() -> None:
    ok, bad, broken = (
        Gate("a", True, ""),
        Gate("b", False, "slow"),
        Gate("c", False, "x", SEV_ERROR),
    )
    assert decide([ok]) == ("PASS", [])
    assert decide([ok, bad]) == ("FAIL", ["b: slow"])
    assert decide([bad, broken]) == ("ERROR", ["c: x", "b: slow"])
    assert decide([])[0] == "ERROR"


def test_decide_precedence_error_fail_inconclusive_pass() -> None:
    ok = Gate("a", True, "")
    undecided = Gate("u", False, "measure more", SEV_INCONCLUSIVE)
    bad, broken = Gate("b", False, "slow"), Gate("c", False, "x", SEV_ERROR)
    assert decide([ok, undecided]) == ("INCONCLUSIVE", ["u: measure more"])
    assert decide([undecided, bad]) == ("FAIL", ["b: slow", "u: measure more"])
    assert decide([undecided, bad, broken]) == ("ERROR", ["c: x", "b: slow", "u: measure more"])
    assert decide([Gate("w", False, "?", "weird")])[0] == "ERROR"  # unknown severity fails closed
    assert gate_mod.INCONCLUSIVE == "INCONCLUSIVE" and SEV_INCONCLUSIVE == "inconclusive"


def test_fixture_pair_passes_with_every_gate_listed() -> None:
    rec = verdict_of(*support.load_pair())
    assert rec["verdict"] == "PASS", rec["reasons"]
    assert rec["kind"] == "verdict" and rec["schema_version"] == current_schema("verdict") == 4
    names = [g["name"] for g in rec["gates"]]
    for want in (
        "comparable arms",
        "route fp16_gemv ran in the candidate",
        "no route ran in the control",
        "candidate mean decode >= 55 tok/s",
        "prefill (TTFT) regression <= 10 %",
        "candidate's timed output plausible to the control",
        "decode improvement >= 5 %",
    ):
        assert want in names
    assert rec["stats"]["decode_tok_s"]["verdict"] == "improved"
    assert rec["figures"]["throughput_change_pct"] == pytest.approx((59.943 / 50.129 - 1) * 100)
    across = gate(rec, "decode ratio across engine starts")
    assert across["passed"] and across["detail"].startswith("measured in the run: 2 launches per arm")


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("contract", "sha256", "f" * 64),
        ("model", "config_sha256", "d" * 64),
        ("model", "spec", "other-model"),
        ("prompt", "sha256", "cd" * 32),
        ("fingerprint", "vllm", "0.31.0"),
        ("fingerprint", "torch", "2.12.0+cpu"),
        ("fingerprint", "qgate", "0.2.0"),
        ("fingerprint", "cpu", "Other CPU"),
        ("fingerprint", "gpu", "1x Tesla V100"),
        ("fingerprint", "driver", "550.54"),
        ("workload", "output_tokens", 16),
        ("engine_args", "max_num_seqs", 4),
    ],
)
def test_refuse_to_compare_lists_the_difference(section: str, key: str, value: Any) -> None:
    control, candidate = support.load_pair()
    candidate[section][key] = value
    diffs = comparable.differences(control, candidate, None, ("prompt.sha256", "workload.output_tokens"))
    assert any(d.startswith(f"{section}.{key}") for d in diffs), diffs
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "ERROR"
    assert not gate(rec, "comparable arms")["passed"]
    assert f"{section}.{key}" in gate(rec, "comparable arms")["detail"]


def test_env_hostname_and_commit_do_not_block_a_comparison() -> None:
    control, candidate = support.load_pair()
    assert comparable.differences(control, candidate, support.pinned_contract()) == []
    candidate["fingerprint"]["hostname"] = "bench-2"
    candidate["fingerprint"]["git_sha"] = "abcdef0"
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "PASS"
    assert any("hostname" in n for n in rec["speed"]["notes"])


def test_result_env_must_hold_the_contract_arm_env() -> None:
    control, candidate = support.load_pair()
    candidate["env"]["VLLM_SM70_QWEN38_FP16_GEMV"] = "0"
    diffs = comparable.differences(control, candidate, support.pinned_contract())
    assert diffs == ["env.VLLM_SM70_QWEN38_FP16_GEMV: candidate result '0', contract says '1'"]


def _override_contract(override: dict[str, Any]) -> LoadedContract:
    base = support.pinned_contract()
    data = base.contract.model_dump(mode="json")
    data["arms"]["candidate"]["engine"] = override
    contract = parse_contract(data, Path("override.yaml"))
    return LoadedContract(path="override.yaml", sha256=support.FIXTURE_SHA, contract=contract)


def test_engine_override_declared_by_the_contract_is_accepted() -> None:
    loaded = _override_contract({"enforce_eager": False})
    control, candidate = support.load_pair()
    candidate["engine_args"] = loaded.contract.engine_for("candidate")
    assert comparable.differences(control, candidate, loaded) == []
    # Without the contract in hand the same difference cannot be checked: refused.
    assert comparable.differences(control, candidate, None) == [
        "engine_args.enforce_eager: control True vs candidate False"
    ]
    # A difference other than the declared override is refused even with the contract.
    candidate["engine_args"]["max_num_seqs"] = 2
    assert len(comparable.differences(control, candidate, loaded)) == 2


def test_contract_in_hand_must_be_the_one_the_results_ran() -> None:
    control, candidate = support.load_pair()
    other = LoadedContract(path="x.yaml", sha256="e" * 64, contract=support.pinned_contract().contract)
    diffs = comparable.differences(control, candidate, other)
    assert any("contract in hand" in d for d in diffs)
    assert verdict_of(control, candidate, other)["verdict"] == "ERROR"


def test_gates_fail_on_slow_rep_prefill_regression_and_unstable_tokens() -> None:
    control, candidate = support.load_pair()
    candidate["reps"][2]["decode_tok_s"] = 54.0
    rec = verdict_of(control, candidate)
    # One slow rep is a reported fact; the floor gates the mean (its Welch-t interval clears 55).
    assert gate(rec, "candidate mean decode")["passed"]
    assert "1 of 10 reps below 55" in gate(rec, "candidate mean decode")["detail"]
    control, candidate = support.load_pair()
    for rep in candidate["reps"]:
        rep["decode_tok_s"] -= 10.0  # mean ~49.9, launch means 50.05 / 49.84: shown below 55
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "FAIL"
    floor = gate(rec, "candidate mean decode")
    assert not floor["passed"] and floor["severity"] == "fail" and "shown below the floor" in floor["detail"]

    control, candidate = support.load_pair()
    for rep in candidate["reps"]:
        rep["ttft_ms"] *= 1.2
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "FAIL" and not gate(rec, "prefill (TTFT) regression")["passed"]

    control, candidate = support.load_pair()
    candidate["reps"][4]["token_ids"] = candidate["reps"][4]["token_ids"][:5] + [1, 2, 3]
    candidate["reps"][4]["token_ids_sha256"] = ids_sha256(candidate["reps"][4]["token_ids"])
    tokens = verdict_of(control, candidate)["speed"]["tokens"]
    assert (tokens["diverging_reps"], tokens["first_diverging_rep"], tokens["first_diverging_index"]) == (
        [4],
        4,
        5,
    )
    assert tokens["reps_compared"] == 10 and not tokens["control_vs_candidate_identical"]


@pytest.mark.parametrize(
    ("arm", "change", "says"),
    [
        ("candidate", lambda r: r["reps"][3].update(prompt_sha256=r["reps"][1]["prompt_sha256"]),
         "candidate rep 3 decodes the prompt of rep 1"),
        ("control", lambda r: r["warmups"][1].update(prompt_sha256=r["reps"][7]["prompt_sha256"]),
         "control warm-up 0 of launch 1 decodes the prompt of rep 7"),
        ("candidate", lambda r: r["reps"][6].update(prompt_sha256="ab" * 32),
         "rep 6: the arms decoded different prompts"),
        ("candidate", lambda r: [rep.pop("prompt_sha256") for rep in r["reps"]],
         "candidate rep 0 records no prompt hash (10 of 10 reps; a speed result of schema 1"),
    ],
)  # fmt: skip
def test_a_repeated_or_unpaired_prompt_is_refused(arm: str, change: Any, says: str) -> None:
    """TEST04: a prompt that comes twice in an arm (a rep, a warm-up) lets a result cache answer from
    memory, and arms on different prompts are no pair: ERROR, naming the rep."""
    pair = dict(zip(("control", "candidate"), support.load_pair(), strict=True))
    assert gate(verdict_of(pair["control"], pair["candidate"]), "prompts fresh")["passed"]
    change(pair[arm])
    rec = verdict_of(pair["control"], pair["candidate"])
    prompts = gate(rec, "prompts fresh and paired")
    assert rec["verdict"] == "ERROR" and not prompts["passed"] and prompts["severity"] == "error"
    assert says in prompts["detail"], prompts["detail"]


def test_improvement_gate_needs_a_significant_improvement() -> None:
    control, candidate = support.load_pair()
    for rep, c in zip(candidate["reps"], control["reps"], strict=True):
        rep["decode_tok_s"] = c["decode_tok_s"] * 1.03  # +3 %: significant, below the 5 % gate
    rec = verdict_of(control, candidate)
    assert rec["stats"]["decode_tok_s"]["verdict"] == "improved"
    assert rec["verdict"] == "FAIL" and not gate(rec, "decode improvement >= 5 %")["passed"]


def test_significant_regression_fails_even_without_an_improvement_gate() -> None:
    control, candidate = support.load_pair()
    control["reps"], candidate["reps"] = candidate["reps"], control["reps"]
    rec = verdict_of(control, candidate)
    assert rec["stats"]["decode_tok_s"]["verdict"] == "regressed"
    assert not gate(rec, "no significant decode regression")["passed"]


@pytest.mark.parametrize(
    "breakage",
    ["zero variance", "nan", "missing field", "no reps"],
)
def test_a_statistic_that_cannot_be_computed_is_error_never_pass(breakage: str) -> None:
    control, candidate = support.load_pair()
    if breakage == "zero variance":
        for arm in (control, candidate):
            for rep in arm["reps"]:
                rep["decode_tok_s"] = 60.0
    elif breakage == "nan":
        candidate["reps"][1]["decode_tok_s"] = float("nan")
    elif breakage == "missing field":
        del candidate["reps"][1]["ttft_ms"]
    else:
        candidate["reps"] = []
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "ERROR"


def test_noisy_decode_is_inconclusive_with_a_sample_size() -> None:
    control, candidate = support.load_pair()
    for rep, scale in zip(
        candidate["reps"], (0.7, 1.3, 0.9, 1.2, 0.95, 0.6, 0.5, 0.7, 0.55, 0.65), strict=True
    ):
        rep["decode_tok_s"] *= scale
    # Only the decode statistics on trial: no per-rep floor, no improvement asked for.
    rec = verdict_of(
        control, candidate, _margin_contract(5, min_decode_tok_s=None, min_decode_improvement_pct=None)
    )
    assert rec["stats"]["decode_tok_s"]["verdict"] == "inconclusive"
    g = gate(rec, "decode comparison conclusive")
    assert rec["verdict"] == "INCONCLUSIVE" and not g["passed"] and g["severity"] == "inconclusive"
    ni = rec["figures"]["non_inferiority"]
    # The candidate's rep CV (~22 %) is above the contract's max_cv_pct: no run size decides, and the advice
    # says so instead of naming a size the CV gate would stop again.
    assert ni["outcome"] == "undecided" and ni["needed_units"] is None, ni
    assert ni["advice"]["limited_by"] == "CV limit"
    detail = gate(rec, "decode regression ruled out")["detail"]
    assert "no run of up to 200 launches of 5 reps per arm decides" in detail, detail
    assert "the CV limit stops it" in detail
    # Within the CV limit the advice names a size: at least what was run, and the contract's minimum.
    loose = _margin_contract(8, min_decode_tok_s=None, min_decode_improvement_pct=None)
    data = loose.contract.model_dump(mode="json")
    data["speed"]["stats"]["max_cv_pct"] = 50.0
    loose = LoadedContract(
        path="m.yaml", sha256=support.FIXTURE_SHA, contract=parse_contract(data, Path("m.yaml"))
    )
    control, candidate = support.load_pair()
    for rep, scale in zip(
        candidate["reps"], (0.7, 1.3, 0.9, 1.2, 0.95, 0.65, 1.2, 0.85, 1.1, 0.9), strict=True
    ):
        rep["decode_tok_s"] *= 0.83 * scale  # about as fast as the control, launch means 7 % apart
    rec = verdict_of(control, candidate, loose)
    ni = rec["figures"]["non_inferiority"]
    assert ni["needed_units"] is not None and ni["needed_units"] >= 2, ni
    assert (
        f"a fresh run of {ni['needed_units']} launches of 5 reps per arm (now 2)"
        in gate(rec, "decode regression")["detail"]
    )


def test_a_clear_regression_on_a_noisy_machine_is_fail_not_error() -> None:
    control, candidate = support.load_pair()
    scales = (0.6, 0.75, 0.5, 0.7, 0.62, 0.7, 0.55, 0.72, 0.6, 0.66)
    for rep, c, scale in zip(candidate["reps"], control["reps"], scales, strict=True):
        rep["decode_tok_s"] = c["decode_tok_s"] * scale
    rec = verdict_of(control, candidate)
    decode = rec["stats"]["decode_tok_s"]
    assert decode["candidate"]["cv_pct"] > decode["max_cv_pct"], decode["candidate"]
    assert decode["verdict"] == "regressed" and rec["verdict"] == "FAIL", rec["reasons"]
    assert rec["figures"]["non_inferiority"]["outcome"] == "inferior"


@pytest.mark.parametrize(
    ("launch", "why"),
    [(None, "None"), ("0", "str"), (True, "bool"), (0.5, "float"), (float("nan"), "float")],
)
def test_bad_launch_ids_are_error_with_one_line(launch: Any, why: str) -> None:
    control, candidate = one_pair()
    for arm in (control, candidate):
        arm["workload"].update(launches=5, repetitions=1)
        for i, rep in enumerate(arm["reps"]):
            rep["launch"] = i
    candidate["reps"][2]["launch"] = launch
    rec = verdict_of(control, candidate)
    g = gate(rec, "decode statistics computed")
    assert rec["verdict"] == "ERROR" and not g["passed"]
    assert "candidate reps: launch id" in g["detail"] and why in g["detail"] and "\n" not in g["detail"]


@pytest.mark.parametrize("value", ["fast", True, None, float("nan"), float("inf")])
def test_bad_rep_values_are_error_naming_the_rep(value: Any) -> None:
    control, candidate = support.load_pair()
    control["reps"][3]["decode_tok_s"] = value
    rec = verdict_of(control, candidate)
    g = gate(rec, "decode statistics computed")
    assert rec["verdict"] == "ERROR" and g["detail"].startswith("control rep 3 decode_tok_s = "), g


def test_unbalanced_or_miscounted_launches_are_error() -> None:
    control, candidate = support.load_pair()
    for arm in (control, candidate):
        arm["workload"].update(launches=2, repetitions=2)
        arm["reps"] = arm["reps"][:4]
        for i, rep in enumerate(arm["reps"]):
            rep["launch"] = i // 2
    candidate["reps"][1]["launch"] = 1  # 1 + 3
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "ERROR" and "unbalanced" in gate(rec, "decode statistics computed")["detail"]
    candidate["reps"][1]["launch"] = 7  # three ids
    rec = verdict_of(control, candidate)
    assert "3 distinct launch ids" in gate(rec, "decode statistics computed")["detail"]


def test_incomplete_result_is_error() -> None:
    control, candidate = support.load_pair()
    candidate["complete"] = False
    assert verdict_of(control, candidate)["verdict"] == "ERROR"
    control, candidate = support.load_pair()
    control["reps"] = control["reps"][:4]
    assert verdict_of(control, candidate)["verdict"] == "ERROR"


def test_failed_route_attestation_is_error() -> None:
    control, candidate = support.load_pair()
    candidate["routes"]["fp16_gemv"]["hits"] = 0
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "ERROR" and not gate(rec, "route fp16_gemv ran")["passed"]
    control, candidate = support.load_pair()
    control["routes"]["fp16_gemv"]["hits"] = 3
    assert verdict_of(control, candidate)["verdict"] == "ERROR"


def test_missing_or_broken_attestation_is_error(
    monkeypatch: pytest.MonkeyPatch, routes: types.ModuleType
) -> None:
    control, candidate = support.load_pair()
    del candidate["routes"]
    assert verdict_of(control, candidate)["verdict"] == "ERROR"  # the stand-in raises KeyError
    gates = comparable.attestation(control, candidate)
    assert gates == [
        Gate("route attestation", False, "cannot attest the routes: KeyError: 'routes'", SEV_ERROR)
    ]
    # (qgate.routes is a plain import of qgate.verdict now: "not installed" is no longer a state.)


def test_token_summary_first_diverging_index() -> None:
    control, candidate = support.load_pair()
    assert vd.token_summary(control, candidate)["control_vs_candidate_identical"]
    for rep in candidate["reps"]:
        rep["token_ids"] = rep["token_ids"][:3] + [9, 9, 9, 9, 9]
    tk = vd.token_summary(control, candidate)
    assert (tk["control_vs_candidate_identical"], tk["first_diverging_index"]) == (False, 3)
    for rep in candidate["reps"]:
        rep["token_ids"] = control["reps"][0]["token_ids"][:6]
    assert vd.token_summary(control, candidate)["first_diverging_index"] == 6


def test_launches_are_the_unit_with_variance_components() -> None:
    control, candidate = one_pair()
    for arm in (control, candidate):
        arm["workload"].update(launches=2, repetitions=5)
        second = [
            dict(
                r,
                index=r["index"] + 5,
                decode_tok_s=r["decode_tok_s"] * 1.01,
                prompt_sha256=f"second-{r['index']}",
            )
            for r in arm["reps"]
        ]
        arm["reps"] = arm["reps"] + second
        for i, rep in enumerate(arm["reps"]):
            rep["launch"] = i // 5
    rec = verdict_of(control, candidate, _with_speed(launches=2))
    decode = rec["stats"]["decode_tok_s"]
    assert decode["unit"] == "launch" and decode["launches"] == 2 and decode["control"]["n"] == 10
    comp = rec["figures"]["variance_components"]["control"]
    assert comp["launches"] == 2 and comp["reps_per_launch"] == 5 and comp["unit"] == "launch"
    # The 1 % launch offset is far above the ~0.3 % rep noise: between-launch variance dominates, the
    # arm mean's variance is MSB / (L R) with L - 1 = 1 df.
    assert comp["cv_between_pct"] > 2 * comp["cv_within_pct"] and comp["df"] == 1.0
    # Two launches are no longer always ERROR: +20 % against a 1 % launch offset is decided.
    assert rec["verdict"] == "PASS", rec["reasons"]


def test_statistics_gate_detail_carries_the_error() -> None:
    bad = compare_samples([1.0, 2.0], [1.0, -1.0], StatsConfig())
    good = compare_samples([100, 101, 99, 100.5, 99.5], [100.2, 101.1, 99.3, 100.4, 99.9], StatsConfig())
    assert good.verdict == "no significant change"
    gates = vd.statistics_gates(good, bad)
    assert [g.passed for g in gates] == [True, False, True]
    assert "non-positive" in gates[1].detail


def _quality_result(arm: str, control: dict[str, Any]) -> dict[str, Any]:
    keys = ("contract", "model", "fingerprint", "engine_args", "routes", "env")
    return {"kind": "quality", "schema_version": 1, "arm": arm, **{k: control[k] for k in keys}}


def test_quality_results_dispatch_to_the_quality_comparer(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare.py hands quality pairs to qgate.quality.compare.compare_quality (a stand-in here)."""
    seen = {}

    def compare_quality(control: dict, candidate: dict, contract: Any) -> dict:
        seen["contract"] = contract
        return {"gates": [Gate("matched misses", False, "item 12: 14 vs 13")], "misses": [12]}

    monkeypatch.setattr(compare_mod, "compare_quality", compare_quality)
    control, candidate = support.load_pair()
    qc, qt = _quality_result("control", control), _quality_result("candidate", candidate)
    pairs = [
        Pair("speed", control, candidate, "c.json", "t.json"),
        Pair("quality", qc, qt, "qc.json", "qt.json"),
    ]
    loaded = support.pinned_contract()
    rec = build_verdict(pairs, [], loaded)
    assert seen["contract"] is loaded
    assert rec["verdict"] == "FAIL" and rec["reasons"] == ["quality: matched misses: item 12: 14 vs 13"]
    assert gate(rec, "quality: comparable arms")["passed"]
    # The record holds the comparer's data, not markdown; the report renders the section from it.
    assert rec["quality"]["misses"] == [12] and "markdown" not in rec["quality"]
    assert rec["quality"]["quality_gates"] == [Gate("matched misses", False, "item 12: 14 vs 13").to_dict()]
    from qgate.report import render_markdown

    text = render_markdown(rec)
    assert "## Quality" in text and "| matched misses | FAIL | item 12: 14 vs 13 |" in text


@pytest.mark.parametrize(
    ("severity", "want"),
    [("inconclusive", "INCONCLUSIVE"), ("error", "ERROR"), ("fail", "FAIL"), ("x", "ERROR")],
)
def test_quality_gate_severity_is_carried_through(
    monkeypatch: pytest.MonkeyPatch, severity: str, want: str
) -> None:
    def compare_quality(control: dict, candidate: dict, contract: Any) -> dict:
        # One gate type: an unknown severity is decide()'s ERROR, no longer converted to fail here.
        g = Gate("accuracy", False, "CI too wide", severity)
        return {"gates": [g]}

    monkeypatch.setattr(compare_mod, "compare_quality", compare_quality)
    control, candidate = support.load_pair()
    pair = Pair(
        "quality", _quality_result("control", control), _quality_result("candidate", candidate), "c", "t"
    )
    rec = build_verdict([pair], [], support.pinned_contract())
    assert rec["verdict"] == want, rec["reasons"]


def test_a_kind_on_one_side_only_is_error() -> None:
    control, candidate = support.load_pair()
    rec = build_verdict(
        [Pair("speed", control, candidate, "c", "t")],
        ["quality result only for the control"],
        support.pinned_contract(),
    )
    assert rec["verdict"] == "ERROR" and not gate(rec, "same result kinds")["passed"]


def test_a_quality_comparison_that_fails_is_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def compare_quality(control: dict, candidate: dict, contract: Any) -> dict:
        return {"gates": [], "figures": control["summary"]}  # KeyError: no summary

    monkeypatch.setattr(compare_mod, "compare_quality", compare_quality)
    control, candidate = support.load_pair()
    pair = Pair(
        "quality", _quality_result("control", control), _quality_result("candidate", candidate), "c", "t"
    )
    rec = build_verdict([pair], [], support.pinned_contract())
    assert rec["verdict"] == "ERROR"
    assert "KeyError" in gate(rec, "quality: quality comparison computed")["detail"]


def _margin_contract(margin_pct: float, **gates: Any) -> LoadedContract:
    base = support.pinned_contract()
    data = base.contract.model_dump(mode="json")
    data["speed"]["gates"]["max_decode_regression_pct"] = margin_pct
    data["speed"]["gates"].update(gates)
    contract = parse_contract(data, Path("margin.yaml"))
    return LoadedContract(path="margin.yaml", sha256=support.FIXTURE_SHA, contract=contract)


def test_non_inferiority_needs_the_ci_to_rule_out_a_larger_slowdown() -> None:
    control, candidate = support.load_pair()
    # The candidate is ~3 % slower but noisy: not a significant regression, and not ruled out either.
    for i, (rep, c) in enumerate(zip(candidate["reps"], control["reps"], strict=True)):
        rep["decode_tok_s"] = c["decode_tok_s"] * (0.97 + (0.04 if i % 2 else -0.04))
    only_margin = {"min_decode_improvement_pct": None, "min_decode_tok_s": None}
    rec = verdict_of(control, candidate, _margin_contract(1.0, **only_margin))
    decode = rec["stats"]["decode_tok_s"]
    assert decode["verdict"] != "regressed" and decode["t_ci_low"] < 0.99 < decode["t_ci_high"], decode
    g = gate(rec, "decode regression ruled out beyond 1 %")
    assert not g["passed"] and g["severity"] == "inconclusive" and rec["verdict"] == "INCONCLUSIVE"
    assert "reps per arm" in g["detail"]
    # The same data pass a margin wide enough for the Welch-t lower bound.
    wide = 100 * (1 - decode["t_ci_low"]) + 1
    rec = verdict_of(control, candidate, _margin_contract(wide, **only_margin))
    assert gate(rec, "decode regression ruled out")["passed"]


def test_compare_refuses_an_out_dir_holding_a_report_unless_force(tmp_path: Path) -> None:
    """qgate compare never overwrites an earlier verdict without --force: exit 2, one line naming DIR."""

    from typer.testing import CliRunner

    from qgate.cli.compare import app

    ctrl, cand, contract = support.written_pair(tmp_path)
    out = tmp_path / "out"
    args = [str(a) for a in (ctrl, cand, "--contract", contract, "--out", out)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    before = (out / "verdict.json").read_text()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "Traceback" not in again.output
    assert again.output.count("qgate: error:") == 1
    assert f"{out}: already holds a report (verdict.json, report.md, speed.png)" in again.output
    assert (out / "verdict.json").read_text() == before
    forced = CliRunner().invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.output


def test_constant_ttft_in_both_arms_is_not_an_error() -> None:
    """A TTFT equal in every rep of both arms has no noise: no test is needed, the prefill gate reads
    the median change."""
    control, candidate = support.load_pair()
    for rep in (*control["reps"], *candidate["reps"]):
        rep["ttft_ms"] = 12.0
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "PASS", rec["reasons"]
    g = gate(rec, "prefill (TTFT) statistics computed")
    assert g["passed"] and "constant in both arms" in g["detail"]
    for rep in control["reps"]:
        rep["ttft_ms"] = 11.0  # constant per arm, different: still a median change the gate judges
    assert gate(verdict_of(control, candidate), "prefill (TTFT) statistics computed")["passed"]


def _synthetic_run_arms(kill_after: int | None, slow: float) -> Any:
    """A stand-in for the engine spine (qgate.engine.arms.run_arms) that folds deterministic reps into
    the workload's results the way the spine does, launch-major and interleaved; it raises after
    `kill_after` engine starts (a killed run). For the sequence logic only: tests/test_speed_e2e.py and
    the report's real runs start real engines."""
    from qgate.engine.arms import ArmPlan

    starts = {"n": 0}

    def run_arms(loaded: LoadedContract, out_dir: Path, workload: Any, arms: tuple, **_: Any) -> dict:
        plans = [ArmPlan(a, loaded.contract.env_for(a), loaded.contract.engine_for(a)) for a in arms]
        results = {p.name: workload.open(p, {"spec": "tiny"}) for p in plans}
        for launch in range(workload.launches):
            for p in plans:
                spec = workload.spec(p, launch, results[p.name])
                if spec is None:
                    continue
                if kill_after is not None and starts["n"] >= kill_after:
                    raise RuntimeError("killed")
                starts["n"] += 1
                offset = 1 + 0.02 * ((launch * 7 + len(p.name)) % 5 - 2)  # launch offsets, +-4 %
                for i in spec["rep_indices"]:
                    tok_s = (
                        100.0
                        * offset
                        * (1 + 0.005 * ((i * 3) % 4 - 1.5))
                        * (slow if p.name == "candidate" else 1)
                    )
                    rep = {
                        "index": i,
                        "launch": launch,
                        "decode_tok_s": tok_s,
                        "ttft_ms": 5.0,
                        "tpot_ms": 1000 / tok_s,
                    }
                    workload.on_record(p, results[p.name], {"event": "rep", "rep": rep})
                results[p.name]["fingerprint"] = {}
                if launch == workload.launches - 1:
                    workload.finish(results[p.name])
                    workload.save(p, results[p.name])
        return results

    return run_arms


@pytest.mark.parametrize(("slow", "want"), [(0.6, "FAIL"), (1.0, "PASS")])
def test_until_decided_stops_at_a_decision_and_resume_continues_the_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: float, want: str
) -> None:
    import sys

    from qgate.contract import load_contract
    from qgate.speed import run as speed_run

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import small_contract

    loaded = load_contract(small_contract(tmp_path, output_tokens=16))
    monkeypatch.setattr(speed_run, "run_arms", _synthetic_run_arms(None, slow))
    whole, seq = speed_run.run_speed_until_decided(loaded, tmp_path / "whole", 8)
    assert seq["decision"] == want and seq["stopped_at_launches"] < 8, seq
    assert [x["decision"] for x in seq["looks"]][:-1] == ["continue"] * (len(seq["looks"]) - 1)
    assert (
        whole["control"]["sequential"] == seq
        and whole["control"]["workload"]["launches"] == seq["stopped_at_launches"]
    )
    assert whole["control"]["complete"] and len(whole["control"]["reps"]) == 4 * seq["stopped_at_launches"]
    # Killed after 5 engine starts (in the third launch pair), then resumed: the same looks, the same stop.
    monkeypatch.setattr(speed_run, "run_arms", _synthetic_run_arms(5, slow))
    with pytest.raises(RuntimeError):
        speed_run.run_speed_until_decided(loaded, tmp_path / "killed", 8)
    monkeypatch.setattr(speed_run, "run_arms", _synthetic_run_arms(None, slow))
    with pytest.raises(speed_run.ResultError, match="pass --resume"):
        speed_run.run_speed_until_decided(loaded, tmp_path / "killed", 8)
    with pytest.raises(speed_run.ResultError, match="planned up to 8 launches"):
        speed_run.run_speed_until_decided(loaded, tmp_path / "killed", 9, resume=True)
    _, resumed = speed_run.run_speed_until_decided(loaded, tmp_path / "killed", 8, resume=True)
    assert resumed == seq


# ---- issue 30: results that cannot be what a run measured are refused ---------------------------------


def _broken(edit: str) -> tuple[dict[str, Any], dict[str, Any]]:
    control, candidate = support.load_pair()
    reps = candidate["reps"]
    if edit == "reset not done":
        reps[1]["prefix_cache_reset"] = False
    elif edit == "duplicated index":
        reps[2]["index"] = 1
    elif edit == "duplicated rep":
        reps[3] = dict(reps[0], index=3)
    elif edit == "token sha":
        reps[0]["token_ids"] = [1, 2, 3, 4, 5, 6, 7, 8]  # the sha256 still says the old ids
    elif edit == "fewer reps":  # complete, with the workload edited to match: the contract decides
        candidate["reps"] = reps[:4]
        candidate["workload"]["repetitions"] = 4
    return control, candidate


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("reset not done", "rep 1: prefix_cache_reset = False: the reset was not done"),
        ("duplicated index", "rep index 1 appears twice"),
        ("duplicated rep", "rep 3 is a copy of rep 0"),
        ("token sha", "rep 0: token_ids_sha256 is not the sha256 of its token_ids"),
        ("fewer reps", "4 reps from 1 launches, the contract asks for 5 reps x 2 launches"),
    ],
)
def test_reps_that_cannot_be_a_measurement_are_error(edit: str, says: str) -> None:
    assert verdict_of(*support.load_pair())["verdict"] == "PASS"  # the pair as it is: intact
    rec = verdict_of(*_broken(edit))
    g = gate(rec, "candidate reps intact")
    assert rec["verdict"] == "ERROR" and not g["passed"] and says in g["detail"], g


def test_a_run_until_decided_holds_the_launches_of_its_last_look() -> None:
    """`qgate run speed --until-decided` records the launches its last look ran (here 2, the contract
    says 1): intact with its `sequential` record, refused without it."""
    from qgate.speed import sequential

    control, candidate = one_pair()
    one = _with_speed(launches=1)
    for arm in (control, candidate):
        first = [dict(r, launch=0) for r in arm["reps"]]
        more = [
            dict(r, index=r["index"] + len(first), launch=1, decode_tok_s=r["decode_tok_s"] * 1.01)
            for r in first
        ]
        arm["reps"], arm["workload"]["launches"] = first + more, 2
    g = gate(verdict_of(control, candidate, one), "candidate reps intact")
    assert not g["passed"] and "workload.launches = 2, the contract says 1" in g["detail"], g
    look = sequential.Look(1, 2, 1.0, 0.95, 1.05, 2.0, 8.0, 1.0, 1.0, "PASS", "shown")
    for arm in (control, candidate):
        arm["sequential"] = sequential.record(sequential.Design.plan(0.05, 2, 4), [look])
    g = gate(verdict_of(control, candidate, one), "candidate reps intact")
    assert g["passed"], g
    candidate["reps"] = candidate["reps"][:-1]  # one rep short of 2 launches x 5 reps
    g = gate(verdict_of(control, candidate, one), "candidate reps intact")
    assert not g["passed"] and "the contract asks for 5 reps x 2 launches" in g["detail"], g


def test_inherited_env_must_agree_outside_the_arms_declared_keys() -> None:
    control, candidate = support.load_pair()
    for arm in (control, candidate):
        arm["inherited_env"] = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert verdict_of(control, candidate)["verdict"] == "PASS"
    candidate["inherited_env"]["OMP_NUM_THREADS"] = "2"
    rec = verdict_of(control, candidate)
    assert rec["verdict"] == "ERROR"
    assert (
        "inherited_env.OMP_NUM_THREADS: control '1' vs candidate '2'"
        in gate(rec, "comparable arms")["detail"]
    )
    # A key an arm's contract env sets is the arms' declared difference, not the shell's.
    candidate["inherited_env"]["OMP_NUM_THREADS"] = "1"
    control["inherited_env"]["VLLM_SM70_QWEN38_FP16_GEMV"] = "1"
    assert verdict_of(control, candidate)["verdict"] == "PASS"
    del candidate["inherited_env"]
    assert (
        "one result does not record it" in gate(verdict_of(control, candidate), "comparable arms")["detail"]
    )
