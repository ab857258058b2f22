"""The speed gate's audit of the candidate's timed output (qgate.speed.audit, MLPerf's TEST01) without an
engine: which reps are scored, the statistic, the gate's PASS / FAIL / ERROR lines, the child's scoring
loop against a hand-written adapter, the one engine start after the timed launches on the spine, and the
error rates recomputed (seeded) from the margins recorded on the demo model
(tests/fixtures/audit_margins.json, docs/speed-audit.md)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from golden import support

from qgate.results import ids_sha256
from qgate.speed import audit
from qgate.speed.workload import draw, prompt_pool, rep_seed, run_reps


def _diverge(candidate: dict, index: int, at: int, new: list[int]) -> list[int]:
    rep = next(r for r in candidate["reps"] if r["index"] == index)
    rep["token_ids"] = rep["token_ids"][:at] + new
    rep["token_ids_sha256"] = ids_sha256(rep["token_ids"])
    return rep["token_ids"]


def _scored(
    index: int, tokens: list[int], at: int, margins: list[float], prompt: str, arm: str = "candidate"
) -> dict:
    return {
        "index": index, "arm": arm, "prompt_sha256": prompt, "token_ids_sha256": ids_sha256(tokens),
        "from": at, "top_ids": [7] * len(margins), "margins": margins, "seconds": 0.01,
    }  # fmt: skip


def test_reps_that_left_the_controls_tokens_are_scored_from_there_with_the_controls_own() -> None:
    control, candidate = support.load_pair()
    assert audit.audit_items(control, candidate) == []
    tokens = _diverge(candidate, 3, 5, [1, 2, 3])
    cand, own = audit.audit_items(control, candidate)
    assert (cand["arm"], cand["index"], cand["from"], cand["token_ids"]) == ("candidate", 3, 5, tokens)
    assert (own["arm"], own["index"], own["from"]) == ("control", 3, 5)
    assert own["token_ids"] == control["reps"][3]["token_ids"]
    assert cand["prompt_sha256"] == own["prompt_sha256"] == candidate["reps"][3]["prompt_sha256"]
    # already scored (a resumed run): nothing left; other tokens under the same index: scored again
    sha = cand["prompt_sha256"]
    scored = [
        _scored(3, tokens, 5, [0.0] * 3, sha),
        _scored(3, own["token_ids"], 5, [0.0] * 3, sha, "control"),
    ]
    control["audit"] = {"reps": scored}
    assert audit.audit_items(control, candidate) == []
    _diverge(candidate, 3, 6, [9, 9])
    assert [(i["arm"], i["from"]) for i in audit.audit_items(control, candidate)] == [("candidate", 5)]


def _audited(control: dict, candidate: dict, margins: dict[int, tuple[list[float], list[float]]]) -> dict:
    """The control's result with an audit scoring each rep's candidate and own tokens with `margins`."""
    c, t = ({r["index"]: r for r in x["reps"]} for x in (control, candidate))
    reps = []
    for i, (cand, own) in margins.items():
        at = audit.first_divergence(c[i]["token_ids"], t[i]["token_ids"])
        reps.append(_scored(i, t[i]["token_ids"], at, cand, t[i]["prompt_sha256"]))
        reps.append(_scored(i, c[i]["token_ids"], at, own, t[i]["prompt_sha256"], "control"))
    return {**control, "audit": {"reps": reps, "routes": {"fp16_gemv": {"hits": 0}}}}


def test_the_gate_passes_identical_and_plausible_tokens_and_fails_the_implausible() -> None:
    control, candidate = support.load_pair()
    g = audit.audit_gate(control, candidate)
    assert g.passed and "the control's in all 10 reps" in g.detail
    _diverge(candidate, 3, 1, [1] * 7)
    _diverge(candidate, 6, 2, [4] * 6)
    g = audit.audit_gate(control, candidate)
    assert (
        not g.passed
        and g.severity == "error"
        and "no audit scored rep 3's and the control's own (2" in g.detail
    )
    # the control's own decode is as implausible to its prefill as the candidate's tokens: PASS
    stop = [0.0, 9.5, 0.0, 0.0, 0.0, 0.0]  # one token in six: the model's top was a banned stop token
    ok = _audited(control, candidate, {3: ([0.0] + stop, [0.0] + stop), 6: (stop, [0.01] + stop[1:])})
    g = audit.audit_gate(ok, candidate)
    assert (
        g.passed and "2 of 10 reps differ" in g.detail and "finds 2 of the candidate's 13 tokens" in g.detail
    )
    assert "2 of its own decode's 13" in g.detail
    # half the work: most of the candidate's tokens far above the margin, its own near none -> FAIL
    far = [0.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    bad = _audited(control, candidate, {3: ([5.0] * 7, [0.0] * 7), 6: (far, [0.0] * 6)})
    g = audit.audit_gate(bad, candidate)
    assert not g.passed and g.severity == "fail", g.detail
    assert (
        "first: rep 3 position 1, candidate token 1 where the control's top is 7, margin 5.00 nats"
        in g.detail
    )
    reported = audit.audit_gate(bad, candidate, gated=False)
    assert reported.passed and "not gated" in reported.detail
    # the same implausible rate in the control's own tokens: not the candidate's doing
    assert audit.audit_gate(
        _audited(control, candidate, {3: ([5.0] * 7,) * 2, 6: (far, far)}), candidate
    ).passed
    # an audit by an engine in which a route ran is not the control's math; a NaN margin is no margin
    routed = copy.deepcopy(bad)
    routed["audit"]["routes"]["fp16_gemv"]["hits"] = 12
    assert audit.audit_gate(routed, candidate).severity == "error"
    nan = copy.deepcopy(bad)
    nan["audit"]["reps"][1]["margins"][0] = float("nan")
    g = audit.audit_gate(nan, candidate)
    assert not g.passed and g.severity == "error" and "finite" in g.detail
    # the scored tokens must be the candidate's as recorded
    _diverge(candidate, 6, 2, [5] * 6)
    assert "no audit scored rep 6's" in audit.audit_gate(bad, candidate).detail


class _Scorer:
    vocab_size = 50
    special_token_ids = [0, 1]

    def __init__(self) -> None:
        self.scored: list[tuple[list[int], int]] = []

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, prompt_token_ids: list[int], sampling: dict) -> dict:
        raise AssertionError("an audit start decodes nothing")

    def score(self, token_ids: list[int], start: int, exclude: list | None = None) -> list:
        self.scored.append((list(token_ids), start))
        assert exclude == [0, 1]  # ignore_eos: the special tokens are not a top decoding could pick
        return [
            (token_ids[p] if p % 2 else 3, -0.5, -0.5 - (p % 2 == 0)) for p in range(start, len(token_ids))
        ]


def test_the_child_scores_the_reps_prompt_drawn_again_plus_the_candidates_tokens() -> None:
    engine, events = _Scorer(), []
    prompt = draw(prompt_pool(50, [0, 1]), 8, rep_seed(42, 5))
    item = {"index": 5, "prompt_sha256": ids_sha256(prompt), "token_ids": [9, 9, 8, 7], "from": 2}
    spec = {
        "input_tokens": 8, "output_tokens": 4, "greedy": True, "ignore_eos": True, "warmup": 0,
        "reset_prefix_cache": True, "prompt_seed": 42, "launch": 0, "rep_indices": [], "audit": [item],
    }  # fmt: skip
    run_reps(engine, spec, events.append)
    assert engine.scored == [(prompt + [9, 9, 8, 7], 10)]
    (rec,) = [e["audit"] for e in events if e["event"] == "audit"]
    assert (rec["index"], rec["from"], rec["token_ids_sha256"]) == (5, 2, ids_sha256([9, 9, 8, 7]))
    assert rec["margins"] == [1.0, 0.0] and rec["top_ids"] == [3, 7]
    with pytest.raises(Exception, match="does not draw again"):
        run_reps(engine, {**spec, "audit": [{**item, "prompt_sha256": "x"}]}, events.append)


def test_error_rates_are_seeded_and_separate_rounding_from_half_the_work() -> None:
    rng = random.Random(3)

    def rep(rate: float, own: float) -> tuple[list[float], list[float]]:
        return ([9.0 if rng.random() < rate else 0.0 for _ in range(64)],
                [9.0 if rng.random() < own else 0.0 for _ in range(64)])  # fmt: skip

    legit = [rep(0.15, 0.15) for _ in range(50)]
    broken = [rep(0.6, 0.15) for _ in range(50)]
    a = audit.error_rates(legit, broken, reps_per_run=8, runs=300, seed=11)
    assert a == audit.error_rates(legit, broken, reps_per_run=8, runs=300, seed=11)
    assert a["false_fail"] <= 0.01 and a["power"] == 1.0


MARGINS = Path(__file__).parent / "fixtures" / "audit_margins.json"


def test_recorded_margins_of_the_demo_model_reproduce_the_documented_error_rates() -> None:
    """docs/speed-audit.md's rates: the pairs of margins (a candidate rep's, the control's own) that the
    audit recorded on the demo model for legitimate rounding changes and for broken candidates, runs of
    the demo's 8 reps resampled 2,000 times with a fixed seed; and every legitimate rep passes alone."""
    data = json.loads(MARGINS.read_text())
    legit = [tuple(p) for pairs in data["legitimate"].values() for p in pairs]
    broken = [tuple(p) for pairs in data["broken"].values() for p in pairs]
    assert sum(bool(c) for c, _ in legit) >= 1 and sum(bool(c) for c, _ in broken) >= 8
    rates = audit.error_rates(legit, broken, reps_per_run=8, runs=2000, seed=20261204)
    assert (rates["false_fail"], rates["power"]) == (
        data["expected"]["false_fail"],
        data["expected"]["power"],
    )
    assert rates["false_fail"] <= 0.01 and rates["power"] >= 0.99
    for name, pairs in data["broken"].items():  # each broken candidate's own run of 8 reps fails
        cand = [m for c, _ in pairs for m in c]
        own = [m for _, o in pairs for m in o]
        above = [sum(m > audit.IMPLAUSIBLE_NATS for m in x) for x in (cand, own)]
        assert audit.fails(above[0], len(cand), above[1], len(own)), name


