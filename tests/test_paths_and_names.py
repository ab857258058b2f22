"""Paths and names a user may legally give (issue 63): a folder whose name is not UTF-8, file names of
250-255 bytes for --junit and a new --store, and a contract's `model`, which must be something the
resolver loads (a local directory, a built-in, a hub id's org/name form as a path), refused in one line
otherwise. The hand-made fixture results, no engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from test_history import make_night, support  # noqa: F401
from typer.testing import CliRunner

from qgate.cli import app
from qgate.history import MAX_STORE_NAME

runner = CliRunner()


def _invoke(*args: str, code: int = 0) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) >= 1
    return res.output


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A folder whose name's bytes are no UTF-8 (Python holds them as surrogates, os.fsdecode)."""
    folder = tmp_path / os.fsdecode(b"night-\xff\xfe")
    try:
        folder.mkdir()
    except (OSError, UnicodeEncodeError) as exc:  # a file system that takes UTF-8 names only
        pytest.skip(f"this file system refuses a non-UTF-8 name: {exc}")
    return folder


def test_a_folder_that_is_not_utf8_works_end_to_end(odd: Path) -> None:
    contract = odd / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, contract)
    assert _invoke("contract", "validate", str(contract)).startswith("ok: ")
    run, _ = make_night(odd, contract, "2026-12-01", "a" * 40)
    store = odd / "history.sqlite"
    said = _invoke("history", "append", str(run), "--store", str(store))
    assert said.startswith("appended: night 2026-12-01") and "\\udcff\\udcfe" in said  # shown escaped
    _invoke("history", "report", "--store", str(store), "--out", str(odd / "rep"))
    assert "night-\\udcff\\udcfe" in (odd / "rep" / "history.md").read_text()  # shown escaped
    speed = run / "speed"
    args = [str(speed / "control.json"), str(speed / "candidate.json"), "--contract", str(contract)]
    _invoke("compare", *args, "--out", str(odd / "cmp"), "--history", str(store))
    assert (odd / "cmp" / "report.md").is_file()


def test_legal_long_names_work_or_are_refused_in_one_line(tmp_path: Path) -> None:
    contract = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, contract)
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    later, _ = make_night(tmp_path / "b", contract, "2026-12-02", "b" * 40)
    junit = tmp_path / ("j" * 251 + ".xml")  # 255 bytes: NAME_MAX
    speed = run / "speed"
    args = [str(speed / "control.json"), str(speed / "candidate.json"), "--contract", str(contract)]
    _invoke("compare", *args, "--out", str(tmp_path / "cmp"), "--junit", str(junit))
    assert junit.read_text().startswith("<?xml")
    store = tmp_path / ("s" * (MAX_STORE_NAME - 7) + ".sqlite")  # the longest whose journal fits
    for night in (run, later):  # created, then appended to (SQLite's journal beside it)
        assert _invoke("history", "append", str(night), "--store", str(store)).startswith("appended")
    too_long = tmp_path / ("s" * 248 + ".sqlite")  # 255 bytes: legal, but its journal would not be
    said = _invoke("history", "append", str(run), "--store", str(too_long), code=2)
    assert "SQLite writes its journal beside" in said and not too_long.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.parametrize(
    ("model", "ok"),
    [
        ("file:///etc/passwd", False),
        ("s3://bucket/models/qwen", False),
        ("https://huggingface.co/Qwen/Qwen3-8B", False),
        ("hf:Qwen/Qwen3-8B", False),
        ("Qwen/Qwen3-8B\nname: forged", False),
        (" tiny", False),
        ("tiny", True),
        ("tiny-trained-wide", True),
        ("Qwen/Qwen3-8B", True),  # a hub id's form: read as a relative path by the resolver
        ("/data/models/Qwen3-8B", True),
        ("~/models/Qwen3-8B", True),
        ("C:/models/Qwen3-8B", True),
    ],
)
def test_model_is_what_the_resolver_loads(tmp_path: Path, model: str, ok: bool) -> None:
    data = yaml.safe_load(support.FIXTURE_CONTRACT.read_text())
    data["model"] = model
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    said = _invoke("contract", "validate", str(path), code=0 if ok else 2)
    assert said.startswith("ok: ") if ok else said.startswith(f"qgate: error: {path}: model = ")
    assert len(said.strip().splitlines()) == 1
