"""`qgate run ops` and `qgate bench ops` as plain functions: contract in, records written and returned.

Files: DIR/ops/ops.json + ops.md (screen), DIR/ops/real.json + real.md (real-weight bounds),
DIR/ops/bench.json + bench.md (benchmark). An existing record is never overwritten unless `force` is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract
from qgate.contract.ops import Ops
from qgate.errors import QgateError
from qgate.results import atomic_write_json, atomic_write_text


class OpsError(QgateError):
    """Cannot run the screen or the benchmark as asked; str() is one line for the user."""


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise OpsError("--device cuda: no CUDA device is visible to torch")
    if device not in ("cpu", "cuda"):
        raise OpsError(f"--device {device!r}: expected auto, cpu or cuda")
    return device


def _ops_section(loaded: LoadedContract | None) -> Ops:
    if loaded is None or loaded.contract.ops is None:
        return Ops()
    return loaded.contract.ops


def _contract_ref(loaded: LoadedContract | None) -> dict[str, Any] | None:
    if loaded is None:
        return None
    return loaded.reference()


def _cases(ops: Ops) -> list:
    from qgate.ops.cases import build_cases

    shapes = {route: [s.model_dump() for s in getattr(ops.shapes, route)] for route in ops.routes}
    cases = build_cases(list(ops.routes), shapes, ops.default_shapes)
    if not cases:
        raise OpsError("ops: no shapes to run (default_shapes is false and ops.shapes lists none)")
    return cases


def arm_env(loaded: LoadedContract, arm: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env the arm's engine gets from the contract (or `env`, the arm's plan env, e.g. the demo's
    faulty candidate); empty without an arm."""
    if arm is None:
        return {}
    if arm not in ("control", "candidate"):
        raise OpsError(f"--arm {arm!r}: expected control or candidate")
    return dict(env) if env is not None else loaded.contract.env_for(arm)


def _arm_overrides(
    loaded: LoadedContract, arm: str | None, env: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, Any]]:
    """(route -> spec, op name -> function) of the arm's overrides, imported as the engine would (with
    the arm's PYTHONPATH in front); OpsError naming the variable when one is unusable."""
    if arm is None:
        return {}, {}
    import sys

    from qgate_kernels import overrides

    for entry in reversed([e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        return overrides.overrides_in(env), overrides.op_replacements(env)
    except overrides.OverrideError as exc:
        raise OpsError(f"{loaded.path}: arms.{arm}.env: {exc}") from None


def _target(out: Path, name: str, force: bool) -> Path:
    path = out / "ops" / name
    if path.exists() and not force:
        raise OpsError(f"{path} exists; use --force to replace it")
    return path


def run_ops(
    loaded: LoadedContract,
    out: Path,
    device: str = "auto",
    trials: int | None = None,
    force: bool = False,
    arm: str | None = None,
    env: Mapping[str, str] | None = None,
    control_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Screen every route at the contract's shapes; writes ops.json and ops.md; returns the record.
    `arm`: screen what that arm runs: its route overrides (QGATE_ROUTE_IMPL_*) in place of the kernels,
    from the contract's arm env or `env` (the arm's plan env); the record's `unseen` lists what of the
    arm's code the screen did not run (qgate.ops.seen; for the candidate, its env against the
    control's: `control_env` or the contract's), None without an arm."""
    from qgate.ops.screen import run_screen
    from qgate.ops.seen import blind_spots
    from qgate.report.ops import screen_markdown

    ops = _ops_section(loaded)
    path = _target(out, "ops.json", force)
    dev = resolve_device(device)
    tolerances = {route: ops.tolerance(route).model_dump() for route in ops.routes}
    env = arm_env(loaded, arm, env)
    specs, replacements = _arm_overrides(loaded, arm, env)
    record = run_screen(
        _cases(ops),
        trials or ops.trials,
        tolerances,
        dev,
        ops.seed,
        _contract_ref(loaded),
        arm=arm,
        overrides={r: s for r, s in specs.items() if r in ops.routes},
        replacements=replacements,
    )
    # the candidate's env against the control's (as planned: `control_env`, or the contract's)
    control = (
        (control_env if control_env is not None else loaded.contract.env_for("control"))
        if arm == "candidate"
        else None
    )
    record["unseen"] = blind_spots(env, ops.routes, control) if arm is not None else None
    atomic_write_json(path, record)
    atomic_write_text(path.with_suffix(".md"), screen_markdown(record))
    return record


def bench_ops(
    loaded: LoadedContract | None,
    out: Path | None,
    device: str = "auto",
    reps: int | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Benchmark every route against its baseline; writes bench.json and bench.md when out is given."""
    from qgate.ops.bench import run_bench
    from qgate.report.ops import bench_markdown

    ops = _ops_section(loaded)
    path = _target(out, "bench.json", force) if out is not None else None
    dev = resolve_device(device)
    cfg = ops.bench.model_dump()
    if reps is not None:
        cfg["reps"] = reps
    record = run_bench(_cases(ops), cfg, dev, ops.seed, _contract_ref(loaded))
    if path is not None:
        atomic_write_json(path, record)
        atomic_write_text(path.with_suffix(".md"), bench_markdown(record))
    return record


_ENGINE_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "auto": "fp16"}


