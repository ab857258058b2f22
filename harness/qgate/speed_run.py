"""`qgate run speed` core: plan the arm launches, run them, keep DIR/speed/<arm>.json current.

The arm file is rewritten atomically after every rep, so a run killed at any moment loses no completed
rep; `resume=True` continues from the saved reps; a finished or partial file is never overwritten
without being asked to resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract
from qgate.engine.launcher import EngineError
from qgate.engine.procs import claimed
from qgate.engine.segment import result_header, run_segment
from qgate.models import resolve_model
from qgate.results import SPEED_SCHEMA_VERSION, ResultError, atomic_write_json, load_result
from qgate.routes import check_overrides

ARMS = ("control", "candidate")


# What the CLI shows: called with (arm, event record, result so far).
Progress = Callable[[str, dict, dict], None]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def arm_path(out_dir: Path, arm: str) -> Path:
    return out_dir / "speed" / f"{arm}.json"


@dataclass(frozen=True)
class ArmPlan:
    """One arm to run: a name (the result file's stem), its env and its engine args."""

    name: str
    env: dict[str, str]
    engine_args: dict[str, Any]


def contract_arms(loaded: LoadedContract, names: tuple[str, ...] = ARMS) -> list[ArmPlan]:
    c = loaded.contract
    return [ArmPlan(n, c.env_for(n), c.engine_for(n)) for n in names]


def new_result(loaded: LoadedContract, plan: ArmPlan, model: dict) -> dict[str, Any]:
    c = loaded.contract
    s = c.speed
    assert s is not None
    return {
        **result_header("speed", SPEED_SCHEMA_VERSION, loaded, plan, model),
        "prompt": {"input_tokens": s.input_tokens, "seed": s.prompt_seed, "sha256": None},
        "workload": {
            "output_tokens": s.output_tokens,
            "greedy": s.greedy,
            "ignore_eos": s.ignore_eos,
            "warmup": s.warmup,
            "repetitions": s.repetitions,
            "reset_prefix_cache": s.reset_prefix_cache,
            "launches": s.launches,
        },
        "reps": [],
    }


def open_result(loaded: LoadedContract, plan: ArmPlan, out_dir: Path, resume: bool, model: dict) -> dict:
    """A fresh result, or the saved one when resuming; refuse to clobber or to mix contracts."""
    path = arm_path(out_dir, plan.name)
    if not path.exists():
        return new_result(loaded, plan, model)
    if not resume:
        raise ResultError(f"{path}: a result exists; pass --resume to continue it or choose another --out")
    saved = load_result(path, kind="speed")
    if saved["contract"]["sha256"] != loaded.sha256:
        raise ResultError(
            f"{path}: saved with contract sha256 {saved['contract']['sha256'][:12]}, "
            f"not {loaded.sha256[:12]}: cannot resume under a different contract"
        )
    if saved["env"] != plan.env:
        raise ResultError(f"{path}: saved with env {saved['env']}, not {plan.env}: cannot resume")
    return saved


def check_routes(env: dict[str, str]) -> None:
    """Refuse a broken route override before any engine starts (the child runs in this folder)."""
    check_overrides(env, cwd=Path.cwd())


def missing_reps(result: dict, launch: int, repetitions: int) -> list[int]:
    done = {r["index"] for r in result["reps"]}
    first = launch * repetitions
    return [i for i in range(first, first + repetitions) if i not in done]


def run_launch(
    loaded: LoadedContract,
    plan: ArmPlan,
    launch: int,
    result: dict,
    out_dir: Path,
    model_path: str,
    progress: Progress | None,
) -> dict:
    """One engine start for one arm: warmup, then this launch's missing reps."""
    arm = plan.name
    c = loaded.contract
    s = c.speed
    assert s is not None
    todo = missing_reps(result, launch, s.repetitions)
    if not todo:
        return result
    path = arm_path(out_dir, arm)
    segment = len(result["launches"])
    attest_dir = out_dir / "attest" / "speed" / arm / f"segment-{segment}"
    spec = {
        "workload": "speed",
        "model_path": model_path,
        "engine_args": plan.engine_args,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "greedy": s.greedy,
        "ignore_eos": s.ignore_eos,
        "warmup": s.warmup,
        "reset_prefix_cache": s.reset_prefix_cache,
        "prompt_seed": s.prompt_seed,
        "launch": launch,
        "rep_indices": todo,
    }
    state = {"result": result}

    def on_event(ev: dict) -> None:
        res = state["result"]
        kind = ev.get("event")
        if kind == "engine_ready":
            res["fingerprint"] = ev["fingerprint"]
            res["launches"].append(
                {
                    "launch": launch,
                    "segment": segment,
                    "engine_start_s": ev["engine_start_s"],
                    "started_at": _now(),
                }
            )
        elif kind == "prompt":
            if res["prompt"]["sha256"] not in (None, ev["sha256"]):
                raise EngineError(f"{arm}: prompt changed between launches ({ev['sha256'][:12]})")
            res["prompt"]["sha256"] = ev["sha256"]
        elif kind == "rep":
            res["reps"].append(ev["rep"])
            res["reps"].sort(key=lambda r: r["index"])
            atomic_write_json(path, res)
        if progress is not None:
            progress(arm, ev, res)

    log = out_dir / "logs" / f"speed-{arm}.log"
    return run_segment(
        spec, plan.env, log, attest_dir, state["result"], on_event,
        lambda res: atomic_write_json(path, res), f"{arm} launch {launch}",
    )  # fmt: skip


def run_speed(
    loaded: LoadedContract,
    out_dir: Path,
    arms: tuple[str, ...] = ARMS,
    resume: bool = False,
    progress: Progress | None = None,
    plans: list[ArmPlan] | None = None,
    kill_leftovers: bool = False,
) -> dict[str, dict]:
    """Run every launch of every arm, interleaved (control, candidate, control, ...).

    `plans` replaces the contract's two arms with derived ones (the ablation's arms). Live processes
    of an earlier run in out_dir are refused, or ended with `kill_leftovers` (engine/procs.py).
    """
    c = loaded.contract
    if c.speed is None:
        raise ResultError(f"{loaded.path}: speed = None: the contract has no speed section")
    plans = plans if plans is not None else contract_arms(loaded, arms)
    for plan in plans:  # a broken route override fails here, before any engine starts
        check_routes(plan.env)
    with claimed(out_dir, kill_leftovers):  # before any work: a live earlier run is refused at once
        model_path, model = resolve_model(c.model)
        results = {p.name: open_result(loaded, p, out_dir, resume, model) for p in plans}
        for launch in range(c.speed.launches):
            for plan in plans:
                results[plan.name] = run_launch(
                    loaded, plan, launch, results[plan.name], out_dir, model_path, progress
                )
    for plan in plans:
        res = results[plan.name]
        res["complete"] = len(res["reps"]) == c.speed.launches * c.speed.repetitions
        atomic_write_json(arm_path(out_dir, plan.name), res)
    return results


def kept_reps(out_dir: Path, arms: tuple[str, ...]) -> str:
    """What a stopped run keeps, for its last line: the reps on disk per arm."""
    parts = []
    for arm in arms:
        path = arm_path(out_dir, arm)
        try:
            n = len(load_result(path, kind="speed")["reps"])
        except ResultError:
            n = 0
        parts.append(f"{arm} {n} rep{'s' if n != 1 else ''}")
    return f"{', '.join(parts)} in {out_dir / 'speed'}"
