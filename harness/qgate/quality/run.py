"""`qgate run quality` core: one engine start per arm, the frozen items, results kept current on disk.

Per arm: DIR/quality/<arm>.jsonl gets one record per finished output (item x seed; appended and
fsynced as it comes), and DIR/quality/<arm>.json (the summary: every item record, run-level counts,
fingerprint, routes) is rewritten atomically after every output. Each arm runs every item under every
seed of the contract (`quality.seeds` / `quality.repeats`), the frozen seed first, in one engine start.
`resume=True` skips the item-seed pairs already in the JSONL; without it an existing result is never
overwritten.

Format history of quality results (`kind: quality`):
  1 (2026-11-29): first version (one seed).
  2 (2026-11-30): repeated seeds: each item record carries its `seed`, `seeds` lists the run's seeds,
                  the summary adds per-seed counts and per-item rates. Schema 1 results still load:
                  their records ran under the frozen seed (quality.sampling.seed).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qgate import models
from qgate.contract import LoadedContract
from qgate.contract.quality import Quality
from qgate.engine.arms import ARMS, ArmPlan, ArmRun, result_header, run_arms
from qgate.gsm8k import Item, load_items
from qgate.quality.gates import summarize
from qgate.quality.paired import seed_of
from qgate.quality.workload import done_key
from qgate.results import (
    ResultError,
    append_jsonl,
    atomic_write_json,
    current_schema,
    load_result,
    read_jsonl,
)

if TYPE_CHECKING:  # typing.Unpack is Python 3.11; pyproject allows 3.10
    from typing_extensions import Unpack

QUALITY_SCHEMA_VERSION = current_schema("quality")


def result_paths(out_dir: Path, arm: str) -> tuple[Path, Path]:
    """(items JSONL, summary JSON) of one arm."""
    return out_dir / "quality" / f"{arm}.jsonl", out_dir / "quality" / f"{arm}.json"


def item_spec(q: Quality, items: list[Item]) -> dict[str, Any]:
    """What qgate.quality.workload.run_items needs inside the engine child (see its docstring)."""
    return {
        "items": [{"index": it.index, "question": it.question, "gold": it.gold} for it in items],
        "user_template": q.user_template,
        "system_prompt": q.system_prompt,
        "chat_template_kwargs": dict(q.chat_template_kwargs),
        "sampling": q.sampling.vllm_kwargs(),
        "strict_formats": list(q.strict_formats),
        "window_chars": q.window_chars,
        "reset_prefix_cache": q.reset_prefix_cache,
        "seeds": q.run_seeds,
    }


def new_result(loaded: LoadedContract, plan: ArmPlan, model: dict, dataset: dict) -> dict[str, Any]:
    c = loaded.contract
    assert c.quality is not None
    return {
        **result_header("quality", QUALITY_SCHEMA_VERSION, loaded, plan, model),
        # One per result file (this arm of this run; --resume keeps it): every item carries it, so an
        # item copied in from another run's file is refused (qgate.quality.record).
        "run_id": uuid.uuid4().hex,
        "dataset": dataset,
        "quality": c.quality.model_dump(mode="json"),
        "seeds": c.quality.run_seeds,
        "items": [],
        "summary": summarize([], c.quality.n_items, c.quality.run_seeds),
    }


def open_result(
    loaded: LoadedContract, plan: ArmPlan, out_dir: Path, resume: bool, model: dict, dataset: dict
) -> dict[str, Any]:
    """A fresh result, or the saved one (its items re-read from the JSONL) when resuming."""
    jsonl, summary = result_paths(out_dir, plan.name)
    if not jsonl.exists() and not summary.exists():
        return new_result(loaded, plan, model, dataset)
    if not resume:
        raise ResultError(f"{summary}: a result exists; pass --resume to continue it or choose another --out")
    result = (
        load_result(summary, kind="quality") if summary.exists() else new_result(loaded, plan, model, dataset)
    )
    if result["env"] != plan.env:
        raise ResultError(f"{summary}: saved with env {result['env']}, not {plan.env}")
    for key, want in (("contract", loaded.sha256), ("dataset", dataset["items_sha256"])):
        got = result[key]["sha256" if key == "contract" else "items_sha256"]
        if got != want:
            raise ResultError(
                f"{summary}: saved with {key} sha256 {got[:12]}, not {want[:12]}: cannot resume"
            )
    if result.get("schema_version") != QUALITY_SCHEMA_VERSION:
        raise ResultError(
            f"{summary}: a quality result of schema {result.get('schema_version')}: resume it with the "
            f"qgate that wrote it, or start another --out"
        )
    assert loaded.contract.quality is not None
    seeds = loaded.contract.quality.run_seeds
    by_key = {(seed_of(r, seeds[0]), r["index"]): r for r in read_jsonl(jsonl)}
    result["items"] = [by_key[k] for k in sorted(by_key, key=lambda k: _order(seeds, k))]
    return result


def _order(seeds: list[int], key: tuple[int, int]) -> tuple[int, int]:
    """Records in run order: seed by seed (the contract's order), items by index."""
    seed, index = key
    return (seeds.index(seed) if seed in seeds else len(seeds), index)


def _expected(q: Quality) -> set[tuple[int, int]]:
    return {(s, i) for s in q.run_seeds for i in q.indices}


def _keys(items: list[dict]) -> set[tuple[int, int]]:
    return {(int(r["seed"]), int(r["index"])) for r in items}


@dataclass(frozen=True)
class QualityWorkload:
    """The spine's quality workload: one engine start per arm, the item-seed pairs not yet recorded
    (qgate.quality.workload)."""

    loaded: LoadedContract
    out_dir: Path
    resume: bool
    items: list[Item]
    dataset: dict[str, Any]
    kind: str = "quality"
    launches: int = 1
    runner: str = "qgate.quality.workload:run"

    @property
    def quality(self) -> Quality:
        q = self.loaded.contract.quality
        assert q is not None
        return q

    def open(self, plan: ArmPlan, model: dict) -> dict:
        return open_result(self.loaded, plan, self.out_dir, self.resume, model, self.dataset)

    def spec(self, plan: ArmPlan, launch: int, result: dict) -> dict | None:
        done = _keys(result["items"])
        if _expected(self.quality) <= done:
            return None
        return {**item_spec(self.quality, self.items), "done": sorted(done_key(*k) for k in done)}

    def label(self, arm: str, launch: int) -> str:
        return arm

    def launch_fields(self, launch: int) -> dict:
        return {}

    def on_record(self, plan: ArmPlan, result: dict, event: dict) -> None:
        kind = event.get("event")
        if kind == "engine_ready":
            self.save(plan, result)
        elif kind == "item":
            item = {**event["item"], "run_id": result["run_id"]}
            append_jsonl(result_paths(self.out_dir, plan.name)[0], item)
            seeds = self.quality.run_seeds
            result["items"] = sorted(
                [*result["items"], item], key=lambda r: _order(seeds, (r["seed"], r["index"]))
            )
            result["summary"] = summarize(result["items"], self.quality.n_items, seeds)
            self.save(plan, result)

    def save(self, plan: ArmPlan, result: dict) -> None:
        atomic_write_json(result_paths(self.out_dir, plan.name)[1], result)

    def finish(self, result: dict) -> None:
        q = self.quality
        result["summary"] = summarize(result["items"], q.n_items, q.run_seeds)
        keys = _keys(result["items"])
        result["complete"] = keys == _expected(q) and len(keys) == len(result["items"])


def run_quality(
    loaded: LoadedContract, out_dir: Path, arms: tuple[str, ...] = ARMS, resume: bool = False,
    data: Path | None = None, **run: Unpack[ArmRun],
) -> dict[str, dict]:  # fmt: skip
    """The frozen items on every arm, control first (engine.arms.run_arms: plans, progress,
    kill_leftovers); returns the arm results. `data`: the GSM8K file (see gsm8k.load_items)."""
    c = loaded.contract
    q = c.quality
    if q is None:
        raise ResultError(f"{loaded.path}: quality = None: the contract has no quality section")
    items, source = load_items(q.indices, q.items_sha256, cli_data=data, contract_path=q.data_path)
    dataset = {"name": q.dataset, "split": q.split, "indices": q.indices, "items_sha256": q.items_sha256,
               "source": source}  # fmt: skip
    # A tiny-trained model is trained (first use) on the data given here, not only the default path.
    train = None if source.startswith("hf:") else Path(source)
    model = lambda: models.resolve_model(c.model, train)  # noqa: E731 (resolved by the spine, holding DIR)
    workload = QualityWorkload(loaded, out_dir, resume, items, dataset)
    return run_arms(loaded, out_dir, workload, arms, model=model, **run)