def run_real_ops(
    loaded: LoadedContract,
    out: Path,
    model: Path | None = None,
    tp: int | None = None,
    activations: Path | None = None,
    device: str = "auto",
    trials: int | None = None,
    force: bool = False,
    dtype: str | None = None,
    arm: str | None = None,
    env: Mapping[str, str] | None = None,
    control_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Real-weight bounds on the checkpoint (the contract's model unless `model` is given), at the
    contract's tensor parallel size and dtype (`dtype`: fp16 or bf16 instead); writes real.json and
    real.md; returns the record. `arm` (with `env`, `control_env` as in run_ops): screen the code that arm
    runs, its route overrides in place of the kernels, and list in `unseen` what of it the screen did not
    run (`qgate demo` on a production-shape contract: the candidate's own code on the real weights)."""
    from qgate.models import model_dir
    from qgate.ops.real import REAL_ROUTES, real_markdown, run_real_screen
    from qgate.ops.screen import _replaced_ops
    from qgate.ops.seen import blind_spots

    c = loaded.contract
    engine = c.engine_for("candidate")
    if dtype is not None and dtype not in ("fp16", "bf16"):
        raise OpsError(f"--dtype {dtype!r}: expected fp16 or bf16")
    dtype = dtype or _ENGINE_DTYPES.get(str(engine.get("dtype", "auto")))
    if dtype is None:
        raise OpsError(f"engine.dtype = {engine.get('dtype')!r}: the routes take float16 or bfloat16")
    path = _target(out, "real.json", force)
    where = model if model is not None else model_dir(c.model)
    if activations is not None and not activations.is_dir():
        raise OpsError(f"--activations {activations}: not a directory")
    env = arm_env(loaded, arm, env)
    specs, replacements = _arm_overrides(loaded, arm, env)
    with _replaced_ops(replacements):
        record = run_real_screen(
            where,
            tp or int(engine.get("tensor_parallel_size", 1)),
            dtype,
            activations,
            trials or _ops_section(loaded).trials,
            resolve_device(device),
            _ops_section(loaded).seed,
            _contract_ref(loaded),
            shims=tuple(c.shims),
        )
    if record["device"]["device"].startswith("cuda"):  # the demo's engines start next in this process's GPU
        import torch

        torch.cuda.empty_cache()
    if arm is not None:
        from qgate_route_env import ROUTES, switched_on

        # a route the screen skipped (HC parameters in another dtype than the activations) is named
        # with the reason; the other blind spots are the synthetic screen's (routes it has no site for,
        # start-up hooks, the arm's env)
        skipped = record["skipped"]
        screened = [r for r in REAL_ROUTES if r not in skipped]
        control = None
        if arm == "candidate":
            control = control_env if control_env is not None else c.env_for("control")
        unseen = [
            f"route {r} is switched on but the real-weight screen did not run it: {why}"
            for r, why in skipped.items()
            if r in switched_on(env)
        ]
        unseen += [
            f"route {r} is switched on but the real-weight screen has no site for it: it was not screened"
            for r in sorted(switched_on(env))
            if r not in REAL_ROUTES
        ]
        unseen += blind_spots(env, ROUTES, control)  # every route counted above: the env's blind spots
        record |= {
            "arm": arm,
            "overrides": {r: s for r, s in specs.items() if r in screened},
            "unseen": unseen,
        }
    atomic_write_json(path, record)
    atomic_write_text(path.with_suffix(".md"), real_markdown(record))
    return record
