"""`qgate run ops` and `qgate bench ops` as plain functions: contract in, records written and returned.

Files: DIR/ops/ops.json + ops.md (screen), DIR/ops/bench.json + bench.md (benchmark). An existing
record is never overwritten unless `force` is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract
from qgate.errors import QgateError
from qgate.ops.schema import Ops
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
    c = loaded.contract
    return {"name": c.name, "version": c.version, "sha256": loaded.sha256, "path": loaded.path}


def _cases(ops: Ops) -> list:
    from qgate.ops.cases import build_cases

    shapes = {route: [s.model_dump() for s in getattr(ops.shapes, route)] for route in ops.routes}
    cases = build_cases(list(ops.routes), shapes, ops.default_shapes)
    if not cases:
        raise OpsError("ops: no shapes to run (default_shapes is false and ops.shapes lists none)")
    return cases


def _target(out: Path, name: str, force: bool) -> Path:
    path = out / "ops" / name
    if path.exists() and not force:
        raise OpsError(f"{path} exists; use --force to replace it")
    return path


def run_ops(
    loaded: LoadedContract, out: Path, device: str = "auto", trials: int | None = None, force: bool = False
) -> dict[str, Any]:
    """Screen every route at the contract's shapes; writes ops.json and ops.md; returns the record."""
    from qgate.ops.screen import run_screen
    from qgate.report.ops import screen_markdown

    ops = _ops_section(loaded)
    path = _target(out, "ops.json", force)
    dev = resolve_device(device)
    tolerances = {route: ops.tolerance(route).model_dump() for route in ops.routes}
    record = run_screen(_cases(ops), trials or ops.trials, tolerances, dev, ops.seed, _contract_ref(loaded))
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
