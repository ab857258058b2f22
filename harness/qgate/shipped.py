"""The files qgate ships as package data (harness/qgate/data/), found with importlib.resources and never
through the source tree, so that an installed wheel runs `qgate demo` and validates the shipped contracts.

- data/contracts/: every contract of the repository's contracts/ folder (in the checkout a link to it,
  so contracts/ stays the one place to edit them; the wheel holds copies), demo-cpu.yaml among them;
- data/faulty_routes/: the test-only gamed GEMV routes `qgate demo --faulty-kind` switches in
  (qgate.demo.FAULTY_KINDS; links to tests/fixtures in the checkout, copies in the wheel). The engine
  imports them by module name from an arm's PYTHONPATH, so they are files on disk, not a qgate package.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from qgate.errors import QgateError


def _data(*parts: str) -> Path:
    found = files("qgate").joinpath("data", *parts)
    # The engine and the YAML reader take paths: a qgate imported from a zip has none to give.
    if not isinstance(found, Path):
        raise QgateError(f"qgate's package data is not on disk ({found}): install qgate unzipped")
    return found


def contracts_dir() -> Path:
    """The folder of the shipped contracts."""
    return _data("contracts")


def contract(name: str) -> Path:
    """The shipped contract `name` (e.g. "demo-cpu.yaml")."""
    return contracts_dir() / name


def contracts() -> list[Path]:
    """Every shipped contract, by name."""
    return sorted(contracts_dir().glob("*.yaml"))


def faulty_routes_dir() -> Path:
    """The folder of the demo's gamed GEMV modules (a PYTHONPATH entry for the faulty candidate)."""
    return _data("faulty_routes")
