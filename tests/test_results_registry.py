"""The schema registry (qgate.results.SCHEMAS): what a writer writes, loading reads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from qgate import ablate, compare, demo, timeline
from qgate.engine import procs
from qgate.ops.screen import record_header
from qgate.quality.run import QUALITY_SCHEMA_VERSION
from qgate.results import SCHEMAS, SPEED_SCHEMA_VERSION, ResultError, atomic_write_json, load_result

# Each record kind's writer and the version it stamps on its records.
WRITTEN = {
    "speed": SPEED_SCHEMA_VERSION,
    "quality": QUALITY_SCHEMA_VERSION,
    "verdict": compare.VERDICT_SCHEMA_VERSION,
    # the four operator records (screen, CUDA bench, CPU bench, real-weight bounds) take theirs from one
    # header
    **{
        k: record_header(k, None, 0, torch.device("cpu"))["schema_version"]
        for k in ("ops", "ops_bench", "ops_bench_cpu", "ops_real")
    },
    "ablation": ablate.ABLATION_SCHEMA_VERSION,
    "demo": demo.DEMO_SCHEMA_VERSION,
    "processes": procs.RECORD_SCHEMA_VERSION,
    "timeline": timeline.TIMELINE_SCHEMA_VERSION,
}


def test_every_record_kind_has_a_writer_and_an_entry() -> None:
    assert set(WRITTEN) == set(SCHEMAS)


@pytest.mark.parametrize("kind", sorted(WRITTEN))
def test_what_is_written_loads_back(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.json"
    atomic_write_json(path, {"kind": kind, "schema_version": WRITTEN[kind], "payload": [1, 2]})
    assert load_result(path, kind)["payload"] == [1, 2]


@pytest.mark.parametrize("kind", sorted(WRITTEN))
def test_a_version_from_the_future_is_refused_in_one_line(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.json"
    atomic_write_json(path, {"kind": kind, "schema_version": max(SCHEMAS[kind]) + 1})
    with pytest.raises(ResultError) as err:
        load_result(path, kind)
    assert "\n" not in str(err.value) and "schema_version" in str(err.value)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_respect_the_umask(tmp_path: Path, umask: int) -> None:
    # Issue 30: every output file was 0600 (mkstemp's mode) whatever the umask.
    from qgate.results import atomic_write_json, atomic_write_with

    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        atomic_write_with(tmp_path / "b.png", lambda tmp: Path(tmp).write_bytes(b"png"), ".png")
    finally:
        os.umask(old)
    for name in ("a.json", "b.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
