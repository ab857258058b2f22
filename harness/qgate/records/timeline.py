"""`kind: timeline`: a decode-step timeline per arm (qgate.timeline.build_timeline), read from
tools/gpu_engine/profile_decode.py's per-arm files; embedded in verdicts and ablations.

Format history:
  1: first version.
  2: per arm `graph_kernels`, `graph_span_us` and against the control `graph_stretches` (one decode
     graph replay aligned with the control's), null where a profile has no `graph_step`.
  3: `comparison_arms` beside `ablation_arms` (match_arms: the profiles tied to `qgate compare`'s
     control and candidate), null where no comparison embeds the record.
  4: against the control `graph_early_starts` (kernels of a replay that start before an earlier one
     ends, PDL or another stream: the wait the profiler counts as their time), null without graph_step.

Top-level keys are refused unless named (extra="forbid"); each arm's summary and comparison are the
profiles' figures (mappings: report/timeline.py renders them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qgate.records.base import Part, Record


class Source(Part):
    folder: str
    files: dict[str, dict[str, str]]  # arm -> {file, sha256}


class Timeline(Record):
    kind: Literal["timeline"]
    schema_version: Literal[1, 2, 3, 4]
    source: Source
    top_n: int = Field(ge=1)
    arms: dict[str, dict[str, Any]]
    against_control: dict[str, dict[str, Any]]
    ablation_arms: dict[str, Any] | None = None
    comparison_arms: dict[str, Any] | None = None
