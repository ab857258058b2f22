"""The fleet: the nightly as a matrix over GPU runners, from one checked-in list.

The list (`.github/fleet.yaml`, docs/nightly.md "From one runner to a fleet"):

    schema_version: 1
    entries:
      - name: qwen38-sm70-tp4                 # a-z, 0-9, '-': the job, the artifact, the history
        runs-on: [self-hosted, v100]          # the runner labels the entry's job asks for
        speed_contract: contracts/qwen38-sm70-tp4-decode.yaml      # at least one of the two
        quality_contract: contracts/qwen38-sm70-tp4-quality.yaml
        candidate_env: {QGATE_X: "1"}         # optional: the candidate arm's env over the contract's

Contract paths are relative to the repository root (the directory qgate runs in). `load_fleet` reads
the list strictly: an unknown key, a contract that does not exist or does not validate (or lacks the
section it is named for), two entries of one name or two entries that run the same thing are one line
naming the file and the entry (FleetError, exit 2). An entry's history is its own store in the shared
one (qgate.history.store_for); `gather` (qgate.fleet_gather) appends every entry's night.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from qgate.contract import ContractError, load_contract
from qgate.contract.strict_yaml import StrictYamlError, load_yaml
from qgate.errors import QgateError
from qgate.history import ENTRY_NAME
from qgate.results import ResultError, read_regular

FLEET_SCHEMA_VERSION = 1
MAX_FLEET_BYTES = 1024 * 1024  # a list of a few hundred entries is some tens of KiB
ARTIFACT_PREFIX = "qgate-entry-"  # an entry's run folder is uploaded as ARTIFACT_PREFIX + name
KINDS = {"speed_contract": "speed", "quality_contract": "quality"}
_ENTRY_KEYS = {"name", "runs-on", "speed_contract", "quality_contract", "candidate_env"}


class FleetError(QgateError):
    """A fleet list that cannot be used; str() is one line."""


@dataclass(frozen=True)
class Entry:
    name: str
    runs_on: tuple[str, ...]
    contracts: dict[str, str] = field(default_factory=dict)  # kind -> contract path
    candidate_env: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        """What the entry runs: two entries with one key are the same job twice."""
        return json.dumps([sorted(self.runs_on), self.contracts, self.candidate_env], sort_keys=True)


def _entry(raw: Any, where: str, root: Path) -> Entry:
    if not isinstance(raw, dict):
        raise FleetError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise FleetError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_ENTRY_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not ENTRY_NAME.fullmatch(name):
        raise FleetError(f"{where}.name = {name!r}: expected 1-40 of a-z, 0-9, '-' (starting a-z/0-9)")
    labels = raw.get("runs-on")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
        raise FleetError(f"{where}.runs-on = {labels!r}: expected a non-empty list of runner labels")
    contracts = {}
    for key, kind in KINDS.items():
        if key in raw:
            contracts[kind] = _contract(raw[key], kind, f"{where}.{key}", root)
    if not contracts:
        raise FleetError(f"{where}: names no contract (speed_contract, quality_contract or both)")
    env = raw.get("candidate_env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise FleetError(f"{where}.candidate_env = {env!r}: expected a mapping of strings to strings")
    return Entry(name, tuple(labels), contracts, dict(env))


def _contract(value: Any, kind: str, where: str, root: Path) -> str:
    if not isinstance(value, str) or not value:
        raise FleetError(f"{where} = {value!r}: expected a contract path")
    path = root / value
    if not path.is_file():
        raise FleetError(f"{where} = {value!r}: unknown contract (no such file under {root})")
    try:
        loaded = load_contract(path)
    except ContractError as exc:
        raise FleetError(f"{where} = {value!r}: not a valid contract: {exc}") from None
    if getattr(loaded.contract, kind) is None:
        raise FleetError(f"{where} = {value!r}: the contract has no {kind} section")
    return value


def load_fleet(path: str | Path, root: str | Path = ".") -> tuple[Entry, ...]:
    """The entries of a fleet list, checked (module doc); FleetError with one line otherwise."""
    p = Path(path)
    try:  # a regular file of bounded size: a FIFO hung the read, /dev/zero filled the memory
        raw = read_regular(p, MAX_FLEET_BYTES, "fleet list", "a fleet list is a YAML file")
        data = load_yaml(raw.decode("utf-8"))
    except ResultError as exc:
        raise FleetError(str(exc)) from None
    except (StrictYamlError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FleetError(f"{p}: not a fleet list: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise FleetError(f"{p}: expected a mapping with schema_version and entries")
    unknown = sorted(set(data) - {"schema_version", "entries"})
    if unknown:
        raise FleetError(f"{p}: {unknown[0]}: unknown key (known: entries, schema_version)")
    if data.get("schema_version") != FLEET_SCHEMA_VERSION:
        raise FleetError(
            f"{p}: schema_version = {data.get('schema_version')!r}: expected {FLEET_SCHEMA_VERSION}"
        )
    raws = data.get("entries")
    if not isinstance(raws, list) or not raws:
        raise FleetError(f"{p}: entries: expected a non-empty list")
    entries: list[Entry] = []
    for i, raw in enumerate(raws):
        entry = _entry(raw, f"{p}: entries[{i}]", Path(root))
        for j, seen in enumerate(entries):
            if seen.name == entry.name:
                raise FleetError(f"{p}: entries[{i}]: duplicate entry name {entry.name!r} (entries[{j}])")
            if seen.key() == entry.key():
                raise FleetError(
                    f"{p}: entries[{i}] ({entry.name}): duplicate entry: runs what entries[{j}] "
                    f"({seen.name}) runs (same contracts, candidate env and runner labels)"
                )
        entries.append(entry)
    return tuple(entries)


def matrix(entries: tuple[Entry, ...]) -> dict[str, Any]:
    """GitHub Actions' `strategy.matrix` of the list: one include per entry."""
    return {"include": [{"name": e.name, "runs-on": list(e.runs_on)} for e in entries]}


def find(entries: tuple[Entry, ...], name: str) -> Entry:
    for entry in entries:
        if entry.name == name:
            return entry
    raise FleetError(f"no fleet entry {name!r} (entries: {', '.join(e.name for e in entries)})")


def write_contracts(entry: Entry, out: str | Path, root: str | Path = ".") -> dict[str, Path]:
    """The entry's contracts in OUT/<kind>.yaml: the contract as it is, or with the candidate's env
    over the contract's (checked again: an env the contract refuses is a FleetError)."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, rel in entry.contracts.items():
        source = Path(root) / rel
        text = source.read_text(encoding="utf-8")
        if entry.candidate_env:
            data = yaml.safe_load(text)
            env = data.setdefault("arms", {}).setdefault("candidate", {}).setdefault("env", {})
            env.update(entry.candidate_env)
            text = f"# {rel} with fleet entry {entry.name}'s candidate_env\n" + yaml.safe_dump(
                data, sort_keys=False
            )
        path = out_dir / f"{kind}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_contract(path)
        except ContractError as exc:
            raise FleetError(f"fleet entry {entry.name}: candidate_env makes {rel} invalid: {exc}") from None
        paths[kind] = path
    return paths
