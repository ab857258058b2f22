"""The operator screen (`qgate run ops`) and benchmark (`qgate bench ops`) of the kernels_ext routes.

Kept light: importing qgate.ops (or qgate.ops.schema, which the contract uses) imports neither torch
nor qgate_kernels; screen.py, bench.py and cases.py do, when a command needs them.
"""

OPS_SCHEMA_VERSION = 1
# 2: cases may carry plain_timing and after_producer (launch conditions); 3: and by_input (the route
# timed on each kind of input the case draws, e.g. top-k rows with and without heavy ties)
BENCH_SCHEMA_VERSION = 3
