"""`run quality` over seeds without an engine: the child is scripted, so the runner's own logic (item-seed
pairs in seed order, the JSONL as it comes, an interrupted run resumed by pair, completeness) is checked
in well under a second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from qgate import models
from qgate.contract import load_contract
from qgate.engine import arms
from qgate.errors import RunFailure
from qgate.quality import run as runner
from qgate.quality.workload import done_key

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
SEEDS = [20260828, 20260829, 20260830]


class ScriptedChild:
    """Stands in for run_segment: answers every pair not done; `stop_after` outputs, then fails once."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.specs: list[dict[str, Any]] = []

    def __call__(self, spec: dict, env: Any, log: Path, attest: Path, result: dict, on_event: Any,
                 save: Any, label: str) -> dict:  # fmt: skip
        self.specs.append(spec)
        on_event({"event": "engine_ready", "fingerprint": {"cpu": "x"}, "engine_start_s": 0.1})
        done, emitted = set(spec["done"]), 0
        for seed in spec["seeds"]:
            for item in spec["items"]:
                if done_key(seed, item["index"]) in done:
                    continue
                if self.stop_after is not None and emitted == self.stop_after:
                    self.stop_after = None
                    raise RunFailure(f"{label}: engine died")
                ok = not (seed == SEEDS[1] and item["index"] == 12)
                rec = {"index": item["index"], "seed": seed, "gold": item["gold"], "raw_correct": ok,
                       "strict_correct": ok, "raw_answer": item["gold"], "strict_answer": item["gold"],
                       "natural_stop": True, "closed_thinking": True, "length_cap": False, "invalid": False,
                       "fffd_count": 0, "longest_token_run": 1, "max_window_repeats": 1, "output_tokens": 11,
                       "decode_s": 0.1, "decode_tok_s": 100.0, "finish_reason": "stop",
                       "prompt_sha256": f"p{item['index']}"}  # fmt: skip
                on_event({"event": "item", "item": rec})
                emitted += 1
        save(result)
        return result


@pytest.fixture
def contract(tmp_path: Path) -> Path:
    data = yaml.safe_load((CONTRACTS / "quality-cpu.yaml").read_text())
    data["model"] = "tiny"  # resolve_model is scripted below; no training
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_interrupted_run_resumes_by_item_seed_pair(
    tmp_path: Path, contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = ScriptedChild(stop_after=20)
    monkeypatch.setattr(arms, "run_segment", child)
    monkeypatch.setattr(
        models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec, "config_sha256": "c"})
    )
    loaded, out = load_contract(contract), tmp_path / "out"
    with pytest.raises(RunFailure):
        runner.run_quality(loaded, out, ("control",))
    kept = [json.loads(x) for x in (out / "quality" / "control.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["index"]) for r in kept][-5:] == [(SEEDS[0], 23)] + [
        (SEEDS[1], i) for i in range(8, 12)
    ]
    saved = json.loads((out / "quality" / "control.json").read_text())
    assert saved["schema_version"] == 3 and saved["seeds"] == SEEDS and not saved["complete"]
    assert saved["summary"]["n_done"] == 20 and saved["summary"]["raw_correct"] == 16  # frozen seed done
    with pytest.raises(Exception, match="pass --resume"):
        runner.run_quality(loaded, out, ("control",))
    res = runner.run_quality(loaded, out, ("control",), resume=True)["control"]
    assert sorted(child.specs[1]["done"]) == sorted(
        done_key(s, i) for s, i in [(r["seed"], r["index"]) for r in kept]
    )
    assert [(r["seed"], r["index"]) for r in res["items"]] == [(s, i) for s in SEEDS for i in range(8, 24)]
    assert res["complete"] and len(res["launches"]) == 2
    rates = {r["index"]: (r["correct"], r["runs"]) for r in res["summary"]["item_rates"]}
    assert rates[12] == (2, 3) and rates[8] == (3, 3)
    assert (res["summary"]["n_outputs"], res["summary"]["correct_outputs"]) == (48, 47)
    assert len((out / "quality" / "control.jsonl").read_text().splitlines()) == 48
    runner.run_quality(loaded, out, ("control",), resume=True)  # complete: no engine start
    assert len(child.specs) == 2
