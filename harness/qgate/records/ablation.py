"""`kind: ablation`: what `qgate ablate` measured and decided (qgate.ablate.build_record).

Format history:
  1: no longer read (its route rows cannot be rendered by report/ablation.py).
  2: route rows hold hits by role and fallbacks by reason as mappings (routes.route_summary), no
     formatted text.
  3: `sequential`, the looks of `qgate ablate --until-decided` (null otherwise).
  4: `timeline`, the decode-step timeline of `qgate ablate --timeline DIR` (null otherwise; 2 and 3 are
     read as without one).

Top-level keys are refused unless named (extra="forbid"): the record is written at once; its effects
and arms' figures are the statistics' data (mappings: report/ablation.py renders them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qgate.records.base import Open, Record
from qgate.records.parts import ContractRef, GateRecord
from qgate.records.timeline import Timeline


class Factor(Open):
    name: str
    kind: str
    vars: dict[str, dict[str, str | None]]  # env var -> {arm: value; null: unset}


class ArmRow(Open):
    name: str
    env: dict[str, str]
    factors_on: list[str]
    path: str | None = None
    gates_passed: bool
    attested: bool
    figures: dict[str, Any] | None = None


class Ablation(Record):
    kind: Literal["ablation"]
    schema_version: Literal[2, 3, 4]
    status: str
    reasons: list[str]
    notes: list[str]
    created_at: str
    contract: ContractRef
    design: str
    stats: dict[str, Any]
    factors: list[Factor]
    arms: list[ArmRow] = Field(min_length=1)
    effects: dict[str, Any]
    quality: dict[str, Any] | None = None
    gates: list[GateRecord]
    sequential: dict[str, Any] | None = None
    timeline: Timeline | None = None
