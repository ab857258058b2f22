"""Quality gates, the paired test and the miss table on hand-made item records (no engine)."""

from __future__ import annotations

from pathlib import Path

from qgate.contract import LoadedContract, load_contract
from qgate.quality.compare import compare_quality, miss_table
from qgate.quality.gates import new_misses, summarize, weighted_decode_tok_s
from qgate.quality.scoring import score_output
from qgate.report.quality import render_quality

CONTRACT = Path(__file__).resolve().parents[1] / "contracts" / "quality-cpu.yaml"
FORMATS = ["hash", "boxed", "final_answer"]


def _md(out: dict) -> str:
    """The report's quality section, rendered from the comparison's data (the record holds no markdown)."""
    assert "markdown" not in out
    return render_quality(out, out["gates"])


def _item(index: int, gold: str, text: str, finish: str = "stop", tokens: int = 20) -> dict:
    ids = list(range(tokens))
    rec = {"index": index, "gold": gold, "output": text, "token_ids": ids, "output_tokens": tokens,
           "finish_reason": finish, "decode_s": (tokens - 1) / 100.0,
           "prompt_sha256": f"p{index}"}  # fmt: skip
    rec.update(score_output(text, ids, finish, gold, FORMATS))
    return rec


def _contract(repeats: int):
    c = load_contract(CONTRACT).contract
    assert c.quality is not None
    q = c.quality.model_copy(update={"repeats": repeats, "seeds": None})
    return c.model_copy(update={"quality": q})


def _loaded(repeats: int) -> LoadedContract:
    """The contract in hand, as `qgate compare` gives it to compare_quality."""
    loaded = load_contract(CONTRACT)
    return loaded.model_copy(update={"contract": _contract(repeats)})


def _result(arm: str, items: list[dict], repeats: int = 1) -> dict:
    q = _contract(repeats).quality
    return {
        "kind": "quality",
        "arm": arm,
        "dataset": {"items_sha256": q.items_sha256, "source": f"/{arm}/test.jsonl"},
        "quality": q.model_dump(mode="json"),
        "items": items,
        "summary": summarize(items, 16, q.run_seeds),
        "complete": len(items) == 16 * repeats,
    }


def _seeded(items: list[dict], seed: int) -> list[dict]:
    return [{**r, "seed": seed} for r in items]


def _good(i: int) -> dict:
    return _item(i, str(i), f"<think>\nThe answer is {i}.\n</think>\n\n#### {i}")


def _gates(out: dict) -> dict[str, dict]:
    return {g["name"]: g for g in out["gates"]}


def test_all_correct_passes_every_gate() -> None:
    ctrl = _result("control", [_good(i) for i in range(8, 24)])
    cand = _result("candidate", [_good(i) for i in range(8, 24)])
    out = compare_quality(ctrl, cand, _loaded(1))
    failed = [g for g in out["gates"] if not g["passed"]]
    # One seed cannot show the power to catch 2 broken items: everything passes but the paired test
    assert [(g["name"], g["severity"]) for g in failed] == [("paired test", "inconclusive")]
    # The seeds advice plans on rates shrunk towards 1/2 (1/1 -> 0.88: one output per item cannot show a
    # rate of 1), so it asks for 9 seeds, not the 3 that would do if every item were always answered.
    assert "1 seed(s) cannot tell; 9 seeds would give that power" in failed[0]["detail"]
    assert out["misses"] == [] and "No misses in either arm." in _md(out)
    assert out["figures"]["candidate"]["raw_correct"] == 16
    assert abs(out["figures"]["candidate"]["decode_tok_s"] - 100.0) < 1e-9


def test_a_broken_candidate_fails_with_reasons() -> None:
    ctrl = _result("control", [_good(i) for i in range(8, 24)])
    cand_items = [_good(i) for i in range(8, 24)]
    cand_items[4] = _item(12, "12", "<think>\nThe answer is 12.\n</think>\n\n#### 7")  # wrong answer
    cand_items[5] = _item(13, "13", "<think>\nloop loop \ufffd", finish="length", tokens=4096)
    cand = _result("candidate", cand_items)
    out = compare_quality(ctrl, cand, None)  # the contract's section is read from the result
    g = _gates(out)
    assert not g["candidate raw correct"]["passed"] and g["candidate raw correct"]["detail"].startswith(
        "14/16"
    )
    assert not g["candidate natural stops"]["passed"]
    assert (
        not g["candidate closed thinking"]["passed"]
        and "items 13" in g["candidate closed thinking"]["detail"]
    )
    assert not g["candidate length caps"]["passed"]
    assert not g["candidate structurally invalid"]["passed"]
    assert not g["candidate U+FFFD characters"]["passed"]
    # Two candidate-only misses on one seed: p = 0.25, and one seed has no power against 2 broken items
    assert not g["paired test"]["passed"] and g["paired test"]["severity"] == "inconclusive"
    detail = g["paired test"]["detail"]
    assert detail.startswith("2 candidate-only and 0 control-only misses over 16 item-seed pairs")
    assert "p = 0.25 >= alpha 0.05" in detail and "likely real regressions" not in detail
    assert [f["finding"] for f in out["paired_test"]["findings"]] == ["new miss (one seed: cannot tell)"] * 2
    assert "What one seed cannot tell." in _md(out) and out["caveat"]
    assert g["candidate same-token run"]["passed"] and g["same items and prompts"]["passed"]
    rows = {r["index"]: r for r in out["misses"]}
    assert set(rows) == {12, 13} and rows[12]["candidate_raw"] == "7" and rows[12]["new_miss"]
    assert "| 12 | 12 | 12 | 12 | 7 | 7 | stop (20 tok) | **yes** |" in _md(out)


