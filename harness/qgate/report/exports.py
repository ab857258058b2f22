"""The verdict in the formats CI tools read: JUnit XML (qgate.report.junit) and Bencher Metric Format
JSON (qgate.report.benchmark), each written atomically where the caller asks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qgate.report import benchmark, junit
from qgate.results import Staged, stage_bytes


def stage_exports(record: dict[str, Any], paths: Mapping[str, Path | None]) -> list[Staged]:
    """The exports asked for ({"junit": path, "bmf": path}, None: not asked), each written in full
    beside its target and not yet in place (qgate.compare.write_report moves them in with the report
    set, or discards them all when a write fails)."""
    texts = {
        "junit": lambda: junit.render([(junit.suite_name(record), record)]),
        "bmf": lambda: json.dumps(benchmark.bmf(record), indent=2) + "\n",
    }
    staged: list[Staged] = []
    try:
        for name, path in paths.items():
            if path is not None:
                staged.append(stage_bytes(path, texts[name]().encode("utf-8")))
    except BaseException:
        for s in staged:
            s.discard()
        raise
    return staged


def write_exports(record: dict[str, Any], junit_path: Path | None, bmf_path: Path | None) -> None:
    """Both exports written and moved into place (a caller without a report set to write with them)."""
    for s in stage_exports(record, {"junit": junit_path, "bmf": bmf_path}):
        s.commit()
