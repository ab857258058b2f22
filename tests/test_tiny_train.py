"""The trained tiny model: deterministic training (short runs here), the chat format it learns, errors.

The full training (200 steps) and its 16/16 under the contract's sampling are checked on real vLLM by
tests/test_quality_e2e.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qgate.gsm8k import DATA_ENV, FROZEN_SHA256, Item, frozen_indices, load_items
from qgate.quality.scoring import score_output
from qgate.tiny.train import build_tiny_trained, completion_text

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get(DATA_ENV) or REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl")
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"GSM8K test split not at {DATA}")


def test_completion_is_what_the_gate_accepts() -> None:
    item = Item(12, "q", "a\n#### 13", "13")
    text = completion_text(item)
    scores = score_output(text, [1, 2], "stop", "13", ["hash", "boxed", "final_answer"])
    assert scores["raw_correct"] and scores["strict_correct"] and scores["closed_thinking"]
    assert text.startswith("<think>\n") and text.endswith("#### 13")


@needs_data
def test_short_training_is_byte_identical(tmp_path: Path) -> None:
    a = build_tiny_trained(tmp_path / "a", seed=0, data=DATA, steps=2)
    b = build_tiny_trained(tmp_path / "b", seed=0, data=DATA, steps=2)
    ma = json.loads((a / "manifest.json").read_text())
    assert ma == json.loads((b / "manifest.json").read_text())
    assert ma["kind"] == "tiny-trained" and ma["items_sha256"] == FROZEN_SHA256 and ma["steps"] == 2
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    log = json.loads((a / "train_log.json").read_text())
    assert set(log) == {"final_loss", "min_token_prob", "train_s"}


@needs_data
def test_training_examples_are_the_frozen_items() -> None:
    items, _ = load_items(frozen_indices(), FROZEN_SHA256, cli_data=DATA)
    assert [completion_text(it).rsplit(" ", 1)[-1] for it in items][4] == "13"


def test_cli_trained_without_data_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qgate.cli import app

    monkeypatch.delenv(DATA_ENV, raising=False)
    missing = tmp_path / "missing.jsonl"
    result = CliRunner().invoke(
        app, ["model", "tiny", str(tmp_path / "m"), "--trained", "--data", str(missing)]
    )
    assert result.exit_code == 2
    assert "no such GSM8K file" in result.output and "Traceback" not in result.output