class _FakeEngine:
    """One engine start of an arm: greedy tokens a function of the prompt; the candidate's (its env
    switches the GEMV route on) leave them from position 3; scoring gives every token `margin`."""

    vocab_size = 64
    special_token_ids = [0]

    def __init__(self, env: dict, margin: float, scored: list) -> None:
        self.routed, self.margin, self.scored = env.get("VLLM_SM70_QWEN38_FP16_GEMV") == "1", margin, scored

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, prompt: list[int], sampling: dict) -> dict:
        ids = [(sum(prompt) + j) % 60 + 1 for j in range(sampling["max_tokens"])]
        if self.routed:
            ids[3:] = [61] * (len(ids) - 3)
        times = {
            "first_token_ts": 1.0,
            "last_token_ts": 1.1,
            "first_token_latency_s": 0.01,
            "scheduled_ts": 0.99,
        }
        return {"token_ids": ids, "finish_reason": "length", "num_generation_tokens": len(ids), **times}

    def score(self, token_ids: list[int], start: int, exclude: list | None = None) -> list:
        self.scored.append(start)
        return [(5, -0.1, -0.1 - self.margin * (token_ids[p] == 61)) for p in range(start, len(token_ids))]


@pytest.mark.parametrize(("margin", "passed"), [(0.0, True), (5.0, False)])
def test_the_audit_runs_once_after_the_timed_launches_in_the_controls_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, margin: float, passed: bool
) -> None:
    """The spine's real child loop (speed.workload.run_reps) on a fake engine per start: the candidate's
    reps differ from position 3; after both arms' launches one more start, of the control's env, scores
    exactly those reps from there (and its record lands in the control's result); a rerun of the same
    folder with --resume finds nothing left to score: no start."""
    import yaml

    from qgate import models
    from qgate.contract import load_contract
    from qgate.engine import arms
    from qgate.speed.run import run_speed

    data = yaml.safe_load((Path(__file__).parents[1] / "contracts" / "smoke-cpu.yaml").read_text())
    data["speed"].update({"repetitions": 2, "launches": 2, "output_tokens": 6, "input_tokens": 8})
    data["arms"]["candidate"]["env"]["VLLM_SM70_QWEN38_FP16_GEMV"] = "1"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    loaded = load_contract(tmp_path / "c.yaml")
    starts: list[tuple[str, list, int]] = []
    scored: list[int] = []

    def segment(spec, env, log, attest, result, on_event, save, label):  # noqa: ANN001, ANN202
        starts.append((result["arm"], list(spec["rep_indices"]), len(spec.get("audit") or [])))
        on_event({"event": "engine_ready", "fingerprint": {"cpu": "x"}, "engine_start_s": 0.1})
        run_reps(_FakeEngine(dict(env.declared), margin, scored), spec, on_event)
        save(result)
        return result

    monkeypatch.setattr(arms, "run_segment", segment)
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    results = run_speed(loaded, tmp_path / "out")
    # the timed launches in alternating order (engine/order.py: its first order drawn), then the audit
    assert sorted(starts[:4]) == [("candidate", [0, 1], 0), ("candidate", [2, 3], 0), ("control", [0, 1], 0),
                                  ("control", [2, 3], 0)]  # fmt: skip
    assert starts[4][0] == "control-audit" and starts[4][2] == 8
    # prompt + the candidate's tokens, and the control's own, from 3
    assert starts[-1][1] == [] and scored == [8 + 3] * 8
    saved = json.loads((tmp_path / "out" / "speed" / "control.json").read_text())
    assert saved["audit"] == results["control"]["audit"] and len(saved["audit"]["launches"]) == 1
    assert [(a["index"], a["arm"]) for a in saved["audit"]["reps"]] == [
        (i, arm) for i in range(4) for arm in ("candidate", "control")
    ]
    assert len(saved["launches"]) == 2  # the audit's start is not one of the control's timed launches
    candidate = json.loads((tmp_path / "out" / "speed" / "candidate.json").read_text())
    gate = audit.audit_gate(saved, candidate)
    assert gate.passed is passed, gate.detail
    if not passed:
        assert "first: rep 0 position 3, candidate token 61 where the control's top is 5" in gate.detail
    run_speed(loaded, tmp_path / "out", resume=True)
    assert len(starts) == 5
