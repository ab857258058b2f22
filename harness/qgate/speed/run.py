"""`qgate run speed` core: the speed workload on the arm spine, DIR/speed/<arm>.json kept current.

The arm file is rewritten atomically after every rep, so a run killed at any moment loses no completed
rep; `resume=True` continues from the saved reps; a finished or partial file is never overwritten
without being asked to resume. Launches are interleaved by the spine (qgate.engine.arms).
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qgate import models
from qgate.contract import LoadedContract
from qgate.contract.speed import PROMPT_KEYS
from qgate.engine.arms import ARMS, ArmPlan, ArmRun, contract_arms, result_header, run_arms
from qgate.engine.launcher import EngineError
from qgate.results import SPEED_SCHEMA_VERSION, ResultError, atomic_write_json, load_result

if TYPE_CHECKING:  # typing.Unpack is Python 3.11; pyproject allows 3.10
    from typing_extensions import Unpack


def arm_path(out_dir: Path, arm: str) -> Path:
    return out_dir / "speed" / f"{arm}.json"


def new_result(loaded: LoadedContract, plan: ArmPlan, model: dict, seed: int | None = None) -> dict[str, Any]:
    s = loaded.contract.speed
    assert s is not None
    return {
        **result_header("speed", SPEED_SCHEMA_VERSION, loaded, plan, model),
        # One per result file (this arm of this run; --resume keeps it): every rep carries it, so a rep
        # copied in from another run's file is refused (qgate.speed.record).
        "run_id": uuid.uuid4().hex,
        "prompt": {**s.prompt(seed), "sha256": None},
        "workload": s.workload(),
        "warmups": [],
        "reps": [],
    }


# A drawn seed fits a signed 64-bit integer: the history's column (SQLite INTEGER, Postgres BIGINT).
SEED_BITS = 63


def run_seed(loaded: LoadedContract, out_dir: Path, arms: tuple[str, ...] = ARMS) -> int:
    """The prompt seed of a run in out_dir (MLPerf's TEST05: not known before the run): the contract's
    when it pins one; else the seed an arm result already in out_dir was run with (a resumed run, or the
    other arm run on its own into the same folder: both arms must decode the same prompts); else a fresh
    one from the OS's random source, drawn now."""
    s = loaded.contract.speed
    assert s is not None
    if s.prompt_seed is not None:
        return s.prompt_seed
    seen: dict[int, str] = {}
    for arm in dict.fromkeys((*ARMS, *arms)):
        path = arm_path(out_dir, arm)
        if path.exists():
            seed = load_result(path, kind="speed").get("prompt", {}).get("seed")
            if isinstance(seed, int) and not isinstance(seed, bool):
                seen.setdefault(seed, arm)
    if len(seen) > 1:
        raise ResultError(
            f"{out_dir / 'speed'}: the arm results there were run with different prompt seeds "
            f"({', '.join(f'{arm} {seed}' for seed, arm in seen.items())}): not one run to continue"
        )
    return next(iter(seen)) if seen else secrets.randbits(SEED_BITS)


def open_result(
    loaded: LoadedContract, plan: ArmPlan, out_dir: Path, resume: bool, model: dict, seed: int | None = None
) -> dict:
    """A fresh result, or the saved one when resuming; refuse to clobber or to mix contracts."""
    path = arm_path(out_dir, plan.name)
    if not path.exists():
        return new_result(loaded, plan, model, seed)
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
    if seed is not None and saved.get("prompt", {}).get("seed") != seed:
        raise ResultError(
            f"{path}: saved with prompt seed {saved['prompt'].get('seed')}, not {seed}: cannot resume"
        )
    return saved


def missing_reps(result: dict, launch: int, repetitions: int) -> list[int]:
    done = {r["index"] for r in result["reps"]}
    first = launch * repetitions
    return [i for i in range(first, first + repetitions) if i not in done]


@dataclass(frozen=True)
class SpeedWorkload:
    """The spine's speed workload: per launch, warmup and the launch's missing reps (qgate.speed.workload)."""

    loaded: LoadedContract
    out_dir: Path
    resume: bool
    kind: str = "speed"
    runner: str = "qgate.speed.workload:run_reps"
    launch_count: int | None = None  # --until-decided: the launches of this look, not the contract's
    prompt_seed: int | None = None  # the run's (run_seed); None: the contract's pinned one

    @property
    def seed(self) -> int:
        s = self.loaded.contract.speed
        assert s is not None
        seed = self.prompt_seed if self.prompt_seed is not None else s.prompt_seed
        if seed is None:
            raise ResultError("the speed workload was given no prompt seed (qgate.speed.run.run_seed)")
        return seed

    @property
    def launches(self) -> int:
        assert self.loaded.contract.speed is not None
        return self.launch_count or self.loaded.contract.speed.launches

    def open(self, plan: ArmPlan, model: dict) -> dict:
        result = open_result(self.loaded, plan, self.out_dir, self.resume, model, self.seed)
        if self.launch_count is not None:  # a look of --until-decided: complete again after its last launch
            result["workload"]["launches"] = self.launch_count
            reps = self.loaded.contract.speed.repetitions if self.loaded.contract.speed is not None else 0
            result["complete"] = len(result["reps"]) == self.launches * reps
        return result

    def spec(self, plan: ArmPlan, launch: int, result: dict) -> dict | None:
        s = self.loaded.contract.speed
        assert s is not None
        todo = missing_reps(result, launch, s.repetitions)
        if not todo:
            return None
        # The child reads the prompt's fields by their schema names and the workload's keys.
        prompt = {key: getattr(s, key) for key in PROMPT_KEYS}
        prompt["prompt_seed"] = self.seed
        return {**prompt, **s.workload(), "launch": launch, "rep_indices": todo}

    def label(self, arm: str, launch: int) -> str:
        return f"{arm} launch {launch}"

    def launch_fields(self, launch: int) -> dict:
        return {"launch": launch}

    def on_record(self, plan: ArmPlan, result: dict, event: dict) -> None:
        kind = event.get("event")
        if kind == "prompt":
            if result["prompt"]["sha256"] not in (None, event["sha256"]):
                raise EngineError(f"{plan.name}: prompt changed between launches ({event['sha256'][:12]})")
            result["prompt"]["sha256"] = event["sha256"]
        elif kind == "warmup":  # the warm-ups' prompts are kept so that no rep can be shown to reuse one
            # A launch run again after a kill warms up on the same prompt again: kept once.
            warm = {k: event.get(k) for k in ("launch", "index", "prompt_sha256")}
            if warm not in result.setdefault("warmups", []):
                result["warmups"].append(warm)
        elif kind == "rep":
            rep = event["rep"]
            if "run_id" in result:  # a result of schema 1 (resumed) records none
                rep = {**rep, "run_id": result["run_id"]}
            result["reps"].append(rep)
            result["reps"].sort(key=lambda r: r["index"])
            self.save(plan, result)
        elif kind == "repeat":  # TEST04's repeated rep: its speed and its tokens' hash, not the arrays
            drop = ("token_ids", "top_ids", "top_logprobs")
            again = {k: v for k, v in event["repeat"].items() if k not in drop}
            result.setdefault("repeats", []).append(again)
            self.save(plan, result)

    def save(self, plan: ArmPlan, result: dict) -> None:
        atomic_write_json(arm_path(self.out_dir, plan.name), result)

    def finish(self, result: dict) -> None:
        s = self.loaded.contract.speed
        assert s is not None
        result["complete"] = len(result["reps"]) == self.launches * s.repetitions


def run_speed(
    loaded: LoadedContract, out_dir: Path, arms: tuple[str, ...] = ARMS, resume: bool = False,
    **run: Unpack[ArmRun],
) -> dict[str, dict]:  # fmt: skip
    """Every launch of every arm (engine.arms.run_arms: plans, progress, kill_leftovers), then the audit
    of the candidate's timed output (run_audit); the results."""
    if loaded.contract.speed is None:
        raise ResultError(f"{loaded.path}: speed = None: the contract has no speed section")
    model = lambda: models.resolve_model(loaded.contract.model)  # noqa: E731 (resolved by the spine, holding DIR)
    seed = run_seed(loaded, out_dir, tuple(p.name for p in run.get("plans") or []) or arms)
    work = SpeedWorkload(loaded, out_dir, resume, prompt_seed=seed)
    results = run_arms(loaded, out_dir, work, arms, model=model, **run)
    return run_audit(loaded, out_dir, results, seed, **run)


AUDIT_ARM = "control-audit"  # the audit's engine start: its log, attestation folder and progress label


@dataclass(frozen=True)
class AuditWorkload:
    """One engine start of the control's env after the timed launches, on no clock: the control's model
    scores the candidate's reps whose tokens left the control's (qgate.speed.audit). Its record goes
    into the control's result under `audit` (the reps scored, its engine start, its route counts: none
    may have run), which compare reads."""

    loaded: LoadedContract
    out_dir: Path
    control: dict
    items: list
    prompt_seed: int
    kind: str = "speed"
    runner: str = "qgate.speed.workload:run_reps"
    launches: int = 1

    def open(self, plan: ArmPlan, model: dict) -> dict:
        audit = dict(self.control.get("audit") or {})
        return {
            "arm": plan.name, "env": dict(plan.env), "engine_args": dict(plan.engine_args),
            "fingerprint": None, "launches": [], "routes": {}, "dropped_env": [], "inherited_env": None,
            "reps": list(audit.get("reps") or []), "prompt": {"sha256": None},
        }  # fmt: skip

    def spec(self, plan: ArmPlan, launch: int, result: dict) -> dict | None:
        s = self.loaded.contract.speed
        assert s is not None
        prompt = {key: getattr(s, key) for key in PROMPT_KEYS}
        prompt["prompt_seed"] = self.prompt_seed
        work = {**s.workload(), "warmup": 0}
        return {**prompt, **work, "launch": launch, "rep_indices": [], "audit": self.items}

    def label(self, arm: str, launch: int) -> str:
        return "control audit (the candidate's timed output scored by the control's model)"

    def launch_fields(self, launch: int) -> dict:
        return {"audit": True}

    def on_record(self, plan: ArmPlan, result: dict, event: dict) -> None:
        kind = event.get("event")
        if kind == "prompt" and event["sha256"] != self.control["prompt"].get("sha256"):
            raise EngineError(f"{plan.name}: the prompt plan differs from the control's timed launches")
        if kind == "audit":
            result["reps"].append(event["audit"])
            self.save(plan, result)

    def save(self, plan: ArmPlan, result: dict) -> None:
        keys = ("launches", "routes", "dropped_env", "fingerprint", "reps")
        self.control["audit"] = {key: result[key] for key in keys}
        atomic_write_json(arm_path(self.out_dir, "control"), self.control)

    def finish(self, result: dict) -> None:
        pass


def run_audit(
    loaded: LoadedContract, out_dir: Path, results: dict[str, dict], seed: int, **run: Unpack[ArmRun]
) -> dict[str, dict]:  # fmt: skip
    """The audit of the candidate's timed output (MLPerf's TEST01), once both arms' results are complete:
    the reps whose tokens differ from the control's (qgate.speed.audit.audit_items) scored in one engine
    start of the control's env and engine args; none differing: no engine start, the control's result
    records an empty audit. The contract's two arms only (an ablation's other derived arms are not
    audited; its control and candidate are, so that `compare` of its folder can judge them)."""
    from qgate.speed.audit import audit_items

    control, candidate = results.get("control"), results.get("candidate")
    if control is None or candidate is None or not (control.get("complete") and candidate.get("complete")):
        return results
    plans = run.get("plans")
    if plans is not None and not set(ARMS) <= {p.name for p in plans}:
        return results
    items = audit_items(control, candidate)
    if not items:
        control.setdefault(
            "audit", {"launches": [], "routes": {}, "dropped_env": [], "fingerprint": None, "reps": []}
        )
        atomic_write_json(arm_path(out_dir, "control"), control)
        return results
    plans = run.get("plans") or contract_arms(loaded, ARMS)
    ctrl = next(p for p in plans if p.name == "control")
    work = AuditWorkload(loaded, out_dir, control, items, seed)
    run_arms(
        loaded, out_dir, work, (AUDIT_ARM,), plans=[replace(ctrl, name=AUDIT_ARM)],
        model=lambda: models.resolve_model(loaded.contract.model),
        progress=run.get("progress"), kill_leftovers=bool(run.get("kill_leftovers")),
    )  # fmt: skip
    return {**results, "control": work.control}


def first_launches(result: dict, launches: int) -> dict:
    """The result as it stood after its first `launches` launches (a resumed run may hold a part of the
    next one): the reps of those launches, `workload.launches` set to their number."""
    reps = [r for r in result["reps"] if isinstance(r, dict) and r.get("launch", 0) < launches]
    return {**result, "reps": reps, "workload": {**result["workload"], "launches": launches}}


def run_speed_until_decided(
    loaded: LoadedContract, out_dir: Path, max_launches: int, resume: bool = False, **run: Unpack[ArmRun],
) -> tuple[dict[str, dict], dict]:  # fmt: skip
    """`qgate run speed --until-decided`: from the contract's launches (at least 2), one interleaved pair
    of launches at a time up to max_launches, a look after each (qgate.speed.sequential), stopping at
    PASS or FAIL, INCONCLUSIVE after the last. The looks are kept in each arm's result (`sequential`),
    so `--resume` after a kill continues the sequence (the same design; looks recomputed from the reps
    on disk). With `plans` (the ablation's derived arms) every arm gets each launch and the looks read
    its `control` and `candidate`. Returns the results and the sequential record."""
    s = loaded.contract.speed
    if s is None:
        raise ResultError(f"{loaded.path}: speed = None: the contract has no speed section")
    first = max(2, s.launches)
    if max_launches < first:
        raise ResultError(
            f"--max-launches {max_launches}: the first look needs {first} launches per arm "
            f"(speed.launches = {s.launches}, at least 2: the launch is the unit)"
        )
    saved = _saved_design(out_dir, resume)
    if saved is not None and saved != max_launches:
        raise ResultError(
            f"{arm_path(out_dir, 'control')}: the sequence was planned up to {saved} launches, not "
            f"{max_launches}: resume with --max-launches {saved}"
        )
    # The statistics (scipy: ~2 s of import on 2 cores) only here: a plain run must not pay them.
    from qgate.speed.compare import decode_stats
    from qgate.speed.sequential import Design, look_at
    from qgate.speed.sequential import record as sequential_record
    from qgate.stats import StatsConfig

    design = Design.plan(s.stats.alpha, first, max_launches)
    cfg = StatsConfig.from_contract(s.stats)
    looks: list = []
    results: dict[str, dict] = {}
    model = lambda: models.resolve_model(loaded.contract.model)  # noqa: E731 (resolved holding DIR)
    seed = run_seed(loaded, out_dir, tuple(p.name for p in run.get("plans") or []))
    for index, launches in enumerate(design.launches):
        work = SpeedWorkload(loaded, out_dir, resume or index > 0, launch_count=launches, prompt_seed=seed)
        results = run_arms(loaded, out_dir, work, ARMS, model=model, **run)
        control, candidate = (first_launches(results[a], launches) for a in ARMS)
        looks.append(look_at(design, index, decode_stats(control, candidate, cfg), s))
        rec = sequential_record(design, looks)
        for arm in results:  # the contract's two arms, or every derived arm of an ablation (plans)
            results[arm]["sequential"] = rec
            atomic_write_json(arm_path(out_dir, arm), results[arm])
        if rec["decision"] is not None:
            break
    results = run_audit(loaded, out_dir, results, seed, **run)
    return results, sequential_record(design, looks)


def _saved_design(out_dir: Path, resume: bool) -> int | None:
    """The max launches of a saved sequence in out_dir (resume), else None."""
    path = arm_path(out_dir, "control")
    if not (resume and path.exists()):
        return None
    seq = load_result(path, kind="speed").get("sequential")
    return int(seq["design"]["max_launches"]) if isinstance(seq, dict) else None


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
