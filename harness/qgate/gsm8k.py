"""The frozen GSM8K subset: load the test split, select the contract's indices, check their hash.

Below the quality gate (qgate.quality) that scores it and the tiny model (qgate.tiny.train) trained on it:
it imports neither (tools/import_cycles.py).

Canonical form of a selection (what `items_sha256` hashes): the JSON array, in index order, of
`{"answer": <answer text>, "index": <0-based line index>, "question": <question text>}` objects,
serialised with sorted keys, separators (",", ":") and ensure_ascii=True, encoded as UTF-8. The answer
text is the dataset's full answer (worked solution and the final `#### N` line), unchanged.

Where the data comes from, first match wins: the `--data` option, env QGATE_GSM8K_PATH, the contract's
`quality.data_path`, `../shared/data/gsm8k/test.jsonl` relative to the working directory, and last
Hugging Face `datasets` (openai/gsm8k, config main) when it is installed and the hub is reachable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qgate.errors import QgateError
from qgate.paths import expand_user

DEFAULT_DATA_PATH = Path("../shared/data/gsm8k/test.jsonl")
DATA_ENV = "QGATE_GSM8K_PATH"
FROZEN_FIRST, FROZEN_LAST = 8, 23
# sha256 of the canonical form of test items 8-23 (GSM8K test split, MIT licence).
FROZEN_SHA256 = "695073cabaae071a517cbce5259894e3eae42db9dabce1fe376d8abc2652641d"
_GOLD = re.compile(r"####\s*(.+?)\s*$")


class DatasetError(QgateError):
    """Data that cannot be used for the gate; str() is one line for the user."""


@dataclass(frozen=True)
class Item:
    """One GSM8K item: 0-based index in the test split, question, full answer text, gold number."""

    index: int
    question: str
    answer: str
    gold: str


def build_messages(spec: dict[str, Any], question: str) -> list[dict[str, str]]:
    """The chat messages of one GSM8K question under the contract's prompt (system + user template)."""
    messages = []
    if spec.get("system_prompt"):
        messages.append({"role": "system", "content": spec["system_prompt"]})
    messages.append({"role": "user", "content": spec["user_template"].replace("{question}", question)})
    return messages


def gold_answer(answer: str, where: str = "answer") -> str:
    """The number after `####` in a GSM8K answer, with `,` and `$` removed."""
    last = answer.strip().splitlines()[-1] if answer.strip() else ""
    m = _GOLD.search(last)
    if not m:
        raise DatasetError(f"{where}: no final '#### N' line")
    return m.group(1).replace(",", "").replace("$", "").strip()


def canonical_sha256(records: list[dict]) -> str:
    """sha256 of the canonical form (module docstring) of [{index, question, answer}, ...]."""
    canon = [{"answer": r["answer"], "index": int(r["index"]), "question": r["question"]} for r in records]
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def resolve_data_path(cli_data: Path | None, contract_path: str | None) -> Path | None:
    """The JSONL to read, or None when no local file is named or found (then try `datasets`)."""
    for candidate in (cli_data, os.environ.get(DATA_ENV) or None, contract_path):
        if candidate is not None:
            return expand_user(candidate, "the GSM8K data path")
    return DEFAULT_DATA_PATH if DEFAULT_DATA_PATH.exists() else None


def _read_jsonl(path: Path, indices: list[int]) -> list[dict]:
    want, found = set(indices), {}
    try:
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i in want:
                    try:
                        rec = json.loads(line)
                        found[i] = {"index": i, "question": rec["question"], "answer": rec["answer"]}
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise DatasetError(
                            f"{path}: line {i + 1} is not a GSM8K record with question and answer"
                        ) from None
                if len(found) == len(want):
                    break
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: no such GSM8K file (give --data, env {DATA_ENV} or quality.data_path)"
        ) from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror}") from None
    missing = sorted(want - set(found))
    if missing:
        raise DatasetError(f"{path}: has no line for index {missing[0]} (file too short)")
    return [found[i] for i in indices]


def _read_hub(indices: list[int]) -> list[dict]:
    try:
        import datasets  # optional: only when no local file is given
    except ImportError:
        raise DatasetError(
            f"no GSM8K data: {DEFAULT_DATA_PATH} does not exist, no --data / {DATA_ENV} / quality.data_path "
            "was given, and the `datasets` package is not installed"
        ) from None
    try:
        split = datasets.load_dataset("openai/gsm8k", "main", split="test")
    except Exception as exc:  # any hub failure is one line for the user
        raise DatasetError(f"GSM8K from the Hugging Face hub failed: {type(exc).__name__}: {exc}") from None
    return [{"index": i, "question": split[i]["question"], "answer": split[i]["answer"]} for i in indices]


def load_items(
    indices: list[int],
    expected_sha256: str,
    cli_data: Path | None = None,
    contract_path: str | None = None,
) -> tuple[list[Item], str]:
    """The selected items and where they came from; refuse data whose canonical hash differs."""
    path = resolve_data_path(cli_data, contract_path)
    records = _read_jsonl(path, indices) if path is not None else _read_hub(indices)
    source = str(path) if path is not None else "hf:openai/gsm8k/main/test"
    got = canonical_sha256(records)
    if got != expected_sha256:
        raise DatasetError(
            f"{source}: items {indices[0]}-{indices[-1]} have sha256 {got[:16]}..., contract "
            f"quality.items_sha256 expects {expected_sha256[:16]}...: refusing to run on different data"
        )
    items = [
        Item(r["index"], r["question"], r["answer"], gold_answer(r["answer"], f"{source} index {r['index']}"))
        for r in records
    ]
    return items, source


def frozen_indices() -> list[int]:
    return list(range(FROZEN_FIRST, FROZEN_LAST + 1))
