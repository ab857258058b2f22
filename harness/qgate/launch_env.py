"""The env variables qgate's launcher sets in every engine process it starts, by name: a leaf below the
code that sets them (engine/launcher.py, lifeline.py, procs.py) and the contract, which refuses an arm
env that sets one (issue 39: the contract imported the names from engine/, a room above it).
Standard library only."""

from __future__ import annotations

from qgate_route_env import ATTEST_DIR_ENV

LIFELINE_ENV = "QGATE_LIFELINE_PPID"  # the pid whose death ends the process (engine/lifeline.py)
PIDS_ENV = "QGATE_RUN_PIDS"  # the pid file every process of the run registers in (engine/lifeline.py)
RUN_ENV = "QGATE_RUN"  # the run's token, found by walking /proc (engine/procs.py)
UNBUFFERED_ENV = "PYTHONUNBUFFERED"  # records and log lines leave the child as they are written
# Set by the launcher for every engine (and the attestation folder, route_env's): an arm cannot.
LAUNCHER_ENV = (ATTEST_DIR_ENV, RUN_ENV, PIDS_ENV, LIFELINE_ENV, UNBUFFERED_ENV)
