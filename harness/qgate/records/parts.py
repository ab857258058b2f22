"""Parts several record kinds share: the contract reference, the model, route counts, a gate, an engine
start. Typed as the writers write them (qgate.contract.LoadedContract.reference, qgate.models,
qgate.routes.collect, qgate.gate.Gate.to_dict, qgate.engine.segment)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from qgate.records.base import HEX64, Open, Part


class ContractRef(Part):
    """The contract a record ran or was judged under (LoadedContract.reference)."""

    name: str = Field(min_length=1)
    sha256: str = Field(pattern=HEX64)
    version: int | None = None
    path: str | None = None


class ModelRef(Open):
    """The model an arm ran (qgate.models.resolve_model): the contract's spec, its directory, the
    config's sha256; a hand-written reference result may hold the spec alone."""

    spec: str | None = None
    path: str | None = None
    config_sha256: str | None = None


class RankCounts(Part):
    """One tensor parallel rank's hits of a route (qgate.routes.collect): by role, and the engine starts
    in which it ran the route."""

    hits: int = Field(0, ge=0)
    roles: dict[str, int] = Field(default_factory=dict)
    starts: int = Field(0, ge=0)


class RouteCounts(Part):
    """One route's attestation counts (qgate.routes.collect): executions, fallbacks by reason, hits by
    role, calls captured into CUDA graphs by role; each tensor parallel rank's hits (`ranks`, by rank)
    and the engine starts in which some rank ran it (`starts`)."""

    hits: int = Field(0, ge=0)
    fallbacks: dict[str, int] = Field(default_factory=dict)
    roles: dict[str, int] = Field(default_factory=dict)
    captures: dict[str, int] = Field(default_factory=dict)
    ranks: dict[str, RankCounts] = Field(default_factory=dict)
    starts: int = Field(0, ge=0)


class GateRecord(Part):
    """A gate as a record holds it (qgate.gate.Gate.to_dict)."""

    name: str
    passed: bool
    detail: str
    severity: Literal["fail", "inconclusive", "error"]


class Launch(Open):
    """One engine start of an arm (qgate.engine.segment): its launch, segment, start time; the speed
    audit's start carries `audit`; `attestation_lost` says why the start's route attestation files did
    not hold all of its counts (qgate.routes.not_whole: the route gates fail on it)."""

    launch: int = Field(0, ge=0)
    segment: int | None = Field(None, ge=0)
    engine_start_s: float | None = None
    started_at: str | None = None
    attestation_lost: str | None = None
