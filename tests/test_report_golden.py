"""The markdown report of the hand-made fixture pair must equal tests/golden/report.md.

Regenerate after an intended change with QGATE_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from golden import support

from qgate import comparable
from qgate.compare import Pair, build_verdict
from qgate.report import render_markdown, speed_png

GOLDEN_REPORT = support.GOLDEN / "report.md"


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> dict:
    # The stand-in pins the attestation gate names; the real qgate.routes has its own tests.
    monkeypatch.setattr(comparable, "routes", support.standin_routes())
    control, candidate = support.load_pair()
    pair = Pair(
        "speed", control, candidate, "tests/golden/speed_control.json", "tests/golden/speed_candidate.json"
    )
    return build_verdict([pair], [], support.pinned_contract())


def test_report_matches_golden(record: dict) -> None:
    text = render_markdown(record)
    if os.environ.get("QGATE_UPDATE_GOLDEN") == "1":
        GOLDEN_REPORT.write_text(text, encoding="utf-8")
    assert text == GOLDEN_REPORT.read_text(encoding="utf-8")


def test_report_renders_the_same_from_verdict_json(record: dict) -> None:
    """Everything the report shows is in the verdict record: verdict.json alone rebuilds it."""
    again = json.loads(json.dumps(record))
    assert render_markdown(again) == render_markdown(record)


def test_report_names_what_the_issue_asks_for(record: dict) -> None:
    text = render_markdown(record)
    for needle in (
        "# qgate verdict: PASS",
        "| arm | route | steady samples (tok/s) | mean (tok/s) | mean TPOT (ms) |",
        "| control | none switched on | 50.12, 49.87, 50.31, 49.95, 50.08, 50.27, 49.93, 50.49, 50.16, "
        "50.11 | 50.13 |",
        "| candidate | fp16_gemv |",
        "Throughput change: +19.58 %; TPOT change: -16.37 %.",
        "sample sd (tok/s)",
        "Control vs candidate, rep by rep on the same prompt (8 v 8 tokens): identical in all 10 reps",
        "| prompts fresh and paired | pass | ERROR | 10 reps per arm, each on a prompt of its own",
        "Median TTFT change: +0.90 %.",
        "| decode ratio across engine starts | pass | INCONCLUSIVE | measured in the run: 2 launches per arm",
        "Welch p",
        "Mann-Whitney p",
        "95 % bootstrap CI",
        "| candidate mean decode >= 55 tok/s | pass |",
        "| env.VLLM_SM70_QWEN38_FP16_GEMV | 0 | 1 | no |",
        f"sha256 `{support.FIXTURE_SHA}`",
        "| fp16_gemv | candidate | 0 | 192 (route off: 192) | 168 |",
    ):
        assert needle in text, needle


def test_speed_png_is_written(record: dict, tmp_path: Path) -> None:
    out = tmp_path / "speed.png"
    speed_png(record, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
