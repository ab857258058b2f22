"""Every writer on a full disk (issue 63): one line naming the file, a non-zero exit, nothing left
behind that a later run reads or that makes its rerun need --force; outputs through a symlink.

The disk is a small tmpfs where the machine lets the test mount one (root, as CI is); elsewhere the
same cases run with ENOSPC injected at the writes' fsync (said by the `disk` fixture's `how`)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import comparable, results
from qgate.cli import app

runner = CliRunner()


@dataclass
class Disk:
    """A folder on a disk that is full (`fill()`) until `free()`: a tmpfs of `size` KiB, or ENOSPC
    injected at every fsync while full."""

    path: Path
    how: str
    monkeypatch: pytest.MonkeyPatch

    def fill(self) -> None:
        if self.how == "tmpfs":
            _mount(self.path, "remount,size=16k")
            return
        real = os.fsync

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        self.monkeypatch.setattr(os, "fsync", full)
        self._real = real

    def free(self) -> None:
        if self.how == "tmpfs":
            _mount(self.path, "remount,size=4m")
        else:
            self.monkeypatch.setattr(os, "fsync", self._real)


def _mount(path: Path, options: str) -> bool:
    cmd = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
    if options.startswith("remount"):
        cmd = ["mount", "-o", options, str(path)]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    path = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None and _mount(path, "size=4m")
    yield Disk(path, "tmpfs" if mounted else "injected ENOSPC", monkeypatch)
    if mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    monkeypatch.setattr(comparable, "routes", support.standin_routes())
    return support.written_pair(tmp_path)


def _one_error_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("qgate: error: "), output
    return lines[0]


def test_compare_on_a_full_disk_leaves_nothing_and_the_rerun_needs_no_force(
    disk: Disk, pair: tuple[Path, Path, Path]
) -> None:
    control, candidate, contract = pair
    out = disk.path / "out"
    args = ["compare", str(control), str(candidate), "-c", str(contract), "--out", str(out)]
    args += ["--junit", str(disk.path / "junit.xml"), "--bmf", str(disk.path / "bmf.json")]
    disk.fill()
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert "No space left on device" in line and str(disk.path) in line, (disk.how, line)
    left = sorted(p.name for p in disk.path.rglob("*") if p.name != ".qgate.lock")
    assert left == ["out"], (disk.how, left)  # no report, no export, no staged copy, no writer record
    disk.free()
    res = runner.invoke(app, args)  # the same command: no --force needed
    assert res.exit_code == 0, (disk.how, res.output)
    assert {"report.md", "verdict.json", "speed.png"} <= {p.name for p in out.iterdir()}
    assert (disk.path / "junit.xml").read_text().startswith("<?xml")


def test_history_append_on_a_full_disk_is_one_line_and_the_store_stays_whole(
    disk: Disk, tmp_path: Path, pair: tuple[Path, Path, Path]
) -> None:
    from qgate import history

    if disk.how != "tmpfs":  # SQLite writes through its own C calls: only a real full disk reaches them
        pytest.skip("no tmpfs can be mounted here (not root)")
    control, candidate, contract = pair
    night = tmp_path / "night"
    for arm, src in (("control", control), ("candidate", candidate)):
        (night / "speed").mkdir(parents=True, exist_ok=True)
        shutil.copy(src, night / "speed" / f"{arm}.json")
    speed = night / "speed"
    assert runner.invoke(
        app,
        ["compare", str(speed / "control.json"), str(speed / "candidate.json"), "--out", str(night / "cmp")],
    ).exit_code in (0, 3, 4)
    store = disk.path / "h.sqlite"
    disk.fill()
    res = runner.invoke(app, ["history", "append", str(night), "--store", str(store)])
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert str(store) in line and ("no space" in line.lower() or "disk" in line.lower()), line
    assert not store.exists()  # a store is built beside its path and linked in only when whole
    disk.free()
    res = runner.invoke(app, ["history", "append", str(night), "--store", str(store)])
    assert res.exit_code == 0, res.output
    assert len(history.read_rows(store)) == 2


def test_an_export_through_a_symlink_writes_its_target_and_keeps_the_link(
    tmp_path: Path, pair: tuple[Path, Path, Path]
) -> None:
    control, candidate, contract = pair
    target = tmp_path / "reports" / "junit.xml"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "junit-link.xml"
    link.symlink_to(target)
    res = runner.invoke(
        app, ["compare", str(control), str(candidate), "--out", str(tmp_path / "o"), "--junit", str(link)]
    )
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and target.read_text().startswith("<?xml")


def test_a_fifo_output_without_a_reader_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "out.xml"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no reader"):
        results.atomic_write_text(fifo, "x")
    assert fifo.exists() and not fifo.is_file()  # still the FIFO: never replaced by a regular file


def test_compare_of_what_a_cut_short_run_left_is_an_error_naming_it(
    tmp_path: Path, pair: tuple[Path, Path, Path]
) -> None:
    control, candidate, contract = pair
    run = tmp_path / "run"
    (run / "speed").mkdir(parents=True)
    shutil.copy(control, run / "speed" / "control.json")  # the candidate's record was never written
    res = runner.invoke(app, ["compare", str(run), str(run), "--out", str(tmp_path / "o1")])
    assert res.exit_code == 2 and "speed/candidate.json" in _one_error_line(res.output), res.output
    cut = support.rehash(support.load_pair()[1], contract)  # its reps cut short by the disk
    cut["reps"], cut["complete"] = cut["reps"][:3], False
    short = support.write_json(run / "speed" / "candidate.json", cut)
    res = runner.invoke(app, ["compare", str(control), str(short), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 3 and "verdict: ERROR" in res.output, res.output
    assert "candidate result complete" in res.output and "complete = False" in res.output


def test_an_engine_start_whose_routes_left_no_attestation_fails_the_run(tmp_path: Path) -> None:
    from qgate.engine.launcher import unattested

    routed = {"VLLM_SM70_QWEN38_FP16_GEMV": "1"}
    (tmp_path / "a").mkdir()
    said = unattested(tmp_path / "a", routed)  # the plugin's files could not be written: no evidence
    assert said is not None and str(tmp_path / "a") in said and "full disk" in said
    assert unattested(tmp_path / "a", {"VLLM_SM70_QWEN38_FP16_GEMV": "0"}) is None  # the quiet control
    (tmp_path / "a" / "MainProcess-1.json").write_text("{}")
    assert unattested(tmp_path / "a", routed) is None
