"""The spine of every `qgate run <workload>`: plan the arms, start their engines, keep their records.

A run is arms x launches: for each launch, each arm in turn gets one engine start (engine/segment.py:
the child, its route counts, the save). The spine owns what every workload shares: the arm plans, each
arm's environment (preflight.ArmEnv: built and checked once, before any engine starts), claiming the
output folder, the launch bookkeeping in each arm's result (fingerprint, `launches`), the attestation
and log paths, progress. A workload (qgate.speed.run, qgate.quality.run) supplies only its result files,
the model (the caller's resolver: the engine knows no model names), the import path of what the child
runs, the child's spec for a launch, and what it does with each record the child emits (`Workload`).
The engine imports no workload; workloads never import each other.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from qgate.contract import LoadedContract
from qgate.engine.order import plan_order
from qgate.engine.preflight import ArmEnv, arm_env, check_arm_envs
from qgate.engine.procs import claimed
from qgate.engine.segment import refuse_changed_env, run_segment
from qgate.errors import RunFailure
from qgate.results import utc_now

ARMS = ("control", "candidate")

# What the CLI shows: called with (arm, event record, result so far).
Progress = Callable[[str, dict, dict], None]
# The model every arm runs, named by the caller as the call that resolves it (qgate.models.resolve_model
# bound to the contract's model): it returns (absolute directory, its record for the results). The
# spine calls it once it holds DIR, so a live earlier run is refused before a model is built or trained.
ModelResolver = Callable[[], tuple[str, dict]]


@dataclass(frozen=True)
class ArmPlan:
    """One arm to run: a name (the result file's stem), its env and its engine args."""

    name: str
    env: dict[str, str]
    engine_args: dict[str, Any]


def contract_arms(loaded: LoadedContract, names: tuple[str, ...] = ARMS) -> list[ArmPlan]:
    c = loaded.contract
    return [ArmPlan(n, c.env_for(n), c.engine_for(n)) for n in names]


def result_header(kind: str, schema_version: int, loaded: LoadedContract, plan: ArmPlan, model: dict) -> dict:
    """What every arm result starts with: who ran what, under which contract, env and engine args."""
    return {
        "kind": kind,
        "schema_version": schema_version,
        "arm": plan.name,
        "contract": loaded.reference(),
        "env": dict(plan.env),
        "engine_args": dict(plan.engine_args),
        "model": model,
        "fingerprint": None,
        "launches": [],
        "routes": {},
        "dropped_env": [],
        "inherited_env": None,  # set before the first engine start (engine/segment.py)
        "complete": False,
    }


class Workload(Protocol):
    """What a workload gives the spine."""

    @property
    def kind(self) -> str:
        """The child's workload, and the name of its result, attestation and log folders."""
        ...

    @property
    def launches(self) -> int:
        """Engine starts per arm."""
        ...

    @property
    def runner(self) -> str:
        """What the engine child runs: `package.module:function`, called (engine adapter, spec, emit)."""
        ...

    def label(self, arm: str, launch: int) -> str:
        """The engine start as error messages name it."""
        ...

    def open(self, plan: ArmPlan, model: dict) -> dict:
        """The arm's result: fresh, or the saved one when resuming (refusing to clobber one)."""
        ...

    def spec(self, plan: ArmPlan, launch: int, result: dict) -> dict | None:
        """The child's workload spec for this launch (None: nothing left to run in it)."""
        ...

    def launch_fields(self, launch: int) -> dict:
        """Keys of a `launches` entry before the shared ones (segment, engine_start_s, started_at)."""
        ...

    def on_record(self, plan: ArmPlan, result: dict, event: dict) -> None:
        """Fold one record of the child into the result (and onto disk as the workload keeps it)."""
        ...

    def save(self, plan: ArmPlan, result: dict) -> None: ...

    def finish(self, result: dict) -> None:
        """Set what only the arm's whole run decides (`complete`), before its last save."""
        ...


class ArmRun(TypedDict, total=False):
    """How a workload's run entry point may be asked to run (its **kwargs, passed on to run_arms)."""

    plans: list[ArmPlan] | None  # derived arms (the ablation's) instead of the contract's
    progress: Progress | None
    kill_leftovers: bool


def run_launch(
    workload: Workload, plan: ArmPlan, env: ArmEnv, launch: int, result: dict, out_dir: Path,
    model_path: str, progress: Progress | None, stall_timeout_s: float | None = None,
) -> dict:  # fmt: skip
    """One engine start of one arm: the workload's spec, every record folded into `result`, saved."""
    spec = workload.spec(plan, launch, result)
    if spec is None:
        return result
    arm, kind = plan.name, workload.kind
    segment = len(result["launches"])
    attest_dir = out_dir / "attest" / kind / arm / f"segment-{segment}"
    child_spec = {
        "workload": kind, "runner": workload.runner, "model_path": model_path,
        "engine_args": plan.engine_args, **spec,
    }  # fmt: skip

    def on_event(ev: dict) -> None:
        if ev.get("event") == "engine_ready":
            result["fingerprint"] = ev["fingerprint"]
            result["launches"].append(
                {**workload.launch_fields(launch), "segment": segment,
                 "engine_start_s": ev["engine_start_s"], "started_at": utc_now()}
            )  # fmt: skip
        workload.on_record(plan, result, ev)
        if progress is not None:
            progress(arm, ev, result)

    log = out_dir / "logs" / f"{kind}-{arm}.log"
    label = workload.label(arm, launch)
    # The launcher reads the stall timeout from the spec (the child ignores it): run_segment's
    # signature, a seam tests stand in for, stays as it is.
    child_spec["stall_timeout_s"] = stall_timeout_s
    return run_segment(
        child_spec, env, log, attest_dir, result, on_event, lambda res: workload.save(plan, res), label
    )


def run_arms(
    loaded: LoadedContract,
    out_dir: Path,
    workload: Workload,
    arms: tuple[str, ...] = ARMS,
    *,
    model: ModelResolver,
    plans: list[ArmPlan] | None = None,
    progress: Progress | None = None,
    kill_leftovers: bool = False,
) -> dict[str, dict]:
    """Run every launch of every arm, interleaved in a random first order drawn per run and recorded in
    each result (engine/order.py: e.g. candidate, control | candidate, control | ...); returns the results.

    The contract's `arms`, or `plans` in their place (derived arms: the ablation's), on the model that
    `model` resolves (the caller's: qgate.models; the engine knows no model names), called once DIR is
    held. Each arm's environment is built once from its plan and this process's environment; a kept
    result (--resume) whose launches ran in another one is refused, then every arm's env is checked
    (preflight.check_arm_envs), before any engine starts. An arm's result is finished (`complete` set,
    saved) right after its last launch. Live processes of an earlier run in out_dir
    are refused, or ended with `kill_leftovers` (engine/procs.py).
    """
    plans = plans if plans is not None else contract_arms(loaded, arms)
    envs = {p.name: arm_env(p.name, p.env, os.environ) for p in plans}
    with claimed(out_dir, kill_leftovers):  # before any work: a live earlier run is refused at once
        model_path, model_record = model()
        results = {p.name: workload.open(p, model_record) for p in plans}
        for p in plans:  # a resume from another environment: refused before the pre-flight's minute
            refuse_changed_env(results[p.name], envs[p.name], p.name)
        # A broken route override fails here, before any engine starts.
        check_arm_envs(envs.values())
        order = plan_order([p.name for p in plans], results.values())  # recorded in each result
        for res in results.values():
            res["launch_order"] = order.to_dict()
        by_name = {p.name: p for p in plans}
        try:
            for launch in range(workload.launches):
                for plan in (by_name[name] for name in order.arms(launch)):
                    res = run_launch(
                        workload, plan, envs[plan.name], launch, results[plan.name], out_dir, model_path,
                        progress, loaded.contract.stall_timeout_s,
                    )  # fmt: skip
                    if launch == workload.launches - 1:  # the arm's last launch: its result is final
                        workload.finish(res)
                        workload.save(plan, res)
                    results[plan.name] = res
        except OSError as exc:  # a full disk mid-run: the records written so far stay, --resume goes on
            if exc.errno not in WRITE_FAILURES:  # an --out that cannot be a folder: bad input, exit 2
                raise
            raise WriteFailure(exc) from None
    return results


# What a write can run into mid-run that is no fault of the input: the run failed (exit 1), its records
# up to the last good write are kept, and the same command with --resume continues once it is fixed.
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


class WriteFailure(RunFailure):
    """An OSError while a run writes its records (a full disk, a quota): a run that failed, exit 1; the
    CLI adds what was kept and the way on (--resume), which the atomic writes keep true."""

    def __init__(self, exc: OSError) -> None:
        where = f"{exc.filename}: " if exc.filename else ""
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        hint = " (free space on that filesystem first)" if full else ""
        super().__init__(f"cannot write the run's records: {where}{exc.strerror or exc}{hint}")
