"""`kind: ops`: the operator screen (qgate.ops.screen.run_screen, `qgate run ops`), and the header
every operator record starts with (qgate.ops.screen.record_header).

Format history:
  1: first version.
  2: arm and overrides (the arm's QGATE_ROUTE_IMPL_* screened in place of the kernels; an overridden
     case has fallback_probe null).
  3: per case `bound` (the forward-error bound's tally: qgate.ops.bound) and `judged_ulp`; per route
     `bias` (the sign test); GEMV / GDN failures are the bound's, not max_ulp's.
  4: `unseen`, what of the arm's code the screen did not run (qgate.ops.seen; null without an arm).

The operator records keep unknown keys (extra="allow"): their bodies are per-case figures of kernels
timed and screened on GPU machines, four kinds over eleven versions; the header and the verdict-bearing
keys are typed.
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.base import Record


class OpsHeader(Record):
    model_config = Record.model_config | {"extra": "allow"}

    contract: dict[str, Any] | None = None  # the contract's ops section as run (null: none)
    started_at: str
    seed: int
    device: dict[str, Any]


class Ops(OpsHeader):
    kind: Literal["ops"]
    schema_version: Literal[1, 2, 3, 4]
    cases: list[dict[str, Any]]
    passed: bool
    arm: str | None = None
    overrides: dict[str, str] | None = None
    bias: list[dict[str, Any]] | None = None
    unseen: Any = None  # qgate.ops.seen.blind_spots (null without an arm)
