"""The strict `quality` section of a contract: shipped contracts validate, bad values are one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qgate.contract import ContractError, load_contract
from qgate.gsm8k import FROZEN_SHA256

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"


@pytest.mark.parametrize("name", ["quality-cpu.yaml", "qwen38-sm70-tp4-quality.yaml"])
def test_shipped_quality_contracts_validate(name: str) -> None:
    q = load_contract(CONTRACTS / name).contract.quality
    assert q is not None
    assert q.indices == list(range(8, 24)) and q.items_sha256 == FROZEN_SHA256
    assert q.sampling.vllm_kwargs() == {
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
        "seed": 20260828,
        "max_tokens": 4096,
        "skip_special_tokens": True,
        "ignore_eos": False,
    }


def _bad(tmp_path: Path, edit: dict, gates: dict | None = None) -> str:
    data = yaml.safe_load((CONTRACTS / "quality-cpu.yaml").read_text())
    data["quality"].update(edit)
    data["quality"]["gates"].update(gates or {})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_bad_quality_sections_fail_with_the_key(tmp_path: Path) -> None:
    assert "quality.shuffle" in _bad(tmp_path, {"shuffle": True}) and "unknown key" in _bad(
        tmp_path, {"shuffle": True}
    )
    assert "quality.sampling.temperature" in _bad(tmp_path, {"sampling": {"temperature": -1}})
    assert "quality.sampling.top_p" in _bad(tmp_path, {"sampling": {"top_p": 1.5}})
    assert "quality.items_sha256" in _bad(tmp_path, {"items_sha256": "abc"})
    assert "quality.strict_formats" in _bad(tmp_path, {"strict_formats": ["regex"]})
    assert "quality.dataset" in _bad(tmp_path, {"dataset": "mmlu"})
    assert "quality.user_template" in _bad(tmp_path, {"user_template": "no placeholder"})
    assert "exceeds the 16 selected items" in _bad(tmp_path, {}, {"min_raw_correct": 17})
    assert "below first_index" in _bad(tmp_path, {"first_index": 30})
    assert "quality.gates.max_invalid" in _bad(tmp_path, {}, {"max_invalid": -1})


def test_seeds_and_repeats(tmp_path: Path) -> None:
    assert "seeds or repeats, not both" in _bad(tmp_path, {"seeds": [20260828, 1], "repeats": 2})
    assert "must be sampling.seed = 20260828" in _bad(tmp_path, {"seeds": [1, 20260828], "repeats": None})
    assert "seeds repeat [5]" in _bad(tmp_path, {"seeds": [20260828, 5, 5], "repeats": None})
    assert "quality.repeats" in _bad(tmp_path, {"repeats": 0})
    assert "quality.gates.alpha" in _bad(tmp_path, {}, {"alpha": 1.5})
    assert "gates.detect_broken_items = 17 exceeds" in _bad(tmp_path, {}, {"detect_broken_items": 17})
    data = yaml.safe_load((CONTRACTS / "quality-cpu.yaml").read_text())
    data["quality"].pop("repeats", None), data["quality"].pop("seeds", None)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_contract(path).contract.quality.run_seeds == [20260828]
    data["quality"]["repeats"] = 3
    path.write_text(yaml.safe_dump(data))
    assert load_contract(path).contract.quality.run_seeds == [20260828, 20260829, 20260830]
    data["quality"].pop("repeats")
    data["quality"]["seeds"] = [20260828, 7, 1]
    path.write_text(yaml.safe_dump(data))
    assert load_contract(path).contract.quality.run_seeds == [20260828, 7, 1]
