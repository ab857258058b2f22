"""A full disk mid-run (issue 39): one line naming the record that could not be written and what was
kept, exit 1, nothing torn; `--resume` after space is freed completes the run.

ENOSPC is simulated at the write that hits it (fsync of the record being saved, or a write that got
half a line out): the subject is qgate's handling of the error, not a filesystem. The engine start is
replaced by a scripted one (tests/scripted_engine.py): what a rep holds is not the subject here."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_engine import ScriptedSegments
from typer.testing import CliRunner

from qgate import models, results
from qgate.cli import app
from qgate.engine import arms, order

CONTROL_FIRST = next(
    s for s in range(100) if order.new_order(("control", "candidate"), s).first[0] == "control"
)

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
REPS = 4
runner = CliRunner()


class _Disk:
    """The filesystem's free space as the test sets it: fsync of a record fails once it is full."""

    def __init__(self) -> None:
        self.full_after_reps: int | None = None
        self.reps = 0
        self.real_fsync = os.fsync

    def fsync(self, fd: int) -> None:
        if self.full_after_reps is not None and self.reps > self.full_after_reps:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real_fsync(fd)


def _segments(disk: _Disk) -> ScriptedSegments:
    def one_more_rep() -> None:
        disk.reps += 1

    return ScriptedSegments(before_rep=one_more_rep)


def _contract(tmp_path: Path) -> Path:
    data = yaml.safe_load((CONTRACTS / "smoke-cpu.yaml").read_text())
    data["speed"].update(input_tokens=64, output_tokens=8, repetitions=REPS, launches=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_full_disk_names_the_record_and_resume_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk()
    monkeypatch.setattr(results.os, "fsync", disk.fsync)
    monkeypatch.setattr(arms, "run_segment", _segments(disk))
    monkeypatch.setattr(models, "resolve_model", lambda spec, data=None: ("/m", {"spec": spec}))
    monkeypatch.setattr(order, "draw_seed", lambda: CONTROL_FIRST)  # the run's order: control first
    contract, out = _contract(tmp_path), tmp_path / "out"
    disk.full_after_reps = 2  # the control's third rep finds the disk full
    res = runner.invoke(app, ["run", "speed", "--contract", str(contract), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    (line,) = [x for x in res.output.splitlines() if x.startswith("qgate:")]
    control = out / "speed" / "control.json"
    assert f"cannot write the run's records: {control}: No space left on device" in line, line
    assert "free space" in line and "kept control 2 reps" in line and "--resume" in line, line
    assert len(json.loads(control.read_text())["reps"]) == 2  # the last good save, whole
    assert not [p for p in control.parent.iterdir() if p.name.startswith(".")]  # no temp file left

    disk.full_after_reps = None  # space freed
    res = runner.invoke(app, ["run", "speed", "--contract", str(contract), "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    for arm in ("control", "candidate"):
        saved = json.loads((out / "speed" / f"{arm}.json").read_text())
        assert saved["complete"] is True and [r["index"] for r in saved["reps"]] == list(range(REPS))


def test_a_torn_jsonl_line_is_cut_so_the_next_append_follows_a_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quality results append a line per item: a full disk mid-line used to leave the half line, and
    the append after --resume made it a middle line that every read refused."""
    path = tmp_path / "control.jsonl"
    results.append_jsonl(path, {"item": 0})
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results.os, "write", half_then_full)
    with pytest.raises(OSError) as info:
        results.append_jsonl(path, {"item": 1, "text": "x" * 100})
    assert info.value.filename == str(path)
    monkeypatch.setattr(results.os, "write", real_write)
    results.append_jsonl(path, {"item": 2})
    assert results.read_jsonl(path) == [{"item": 0}, {"item": 2}]
