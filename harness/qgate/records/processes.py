"""`kind: processes`: the run record DIR/processes.json (qgate.engine.procs): the engine children's
process groups, so a later run can find and end leftovers.

Format history:
  1: first version.
"""

from __future__ import annotations

from typing import Literal

from qgate.records.base import Part, Record


class Group(Part):
    pgid: int
    label: str
    started_at: str


class Processes(Record):
    kind: Literal["processes"]
    schema_version: Literal[1]
    token: str
    qgate_pid: int
    host: str
    boot_id: str | None = None
    started_at: str
    groups: list[Group]
