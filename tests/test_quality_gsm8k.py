"""The frozen GSM8K selection: loading, canonical hash, refusal of other data, data-source order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qgate.gsm8k import (
    DATA_ENV,
    FROZEN_SHA256,
    DatasetError,
    canonical_sha256,
    frozen_indices,
    gold_answer,
    load_items,
    resolve_data_path,
)

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get(DATA_ENV) or REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl")
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"GSM8K test split not at {DATA}")


@needs_data
def test_frozen_items_load_and_match_the_hash() -> None:
    items, source = load_items(frozen_indices(), FROZEN_SHA256, cli_data=DATA)
    assert source == str(DATA)
    assert [it.index for it in items] == list(range(8, 24))
    lemon = items[12 - 8]
    assert "lemon" in lemon.question and lemon.gold == "13"
    assert all(it.gold.lstrip("-").replace(".", "").isdigit() for it in items)


def _write(tmp: Path, records: list[dict]) -> Path:
    path = tmp / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _fake(n: int) -> list[dict]:
    return [{"question": f"Q{i}: how many?", "answer": f"work\n#### {i},000"} for i in range(n)]


def test_canonical_hash_is_defined_by_the_selected_items(tmp_path: Path) -> None:
    path = _write(tmp_path, _fake(30))
    recs = [{"index": i, **r} for i, r in enumerate(_fake(30))]
    expected = canonical_sha256(recs[8:24])
    items, _ = load_items(frozen_indices(), expected, cli_data=path)
    assert items[0].gold == "8000"  # `,` removed
    # Lines outside the selection do not matter; a changed item inside it does.
    other = _fake(30)
    other[2]["question"] = "changed"
    assert load_items(frozen_indices(), expected, cli_data=_write(tmp_path, other))
    other[12]["answer"] = "work\n#### 14"
    with pytest.raises(DatasetError, match=r"items 8-23 have sha256 .* refusing to run on different data"):
        load_items(frozen_indices(), expected, cli_data=_write(tmp_path, other))


def test_clear_errors_for_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such GSM8K file"):
        load_items(frozen_indices(), FROZEN_SHA256, cli_data=tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="no line for index 20"):
        load_items(frozen_indices(), FROZEN_SHA256, cli_data=_write(tmp_path, _fake(20)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n" * 9 + "not json\n")
    with pytest.raises(DatasetError, match="line 9 is not a GSM8K record"):
        load_items(frozen_indices(), FROZEN_SHA256, cli_data=bad)
    with pytest.raises(DatasetError, match="no final '#### N' line"):
        gold_answer("no final line")


def test_data_source_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ENV, "/from/env.jsonl")
    assert resolve_data_path(Path("/cli.jsonl"), "/contract.jsonl") == Path("/cli.jsonl")
    assert resolve_data_path(None, "/contract.jsonl") == Path("/from/env.jsonl")
    monkeypatch.delenv(DATA_ENV)
    assert resolve_data_path(None, "/contract.jsonl") == Path("/contract.jsonl")
    monkeypatch.chdir(tmp_path)  # no ../shared/data here
    assert resolve_data_path(None, None) is None
