"""Quality gates, matched misses and the miss table on hand-made item records (no engine)."""

from __future__ import annotations

from pathlib import Path

from qgate.contract import load_contract
from qgate.quality.compare import compare_quality, miss_table
from qgate.quality.gates import new_misses, summarize, weighted_decode_tok_s
from qgate.quality.scoring import score_output

CONTRACT = Path(__file__).resolve().parents[1] / "contracts" / "quality-cpu.yaml"
FORMATS = ["hash", "boxed", "final_answer"]


def _item(index: int, gold: str, text: str, finish: str = "stop", tokens: int = 20) -> dict:
    ids = list(range(tokens))
    rec = {"index": index, "gold": gold, "output": text, "token_ids": ids, "output_tokens": tokens,
           "finish_reason": finish, "decode_s": (tokens - 1) / 100.0,
           "prompt_sha256": f"p{index}"}  # fmt: skip
    rec.update(score_output(text, ids, finish, gold, FORMATS))
    return rec


def _result(arm: str, items: list[dict]) -> dict:
    q = load_contract(CONTRACT).contract.quality
    return {
        "kind": "quality",
        "arm": arm,
        "dataset": {"items_sha256": q.items_sha256, "source": f"/{arm}/test.jsonl"},
        "quality": q.model_dump(mode="json"),
        "items": items,
        "summary": summarize(items, 16),
        "complete": len(items) == 16,
    }


def _good(i: int) -> dict:
    return _item(i, str(i), f"<think>\nThe answer is {i}.\n</think>\n\n#### {i}")


def _gates(out: dict) -> dict[str, dict]:
    return {g["name"]: g for g in out["gates"]}


def test_all_correct_passes_every_gate() -> None:
    ctrl = _result("control", [_good(i) for i in range(8, 24)])
    cand = _result("candidate", [_good(i) for i in range(8, 24)])
    out = compare_quality(ctrl, cand, load_contract(CONTRACT).contract)
    failed = [g for g in out["gates"] if not g["passed"]]
    assert failed == []
    assert out["misses"] == [] and "No misses in either arm." in out["markdown"]
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
    assert not g["matched misses"]["passed"]
    detail = g["matched misses"]["detail"]
    assert detail.startswith("2 item(s) missed only by the candidate: ")
    assert "item 12 (expected 12): raw 7, strict 7" in detail and "item 13 (expected 13): raw none" in detail
    assert g["candidate same-token run"]["passed"] and g["same items and prompts"]["passed"]
    rows = {r["index"]: r for r in out["misses"]}
    assert set(rows) == {12, 13} and rows[12]["candidate_raw"] == "7" and rows[12]["new_miss"]
    assert "| 12 | 12 | 12 | 12 | 7 | 7 | stop (20 tok) | **yes** |" in out["markdown"]


def test_reference_misses_are_allowed() -> None:
    wrong = _item(9, "9", "<think>\nx\n</think>\n\n#### 8")
    ctrl = _result("control", [_good(8), wrong])
    cand = _result("candidate", [_good(8), wrong])
    assert new_misses(ctrl, cand) == []
    assert miss_table(ctrl, cand)[0]["new_miss"] is False
    fixed = _result("candidate", [_good(8), _good(9)])  # the candidate does better: fine
    assert new_misses(ctrl, fixed) == []
    assert new_misses(fixed, ctrl) == [
        {"index": 9, "extractor": "raw", "gold": "9", "predicted": "8"},
        {"index": 9, "extractor": "strict", "gold": "9", "predicted": "8"},
    ]


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
