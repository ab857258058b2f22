"""`kind: verdict`: what `qgate compare` decided (qgate.compare.build_verdict), data only.

Format history:
  1: first version.
  2: the quality section holds data (settings, figures, misses, paired test, quality_gates) that
     report/quality.py renders, no finished markdown; history reads only top-level fields of either.
  3: inputs.<kind> carries control_sha256 / candidate_sha256, the sha256 of the result files judged
     (history append refuses a night whose results changed after its compare).
  4: `timeline`, the decode-step timeline of `qgate compare --timeline DIR` (null otherwise; 1 to 3 are
     read as without one).

Unknown top-level keys are refused (extra="forbid"): a verdict is written at once by one function and
read back by history and reports; a key they do not know is a verdict qgate did not write. The kinds'
sections and figures are the comparers' data (typed as mappings: report/ renders them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qgate.records.base import HEX64, Part, Record
from qgate.records.parts import ContractRef, GateRecord
from qgate.records.timeline import Timeline

Verdict_ = Literal["PASS", "FAIL", "INCONCLUSIVE", "ERROR"]


class Inputs(Part):
    """The result files one kind's comparison judged, and (schema 3) the sha256 of their bytes (history
    reads an earlier verdict without them: qgate.night)."""

    control: str | None = None
    candidate: str | None = None
    control_sha256: str | None = Field(None, pattern=HEX64)
    candidate_sha256: str | None = Field(None, pattern=HEX64)


class VerdictInputs(Part):
    """Per kind compared, its inputs; `history`: the store `--history` named."""

    speed: Inputs | None = None
    quality: Inputs | None = None
    history: str | None = None


class Verdict(Record):
    kind: Literal["verdict"]
    schema_version: Literal[1, 2, 3, 4]
    verdict: Verdict_
    reasons: list[str]
    gates: list[GateRecord]
    contract: ContractRef
    # qgate writes it in every version; history (qgate.night.load_verdicts) reads a verdict without it as
    # one whose judged files are not known, so the model does too
    inputs: VerdictInputs | None = None
    kinds: list[Literal["speed", "quality"]]
    created_at: str | None = None
    timeline: Timeline | None = None
    aa: bool | None = None  # an announced A/A (the contract's `aa: true`)
    speed: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    figures: dict[str, Any] | None = None  # the speed comparison's, at the top (report/ and history read it)
    stats: dict[str, Any] | None = None
