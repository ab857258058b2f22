"""`kind: demo`: the summary of `qgate demo` (qgate.demo.run_demo: DIR/summary.json).

Format history:
  1: first version.
  2: the speed gate's outcome lists the candidate's routes that ran (`routes`).
  3: `faulty` is the faulty kind or null, the screen's outcome lists what it did not see (`unseen`,
     `bitwise_all`), `claims` (what the summary may say, from the gates of the run), `faulty_what`.
  4: a gate the contract has no section for is "NOT RUN" (the production-shape contracts: no quality
     gate); `screen` says which screen ran ("shapes": the ops section's, "real": the checkpoint's
     weights); `until_decided` (the speed gate's --max-launches, null: the contract's launches).

Top-level keys are refused unless named (extra="forbid"): the summary is written at once.
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.base import Open, Record
from qgate.records.parts import ContractRef


class DemoGate(Open):
    """One of the demo's three gates (screen, speed, quality) as it ran, or NOT RUN."""

    gate: str
    verdict: Literal["PASS", "FAIL", "INCONCLUSIVE", "ERROR", "NOT RUN"]
    reasons: list[str]
    seconds: float
    figure: str | None = None
    report: str | None = None


class Demo(Record):
    kind: Literal["demo"]
    schema_version: Literal[1, 2, 3, 4]
    created_at: str
    contract: ContractRef
    out: str
    verdict: Literal["PASS", "FAIL", "INCONCLUSIVE", "ERROR"]
    gates: list[DemoGate]
    model: dict[str, Any]
    faulty: str | bool | None = None
    faulty_caught: bool | None = None
    faulty_what: str | None = None
    screen_device: str | None = None
    screen: Literal["shapes", "real"] | None = None
    until_decided: int | None = None
    candidate_env: dict[str, str] | None = None
    claims: dict[str, bool] | None = None
    gates_seconds: float | None = None
    total_seconds: float | None = None
    next_step: str | None = None
    load_avg_end: list[float] | None = None
