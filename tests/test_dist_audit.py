"""The distribution audit (qgate.speed.dist_audit) and the repetition gate (qgate.speed.repetition, TEST04)
without an engine: which positions are compared, the rule's PASS / FAIL / INCONCLUSIVE / ERROR lines,
the stated power, and the error rates recomputed (seeded) from the positions recorded on the demo model
(qgate.speed.dist_calibration, docs/speed-audit.md)."""

from __future__ import annotations

import random

import pytest

from qgate.gate import SEV_ERROR, SEV_FAIL, SEV_INCONCLUSIVE
from qgate.speed import dist_audit as da
from qgate.speed import repetition as rp
from qgate.speed.dist_calibration import MODELS

K = 8
# The reps a verdict of each calibrated model's contract compares (demo-cpu.yaml: 4 launches x 2).
REPS = {"demo": 8, "prod-shape-bf16": 4, "prod-shape-fp16": 4}


def _rows(rng: random.Random, n: int) -> list[list[int]]:
    return [rng.sample(range(1000), K) for _ in range(n)]


def _pair(reps: int = 4, n: int = 16, seed: int = 0) -> tuple[dict, dict]:
    """Control and candidate results whose reps decode the same tokens with the same top-k lists."""
    rng = random.Random(seed)
    c_reps, t_reps = [], []
    for i in range(reps):
        rows = _rows(rng, n)
        tokens = [r[0] for r in rows]
        c_reps.append({"index": i, "launch": 0, "token_ids": tokens, "top_ids": rows})
        t_reps.append(
            {"index": i, "launch": 0, "token_ids": list(tokens), "top_ids": [list(r) for r in rows]}
        )
    return {"reps": c_reps}, {"reps": t_reps}


def test_discordant_needs_a_top_m_token_missing_from_the_other_top_k():
    base = list(range(K))
    assert not da.discordant(base, base)
    # near-ties reordered inside the top 3, or beyond it: the same model rounded otherwise
    assert not da.discordant(base, [1, 0, 2, 3, 4, 5, 7, 6])
    assert not da.discordant(base, [0, 1, 2, 3, 4, 5, 6, 99])  # the k-th swapped for a k+1-th
    assert da.discordant(base, [0, 1, 99, 3, 4, 5, 6, 7])  # the control's 3rd gone from the top k
    assert da.discordant(base, [0, 99, 1, 2, 3, 4, 5, 6])  # a token the control's top k lacks in the top 3


def test_positions_compared_end_at_the_first_divergence_inclusive():
    control, candidate = _pair(reps=2, n=16)
    rep = candidate["reps"][1]
    rep["token_ids"] = rep["token_ids"][:5] + [9999] * 11  # leaves the control's tokens at position 5
    for j in range(5, 16):  # after it the prefixes differ: nothing there may count
        rep["top_ids"][j] = [900 + j] * K
    reps, missing = da.compared(control, candidate)
    assert missing == []
    assert [(r["positions"], r["discordant"]) for r in reps] == [(16, []), (6, [5])]


def test_an_honest_run_passes_and_states_its_power():
    control, candidate = _pair(reps=8, n=32)
    control["model"] = {"spec": "tiny-trained-wide"}
    gate, s = da.dist_gate(control, candidate, K)
    assert gate.passed, gate.detail
    assert s["positions"] == 256 and s["discordant"] == 0
    assert s["power_calibration"] == "measured on this model (demo)" and min(s["power"].values()) >= 0.99
    assert "against the weakest named corruption" in gate.detail


def test_a_changed_distribution_fails_naming_the_first_position():
    control, candidate = _pair(reps=4, n=32)
    rng = random.Random(7)
    for rep in candidate["reps"]:  # the argmax kept (same tokens), the rest of the list another model's
        rep["top_ids"] = [[row[0], *rng.sample(range(2000, 3000), K - 1)] for row in rep["top_ids"]]
    gate, s = da.dist_gate(control, candidate, K)
    assert not gate.passed and gate.severity == SEV_FAIL
    assert "first: rep 0 position 0" in gate.detail
    assert s["discordant"] == 128
    ungated, _ = da.dist_gate(control, candidate, K, gated=False)
    assert ungated.passed and "not gated" in ungated.detail


def test_a_few_honest_discordant_positions_do_not_fail():
    control, candidate = _pair(reps=8, n=64)
    for rep in candidate["reps"][:2]:  # one near-tie pushed out of the top k in two reps
        rep["top_ids"][3] = [rep["top_ids"][3][0], rep["top_ids"][3][1], 5000, *rep["top_ids"][3][3:]]
    gate, s = da.dist_gate(control, candidate, K)
    assert s["discordant"] == 2 and gate.passed, gate.detail


