"""The header every arm result starts with (qgate.engine.arms.result_header; speed and quality):
who ran what, under which contract, env and engine args, and its engine starts and route counts.

Arm results are read back across their schema versions and hand-written reference results hold only
what a comparison reads, so the header's keys beyond the contract are optional here (qgate.record_check
asks for what each kind needs); unknown keys are kept (`Open`): the writers of the workloads add keys
while a session runs, and what a figure is computed from is typed below."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from qgate.records.base import Open
from qgate.records.parts import ContractRef, Launch, ModelRef, RouteCounts

Scalar = str | int | float | bool | None


class ArmHeader(Open):
    arm: str | None = Field(None, min_length=1)
    contract: ContractRef
    run_id: str | None = Field(None, min_length=1)
    env: dict[str, str] | None = None
    engine_args: dict[str, Any] | None = None
    model: ModelRef | None = None
    fingerprint: dict[str, Scalar] | None = None
    launches: list[Launch] | None = None
    routes: dict[str, RouteCounts] | None = None
    shims: dict[str, Any] | None = None
    dropped_env: list[str] | None = None
    inherited_env: dict[str, str] | None = None
    complete: bool | None = None
