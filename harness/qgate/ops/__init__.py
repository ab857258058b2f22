"""The operator screen (`qgate run ops`) and benchmark (`qgate bench ops`) of the kernels_ext routes.

Kept light: importing qgate.ops (or qgate.contract.ops, which the contract uses) imports neither torch
nor qgate_kernels; screen.py, bench.py and cases.py do, when a command needs them.
"""
