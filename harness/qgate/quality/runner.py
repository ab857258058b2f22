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

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract
from qgate.engine.segment import result_header, run_segment
from qgate.models import resolve_model
from qgate.quality.gates import summarize
from qgate.quality.gsm8k import Item, load_items
from qgate.quality.paired import seed_of
from qgate.quality.run import done_key
from qgate.quality.schema import Quality
from qgate.results import (
    ResultError,
    append_jsonl,
    atomic_write_json,
    current_schema,
    load_result,
    read_jsonl,
)
from qgate.speed_run import ArmPlan, check_routes, contract_arms

QUALITY_SCHEMA_VERSION = current_schema("quality")
ARMS = ("control", "candidate")

# What the CLI shows: called with (arm, event record, result so far).
Progress = Callable[[str, dict, dict], None]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def result_paths(out_dir: Path, arm: str) -> tuple[Path, Path]:
    """(items JSONL, summary JSON) of one arm."""
    return out_dir / "quality" / f"{arm}.jsonl", out_dir / "quality" / f"{arm}.json"


def item_spec(q: Quality, items: list[Item]) -> dict[str, Any]:
    """What qgate.quality.run.run_items needs inside the engine child (see its docstring)."""
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


def run_arm(
    loaded: LoadedContract, plan: ArmPlan, result: dict, out_dir: Path, model_path: str, items: list[Item],
    progress: Progress | None,
) -> dict:  # fmt: skip
    """One engine start: the arm's items not yet in the result."""
    arm = plan.name
    c = loaded.contract
    assert c.quality is not None
    done = _keys(result["items"])
    if _expected(c.quality) <= done:
        return result
    jsonl, summary = result_paths(out_dir, arm)
    segment = len(result["launches"])
    attest_dir = out_dir / "attest" / "quality" / arm / f"segment-{segment}"
    spec = {"workload": "quality", "model_path": model_path, "engine_args": plan.engine_args,
            **item_spec(c.quality, items), "done": sorted(done_key(*k) for k in done)}  # fmt: skip
    state = {"result": result}

    def on_event(ev: dict) -> None:
        res = state["result"]
        kind = ev.get("event")
        if kind == "engine_ready":
            res["fingerprint"] = ev["fingerprint"]
            res["launches"].append(
                {"segment": segment, "engine_start_s": ev["engine_start_s"], "started_at": _now()}
            )
            atomic_write_json(summary, res)
        elif kind == "item":
            append_jsonl(jsonl, ev["item"])
            seeds = c.quality.run_seeds
            res["items"] = sorted(
                [*res["items"], ev["item"]], key=lambda r: _order(seeds, (r["seed"], r["index"]))
            )
            res["summary"] = summarize(res["items"], c.quality.n_items, seeds)
            atomic_write_json(summary, res)
        if progress is not None:
            progress(arm, ev, res)

    log = out_dir / "logs" / f"quality-{arm}.log"
    return run_segment(
        spec, plan.env, log, attest_dir, state["result"], on_event,
        lambda res: atomic_write_json(summary, res), arm,
    )  # fmt: skip


def run_quality(
    loaded: LoadedContract,
    out_dir: Path,
    arms: tuple[str, ...] = ARMS,
    resume: bool = False,
    data: Path | None = None,
    progress: Progress | None = None,
    plans: list[ArmPlan] | None = None,
) -> dict[str, dict]:
    """Run the frozen items on every arm (control first); returns the arm results.

    `plans` replaces the contract's two arms with derived ones (the ablation's arms).
    """
    c = loaded.contract
    q = c.quality
    if q is None:
        raise ResultError(f"{loaded.path}: quality = None: the contract has no quality section")
    items, source = load_items(q.indices, q.items_sha256, cli_data=data, contract_path=q.data_path)
    dataset = {"name": q.dataset, "split": q.split, "indices": q.indices, "items_sha256": q.items_sha256,
               "source": source}  # fmt: skip
    plans = plans if plans is not None else contract_arms(loaded, arms)
    for plan in plans:  # a broken route override fails here, before any engine starts
        check_routes(plan.env)
    if c.model == "tiny-trained":  # train it (first use) on the data given here, not only the default path
        from qgate.tiny_train import ensure_trained

        ensure_trained(data=None if source.startswith("hf:") else Path(source))
    model_path, model = resolve_model(c.model)
    results = {p.name: open_result(loaded, p, out_dir, resume, model, dataset) for p in plans}
    for plan in plans:
        res = run_arm(loaded, plan, results[plan.name], out_dir, model_path, items, progress)
        res["summary"] = summarize(res["items"], q.n_items, q.run_seeds)
        keys = _keys(res["items"])
        res["complete"] = keys == _expected(q) and len(keys) == len(res["items"])
        atomic_write_json(result_paths(out_dir, plan.name)[1], res)
        results[plan.name] = res
    return results
