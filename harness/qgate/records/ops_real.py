"""`kind: ops_real`: real-weight operator bounds (qgate.ops.real, `qgate run ops --real`).

Format history:
  1: first version.
  2: casts, weight_failures, hc_dtype, route_dtypes, skipped, per role `bound` and chain_max_ulp
     (max_ulp_bound gone), per route `bias`; `recording` (the recording's ranks and shapes against the
     slices, qgate.ops.recorded) and `topk` (the QSA top-k on recorded score rows).
  3: with an arm (`qgate demo` on a contract without an ops section): `arm`, `overrides` (the arm's
     QGATE_ROUTE_IMPL_* screened in place of the kernels) and `unseen` (qgate.ops.seen.blind_spots).
"""

from __future__ import annotations

from typing import Any, Literal

from qgate.records.ops import OpsHeader


class OpsReal(OpsHeader):
    kind: Literal["ops_real"]
    schema_version: Literal[1, 2, 3]
    model_dir: str
    tp: int
    dtype: str
    roles: list[dict[str, Any]]
    passed: bool
    sites: Any = None
    bias: list[dict[str, Any]] | None = None
    arm: str | None = None
    overrides: dict[str, str] | None = None
    unseen: list[str] | None = None
