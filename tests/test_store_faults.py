"""History stores met in the states a fault leaves them in (issue 63): a hot journal (the last writer
SIGKILLed mid-transaction) is rolled back, never called corrupt; a store cut short by one byte, a
FIFO or a device is refused in one line; a row with a wrongly typed, non-JSON or out-of-range field,
or one whose content no longer matches its content_sha256, is one line naming the row: no traceback,
no trend, no verdict from it. Fleet lists that are FIFOs or devices are refused without hanging."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import comparable, history
from qgate.cli import app
from qgate.compare import run_compare

runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store of two nights (each compared once), copied by every test that damages it."""
    mp = pytest.MonkeyPatch()
    mp.setattr(comparable, "routes", support.standin_routes())
    root = tmp_path_factory.mktemp("nights")
    contract = root / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, contract)
    path = root / "h.sqlite"
    for n, night in enumerate(("2026-12-01", "2026-12-02")):
        run = root / night
        control, candidate = (support.rehash(r, contract) for r in support.load_pair())
        for res in (control, candidate):
            for launch in res["launches"]:
                launch["started_at"] = f"{night}T02:00:00+00:00"
            for i, rep in enumerate(res["reps"]):
                rep["started_at"] = f"{night}T02:01:{i:02d}+00:00"
                rep["decode_tok_s"] += n
                rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
        for arm, res in (("control", control), ("candidate", candidate)):
            support.write_json(run / "speed" / f"{arm}.json", res)
        run_compare(run / "speed" / "control.json", run / "speed" / "candidate.json", contract, run / "cmp")
        history.append(path, run)
    mp.undo()
    return path


@pytest.fixture
def copy(store: Path, tmp_path: Path) -> Path:
    path = tmp_path / "h.sqlite"
    shutil.copy(store, path)
    return path


def _report(path: Path, out: Path) -> object:
    return runner.invoke(app, ["history", "report", "--store", str(path), "--out", str(out)])


def test_a_hot_journal_is_rolled_back_not_called_corrupt(copy: Path, tmp_path: Path) -> None:
    before = copy.read_bytes()
    code = (
        "import os, signal, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1')\n"  # pages spill to the file mid-transaction
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute('CREATE TABLE junk (x TEXT)')\n"
        "for i in range(400): c.execute('INSERT INTO junk VALUES (?)', ('y' * 200,))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(copy)], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert Path(f"{copy}-journal").stat().st_size > 0 and copy.read_bytes() != before  # hot
    res = _report(copy, tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert copy.read_bytes() == before and not Path(f"{copy}-journal").exists()  # rolled back
    assert len(history.read_rows(copy)) == 4


def test_a_store_cut_short_by_one_byte_is_refused_in_one_line(copy: Path, tmp_path: Path) -> None:
    os.truncate(copy, copy.stat().st_size - 1)
    damaged = copy.read_bytes()
    res = _report(copy, tmp_path / "r")
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "not whole" in res.output and str(copy) in res.output
    with pytest.raises(history.HistoryError, match="not whole"):
        history.read_rows(copy)
    assert copy.read_bytes() == damaged and not (tmp_path / "r" / "history.md").exists()


def _edit(path: Path, sql: str, *args: object) -> None:
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER nights_no_update")  # what only an edit from outside qgate can do
    conn.execute(sql, args)
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("sql", "args", "said"),
    [
        # the held-out night: reps from 1e-300 to 1e308 gave a between-launch CV of 0 % and a PASS
        ("UPDATE nights SET decode_tok_s_reps = ? WHERE arm = 'control'", (json.dumps([1e-300, 1e308]),),
         "decode_tok_s_reps holds 1e-300: not a decode rate"),
        ("UPDATE nights SET verdicts = 'nope' WHERE arm = 'candidate'", (), "verdicts = 'nope': not JSON"),
        ("UPDATE nights SET decode_reps = 'ten' WHERE arm = 'control'", (), "decode_reps = 'ten': a str"),
        ("UPDATE nights SET fingerprint = '[1]' WHERE arm = 'control'", (), "fingerprint = '[1]': JSON"),
        ("UPDATE nights SET decode_tok_s_mean = decode_tok_s_mean * 2 WHERE arm = 'control'", (),
         "content_sha256 does not match"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_it(
    copy: Path, tmp_path: Path, sql: str, args: tuple, said: str
) -> None:
    _edit(copy, sql, *args)
    with pytest.raises(history.HistoryError) as err:
        history.read_rows(copy)
    line = str(err.value)
    assert "\n" not in line and said in line and "night '2026-12-01', arm" in line, line
    res = _report(copy, tmp_path / "r")
    assert res.exit_code == 2 and said in res.output and "Traceback" not in res.output
    # compare --history never gives a verdict from it (a one-launch pair reads the store)
    control, candidate = (support.one_launch(r) for r in support.load_pair())
    contract = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, contract)
    ctrl = support.write_json(tmp_path / "a" / "control.json", support.rehash(control, contract))
    cand = support.write_json(tmp_path / "b" / "candidate.json", support.rehash(candidate, contract))
    out = tmp_path / "cmp"
    res = runner.invoke(app, ["compare", str(ctrl), str(cand), "--out", str(out), "--history", str(copy)])
    assert res.exit_code == 2 and said in res.output, res.output
    assert not (out / "verdict.json").exists()


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_special_files_are_refused_without_hanging(tmp_path: Path, special: str) -> None:
    path = tmp_path / "fifo" if special == "fifo" else Path(special)
    if special == "fifo":
        os.mkfifo(path)
    for args in (
        ["fleet", "check", str(path)],
        ["history", "report", "--store", str(path), "--out", str(tmp_path / "r")],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "not a regular file" in res.output, (args, res.output)
