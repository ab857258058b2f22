"""The typed record kinds: one pydantic model per kind qgate writes to disk, its schema versions in code.

Below everything that reads or writes records (it imports nothing of qgate but errors.py): results.py
takes its SCHEMAS from here, loaders validate through `validate`, and `qgate records schema` writes the
JSON Schema of each model to schemas/ (checked in; tests/test_records.py keeps them equal).

    speed.py quality.py      the arm results (arm.py: their shared header)
    verdict.py ablation.py   what `compare` and `ablate` decided
    timeline.py demo.py processes.py
    ops.py ops_bench.py ops_bench_cpu.py ops_real.py   the operator screen and benches
    night.py                 one history row (night.COLUMNS), not a file of its own
    parts.py base.py         shared parts; the base model and the one-line error
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from qgate.records.ablation import Ablation
from qgate.records.base import Record, ResultError, one_line
from qgate.records.demo import Demo
from qgate.records.night import NightRow
from qgate.records.ops import Ops
from qgate.records.ops_bench import OpsBench
from qgate.records.ops_bench_cpu import OpsBenchCpu
from qgate.records.ops_real import OpsReal
from qgate.records.processes import Processes
from qgate.records.quality import Quality
from qgate.records.speed import Speed
from qgate.records.timeline import Timeline
from qgate.records.verdict import Verdict

_KINDS = (Speed, Quality, Verdict, Ops, OpsBench, OpsBenchCpu, OpsReal, Ablation, Demo, Processes, Timeline)
MODELS: dict[str, type[Record]] = {m.kind_name(): m for m in _KINDS}
# kind -> the schema versions this qgate reads, oldest first; the last is the one it writes.
SCHEMAS: dict[str, tuple[int, ...]] = {kind: m.schema_versions() for kind, m in MODELS.items()}


R = TypeVar("R", bound=BaseModel)


def parse(model: type[R], data: Any, where: str) -> R:
    """`data` as `model` (readers get attributes), or ResultError: one line naming the file and the key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise one_line(exc, where) from None


def validate(kind: str, data: Any, where: str) -> Record:
    """The record as its kind's model, or ResultError: one line naming the file and the key."""
    return parse(MODELS[kind], data, where)


def json_schemas() -> dict[str, dict[str, Any]]:
    """name -> the JSON Schema of its model: every record kind, and `night` (a history row)."""
    models: dict[str, type[BaseModel]] = {**MODELS, "night": NightRow}
    return {name: model.model_json_schema(mode="validation") for name, model in models.items()}


def schema_files() -> dict[str, str]:
    """file name -> text of schemas/ (`qgate records schema --out schemas`): one file per name."""
    return {
        f"{name}.schema.json": json.dumps(s, indent=2, sort_keys=True) + "\n"
        for name, s in json_schemas().items()
    }


__all__ = [
    "MODELS",
    "SCHEMAS",
    "NightRow",
    "Record",
    "ResultError",
    "json_schemas",
    "parse",
    "schema_files",
    "validate",
]