def test_too_few_reps_is_inconclusive_never_a_quiet_pass():
    control, candidate = _pair(reps=2, n=8)
    gate, s = da.dist_gate(control, candidate, K)
    assert not gate.passed and gate.severity == SEV_INCONCLUSIVE, gate.detail
    assert s["power_calibration"].startswith("not measured on this model")


def test_reps_without_top_k_are_an_error_and_an_unset_audit_says_so():
    control, candidate = _pair(reps=4, n=8)
    del candidate["reps"][2]["top_ids"]
    gate, _ = da.dist_gate(control, candidate, K)
    assert not gate.passed and gate.severity == SEV_ERROR and "rep 2" in gate.detail
    gate, s = da.dist_gate(control, candidate, None)
    assert gate.passed and "not run" in gate.detail and s is None


def test_power_and_critical_count():
    assert da.critical(4) == 3 and da.critical(2) is None
    assert da.power(4, [(5, 5)]) == 1.0 and da.power(2, [(1, 1)]) == 0.0 and da.power(8, [(512, 0)]) == 0.0
    assert da.fails(3, 4) and not da.fails(2, 4) and not da.fails(3, 3000)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_error_rates_on_the_recorded_positions(model):
    """The rule's false FAIL on honest candidates and its power on each named corruption, from the
    (positions, discordant) pairs recorded on each calibrated model at the reps its contract runs
    (docs/speed-audit.md's table): false FAIL <= 0.1 %, power >= 99 %."""
    entry = MODELS[model]
    honest = [tuple(p) for reps in entry["honest"].values() for p in reps]
    for kind, reps in entry["corrupt"].items():
        rates = da.error_rates(honest, [tuple(p) for p in reps], REPS[model], runs=4000, seed=59)
        assert rates["false_fail"] <= 0.001, (kind, rates)
        assert rates["power"] >= 0.99, (kind, rates)


def _arm(gains: list[float], cpu: bool = True) -> dict:
    reps, repeats = [], []
    for i, g in enumerate(gains):
        reps.append({"index": i, "launch": i, "cpu_s": 10.0, "token_ids_sha256": "a", "decode_tok_s": 50.0,
                     "output_tokens": 512})  # fmt: skip
        repeats.append({"index": i, "launch": i, "cpu_s": 10.0 / g, "token_ids_sha256": "a",
                        "decode_tok_s": 50.0 * g, "output_tokens": 512, "repeat": 0})  # fmt: skip
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if cpu else {}
    return {"env": env, "reps": reps, "repeats": repeats}


def test_repetition_gate_fails_a_cache_and_passes_noise():
    gate, s = rp.repetition_gate(_arm([1.0, 0.97, 1.04]), _arm([1.02, 1.05, 0.96]), 1)
    assert gate.passed, gate.detail
    assert s["cost"] == "cpu_s"
    gate, s = rp.repetition_gate(_arm([1.0, 0.97, 1.04], cpu=False), _arm([2.4, 2.9, 2.2], cpu=False), 1)
    assert not gate.passed and gate.severity == SEV_FAIL and "result cache" in gate.detail
    assert s["cost"] == "decode_s"
    gate, s = rp.repetition_gate(_arm([1.0, 0.97, 1.04]), _arm([2.4, 2.9, 2.2]), 1)  # on a CPU: reported
    assert gate.passed and "not gated on a CPU" in gate.detail and s["cost"] == "cpu_s"
    gate, s = rp.repetition_gate(_arm([1.0], cpu=False), _arm([1.1], cpu=False), 1)
    assert gate.passed and s["cost"] == "decode_s"


@pytest.mark.parametrize("broken", ["missing", "nan", "orphan"])
def test_repetition_gate_errors_where_it_cannot_compute(broken):
    control, candidate = _arm([1.0, 1.0]), _arm([1.0, 1.0])
    if broken == "missing":
        candidate["repeats"] = []
    elif broken == "nan":
        candidate["repeats"][0]["cpu_s"] = float("nan")
    else:
        candidate["repeats"][0]["launch"] = 7
    gate, _ = rp.repetition_gate(control, candidate, 1)
    assert not gate.passed and gate.severity == SEV_ERROR, gate.detail
    gate, _ = rp.repetition_gate(control, candidate, None)
    assert gate.passed and "not run" in gate.detail