def test_reference_misses_are_not_new_misses() -> None:
    wrong = _item(9, "9", "<think>\nx\n</think>\n\n#### 8")
    ctrl = _result("control", [_good(8), wrong])
    cand = _result("candidate", [_good(8), wrong])
    assert miss_table(ctrl, cand)[0]["new_miss"] is False
    fixed = _result("candidate", [_good(8), _good(9)])
    assert miss_table(fixed, ctrl)[0]["new_miss"] is True
    assert new_misses(ctrl, cand) == [] and new_misses(ctrl, fixed) == []
    assert new_misses(fixed, ctrl) == [
        {"index": 9, "seed": None, "extractor": "raw", "gold": "9", "predicted": "8"},
        {"index": 9, "seed": None, "extractor": "strict", "gold": "9", "predicted": "8"},
    ]
    seeded = _result("candidate", _seeded([_good(8), wrong], 5) + _seeded([_good(8), _good(9)], 6), 2)
    other = _result("control", _seeded([_good(8), _good(9)], 5) + _seeded([_good(8), wrong], 6), 2)
    assert [(m["seed"], m["index"]) for m in new_misses(other, seeded)] == [(5, 9), (5, 9)]  # paired by seed


def test_different_inputs_and_incomplete_results_are_errors() -> None:
    ctrl = _result("control", [_good(i) for i in range(8, 24)])
    cand_items = [_good(i) for i in range(8, 23)]
    cand_items[0] = {**cand_items[0], "prompt_sha256": "other"}
    cand = _result("candidate", cand_items)
    g = _gates(compare_quality(ctrl, cand, load_contract(CONTRACT)))
    assert not g["same items and prompts"]["passed"] and g["same items and prompts"]["severity"] == "error"
    assert "items [8]" in g["same items and prompts"]["detail"]
    assert not g["candidate result complete"]["passed"]
    assert g["candidate result complete"]["severity"] == "error"


def test_weighted_decode_rate() -> None:
    items = [{"output_tokens": 11, "decode_s": 0.1}, {"output_tokens": 31, "decode_s": 0.5},
             {"output_tokens": 1, "decode_s": 0.0}]  # fmt: skip
    assert abs(weighted_decode_tok_s(items) - 40 / 0.6) < 1e-9
    assert weighted_decode_tok_s([]) is None


def _three_seeds(broken: dict[int, set[int]] | None = None) -> list[dict]:
    """16 items x seeds 20260828..30, all correct except broken {seed offset: item indices}."""
    out = []
    for k in range(3):
        bad = (broken or {}).get(k, set())
        items = [_wrong(i) if i in bad else _good(i) for i in range(8, 24)]
        out += _seeded(items, 20260828 + k)
    return out


def _wrong(i: int) -> dict:
    return _item(i, str(i), f"<think>\nThe answer is {i + 1}.\n</think>\n\n#### {i + 1}")


def test_three_seeds_all_correct_pass_with_per_item_rates() -> None:
    ctrl, cand = _result("control", _three_seeds(), 3), _result("candidate", _three_seeds(), 3)
    out = compare_quality(ctrl, cand, _loaded(3))
    assert [g for g in out["gates"] if not g["passed"]] == []
    g = _gates(out)
    assert g["candidate natural stops"]["detail"].startswith("48/48")  # health: every output
    assert g["candidate raw correct (seed 20260828)"]["detail"].startswith("16/16")  # floors: frozen seed
    assert out["paired_test"]["power"] == 1.0 and out["paired_test"]["verdict"] == "no regression"
    assert "| 12 |  | 3/3 | 3/3 |  |" in _md(out)
    assert out["figures"]["candidate"]["decode_tok_s"] > 0 and out["caveat"] is None


def test_three_seeds_two_broken_items_fail_and_are_flagged() -> None:
    ctrl = _result("control", _three_seeds({1: {20}}), 3)  # the control misses item 20 once
    cand = _result("candidate", _three_seeds({0: {12, 20}, 1: {12, 20}, 2: {12, 20}}), 3)
    out = compare_quality(ctrl, cand, _loaded(3))
    g = _gates(out)["paired test"]
    assert not g["passed"] and g["severity"] == "fail", g
    t = out["paired_test"]
    assert (t["b_candidate_only_misses"], t["c_control_only_misses"]) == (5, 0)
    assert abs(t["p_one_sided"] - 0.5**5) < 1e-12
    found = {f["index"]: f["finding"] for f in t["findings"]}
    assert found == {12: "likely regression", 20: "control misses too"}
    assert "| 12 | 12 | 3/3 | 0/3 | **likely regression** |" in _md(out)
    assert "| 20 | 20 | 2/3 | 0/3 | control misses too |" in _md(out)
    assert "likely real regressions (the control answered every seed): items 12 (control 3/3" in g["detail"]


def test_a_missing_seed_is_an_error_not_a_pass() -> None:
    ctrl = _result("control", _three_seeds(), 3)
    cand = _result("candidate", _three_seeds()[:32], 3)  # the third seed never ran
    g = _gates(compare_quality(ctrl, cand, _loaded(3)))
    assert (
        not g["candidate result complete"]["passed"]
        and "32/48 outputs" in g["candidate result complete"]["detail"]
    )
    assert not g["paired test"]["passed"] and g["paired test"]["severity"] == "error"


def test_schema_1_results_compare_as_the_frozen_seed() -> None:
    # Records without `seed` (quality results of schema 1) ran under the frozen seed.
    items = [_good(i) for i in range(8, 24)]
    items[3] = _wrong(11)
    out = compare_quality(
        _result("control", [_good(i) for i in range(8, 24)]), _result("candidate", items), _loaded(1)
    )
    t = out["paired_test"]
    assert t["seeds"] == [20260828] and t["b_candidate_only_misses"] == 1 and t["verdict"] == "inconclusive"
