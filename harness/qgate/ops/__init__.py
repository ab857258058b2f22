"""The operator screen (`qgate run ops`) and benchmark (`qgate bench ops`) of the kernels_ext routes.

Kept light: importing qgate.ops (or qgate.ops.schema, which the contract uses) imports neither torch
nor qgate_kernels; screen.py, bench.py and cases.py do, when a command needs them.
"""

from qgate.results import current_schema

OPS_SCHEMA_VERSION = current_schema("ops")
BENCH_SCHEMA_VERSION = current_schema("ops_bench")  # its history: qgate.results.SCHEMAS
