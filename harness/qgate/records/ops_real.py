"""`kind: ops_real`: real-weight operator bounds (qgate.ops.real, `qgate run ops --real`).

Format history:
  1: first version.
  2: casts, weight_failures, hc_dtype, route_dtypes, skipped, per role `bound` and chain_max_ulp
     (max_ulp_bound gone), per route `bias`; `recording` (the recording's ranks and shapes against the
     slices, qgate.ops.recorded) and `topk` (the QSA top-k on recorded score rows).
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.ops import OpsHeader


class OpsReal(OpsHeader):
    kind: Literal["ops_real"]
    schema_version: Literal[1, 2]
    model_dir: str
    tp: int
    dtype: str
    roles: list[dict[str, Any]]
    passed: bool
    sites: Any = None
    bias: list[dict[str, Any]] | None = None
