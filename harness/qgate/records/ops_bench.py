"""`kind: ops_bench`: the CUDA operator benchmark (qgate.ops.bench, `qgate bench ops`).

Format history:
  4: the headline is the decode step (cases carry decode_step; vs_best and target_met judge it, the
     back-to-back ratio is vs_best_back_to_back) and the record carries the layer chains. 1-3 (vs_best
     judged back to back) are no longer read: rendered as today they would misstate it.
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.ops import OpsHeader


class OpsBench(OpsHeader):
    kind: Literal["ops_bench"]
    schema_version: Literal[4]
    timing: str
    config: dict[str, Any]
    cases: list[dict[str, Any]]
    copy_gb_s: float | None = None
    copy_detail_gb_s: dict[str, Any] | None = None
    chains: dict[str, Any] | None = None
