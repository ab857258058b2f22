"""The verdict in the formats CI tools read: JUnit XML (qgate.report.junit) and Bencher Metric Format
JSON (qgate.report.benchmark), each written atomically where the caller asks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qgate.report import benchmark, junit
from qgate.results import atomic_write_json, atomic_write_text


def write_exports(record: dict[str, Any], junit_path: Path | None, bmf_path: Path | None) -> None:
    if junit_path is not None:
        atomic_write_text(junit_path, junit.render([(junit.suite_name(record), record)]))
    if bmf_path is not None:
        atomic_write_json(bmf_path, benchmark.bmf(record))
