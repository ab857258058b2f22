"""qgate.history: nights built from result files shaped like the real ones, verdicts from the real compare.

Each night is a run directory as the nightly workflow leaves it: speed/<arm>.json (the golden fixture
pair, re-dated, re-committed and optionally slowed), quality/<arm>.json (hand-made items), and the
verdicts: compare-speed/verdict.json written by qgate.compare.run_compare itself, and a quality verdict.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import comparable, history
from qgate import night as night_mod
from qgate.cli.history import app
from qgate.compare import run_compare
from qgate.report import trend

runner = CliRunner()
QSHA = "ab" * 32  # the quality contract's sha256 in the hand-made quality results


@pytest.fixture(autouse=True)
def routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comparable, "routes", support.standin_routes())


@pytest.fixture
def contract(tmp_path: Path) -> Path:
    path = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, path)
    return path


def quality_result(arm: str, night: str, commit: str, misses: int) -> dict[str, Any]:
    items = []
    for i in range(8, 24):
        wrong = i < 8 + misses
        items.append(
            {"index": i, "raw_correct": not wrong, "strict_correct": not wrong and i != 23,
             "natural_stop": True, "closed_thinking": True, "length_cap": False, "invalid": False,
             "fffd_count": 1 if wrong else 0, "longest_token_run": 3 + i % 4, "max_window_repeats": 2}
        )  # fmt: skip
    return {
        "kind": "quality", "schema_version": 1, "arm": arm,
        "contract": {"name": "golden-quality", "version": 1, "sha256": QSHA, "path": "q.yaml"},
        "fingerprint": {"git_sha": commit, "gpu": None, "vllm": "0.32.0", "torch": "2.13.0+cpu"},
        "quality": {"first_index": 8, "last_index": 23,
                    "gates": {"min_raw_correct": 14, "min_strict_correct": 12}},
        "launches": [{"segment": 0, "started_at": f"{night}T03:00:00+00:00"}],
        "items": items, "complete": True,
    }  # fmt: skip


def quality_verdict(verdict: str) -> dict[str, Any]:
    reasons = [] if verdict == "PASS" else ["quality: min raw correct: 11 of 16, needs 14"]
    return {
        "kind": "verdict", "schema_version": 1, "verdict": verdict, "reasons": reasons, "gates": [],
        "contract": {"name": "golden-quality", "version": 1, "sha256": QSHA, "path": "q.yaml"},
        "inputs": {"quality": {}}, "kinds": ["quality"],
    }  # fmt: skip


def rejudge(run: Path, contract: Path) -> None:
    """Compare a night's speed results again (after a test edited them), over its earlier verdict."""
    speed = run / "speed"
    run_compare(speed / "control.json", speed / "candidate.json", contract, run / "compare-speed", force=True)


def make_night(
    root: Path, contract: Path, night: str, commit: str, scale: float = 1.0, misses: int | None = None
) -> tuple[Path, str]:
    """A night's run directory; the candidate's reps slowed by `scale`; returns (dir, speed verdict)."""
    run = root / night
    control, candidate = (support.rehash(r, contract) for r in support.load_pair())
    for res in (control, candidate):
        res["fingerprint"]["git_sha"] = commit
        for launch in res["launches"]:
            launch["started_at"] = f"{night}T02:00:00+00:00"
        for i, rep in enumerate(res["reps"]):  # after their engine start, in index order
            rep["started_at"] = f"{night}T02:01:{i:02d}+00:00"
    for rep in candidate["reps"]:
        rep["decode_tok_s"] = round(rep["decode_tok_s"] * scale, 3)
        rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
    for arm, res in (("control", control), ("candidate", candidate)):
        support.write_json(run / "speed" / f"{arm}.json", res)
    record, _ = run_compare(
        run / "speed" / "control.json", run / "speed" / "candidate.json", contract, run / "compare-speed"
    )
    if misses is not None:
        for arm, m in (("control", 1), ("candidate", misses)):
            support.write_json(run / "quality" / f"{arm}.json", quality_result(arm, night, commit, m))
        support.write_json(
            run / "compare-quality" / "verdict.json", quality_verdict("PASS" if misses <= 2 else "FAIL")
        )
    return run, record["verdict"]


def test_collect_reads_the_real_shapes(tmp_path: Path, contract: Path) -> None:
    run, verdict = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    assert verdict == "PASS"
    rows = night_mod.collect(run)
    assert [r["arm"] for r in rows] == ["control", "candidate"]
    cand = rows[1]
    reps = [r["decode_tok_s"] for r in json.loads((run / "speed" / "candidate.json").read_text())["reps"]]
    assert cand["night"] == "2026-12-01" and cand["commit_sha"] == "a" * 40
    assert cand["decode_tok_s_mean"] == pytest.approx(sum(reps) / len(reps))
    assert cand["decode_tok_s_min"] == min(reps) and json.loads(cand["decode_tok_s_reps"]) == reps
    assert cand["gate_min_decode_tok_s"] == 55 and cand["speed_contract"] == "golden-speed"
    assert (cand["raw_correct"], cand["strict_correct"], cand["quality_selected"]) == (15, 14, 16)
    assert cand["raw_accuracy"] == pytest.approx(15 / 16) and cand["fffd_chars"] == 1
    assert (cand["max_token_run"], cand["length_caps"], cand["gate_min_raw_correct"]) == (6, 0, 14)
    assert cand["verdict"] == "PASS"
    assert set(json.loads(cand["verdicts"])) == {"speed", "quality"}
    # the run's prompt seed, drawn (not pinned) when the run started (schema 4)
    assert (cand["prompt_seed"], cand["prompt_seed_pinned"]) == (0, 0)


def test_night_verdict_is_the_worst_kind(tmp_path: Path, contract: Path) -> None:
    run, verdict = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=5)
    assert verdict == "PASS"  # speed passes, quality fails: the night is FAIL
    rows = night_mod.collect(run)
    assert {r["verdict"] for r in rows} == {"FAIL"}
    assert json.loads(rows[0]["verdicts"])["quality"]["reasons"]


def test_an_inconclusive_kind_ranks_between_pass_and_fail(tmp_path: Path, contract: Path) -> None:
    run, verdict = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    assert verdict == "PASS"
    support.write_json(run / "compare-quality" / "verdict.json", quality_verdict("INCONCLUSIVE"))
    assert {r["verdict"] for r in night_mod.collect(run)} == {"INCONCLUSIVE"}
    support.write_json(run / "compare-quality" / "verdict.json", quality_verdict("FAIL"))
    assert {r["verdict"] for r in night_mod.collect(run)} == {"FAIL"}


def test_append_then_identical_append_is_a_no_op(tmp_path: Path, contract: Path) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    store = tmp_path / "hist" / "history.sqlite"
    first = history.append(store, run)
    assert (first.status, first.night, first.arms, first.verdict) == (
        "appended", "2026-12-01", ("control", "candidate"), "PASS",
    )  # fmt: skip
    before = store.read_bytes()
    again = history.append(store, run)
    assert again.status == "already recorded"
    assert store.read_bytes() == before
    assert len(history.read_rows(store)) == 2
    assert not list(store.parent.glob(".history.sqlite.*"))  # no temporary file left behind


def test_same_night_with_different_figures_is_refused(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    run, _ = make_night(tmp_path / "a", contract, "2026-12-01", "a" * 40)
    history.append(store, run)
    before = store.read_bytes()
    rerun, _ = make_night(tmp_path / "b", contract, "2026-12-01", "b" * 40, scale=0.9)
    with pytest.raises(history.HistoryError, match=r"night 2026-12-01 is already recorded .* append-only"):
        history.append(store, rerun)
    assert store.read_bytes() == before
    # The same results under another night are a new night.
    assert history.append(store, rerun, night="2026-12-02").status == "appended"
    assert [r["night"] for r in history.read_rows(store)] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2


def test_rows_cannot_be_updated_or_deleted(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    history.append(store, make_night(tmp_path, contract, "2026-12-01", "a" * 40)[0])
    conn = sqlite3.connect(store)
    for stmt in ("UPDATE nights SET verdict = 'PASS'", "DELETE FROM nights"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(stmt)
    conn.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "an empty file"),
        (b"night,arm\n2026-12-01,control\n", "not a SQLite database"),
        (b"SQLite format 3\x00" + bytes(range(256)) * 16, "corrupt or unreadable"),
    ],
)
def test_corrupt_store_is_a_clear_error_and_left_unchanged(
    tmp_path: Path, contract: Path, content: bytes, message: str
) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    store = tmp_path / "history.sqlite"
    store.write_bytes(content)
    for call in (lambda: history.append(store, run), lambda: history.read_rows(store)):
        with pytest.raises(history.HistoryError, match=message):
            call()
    assert store.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026-12-01", "contract.yaml", "history.sqlite"]


def test_damaged_real_store_is_refused_unchanged(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    history.append(store, make_night(tmp_path, contract, "2026-12-01", "a" * 40)[0])
    data = bytearray(store.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree: sqlite_master is unreadable
    store.write_bytes(bytes(data))
    with pytest.raises(history.HistoryError, match="history.sqlite: corrupt or unreadable"):
        history.append(store, make_night(tmp_path / "x", contract, "2026-12-02", "a" * 40)[0])
    assert store.read_bytes() == bytes(data)


def test_foreign_sqlite_file_is_refused_unchanged(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "other.db"
    conn = sqlite3.connect(store)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.commit()
    conn.close()
    before = store.read_bytes()
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    with pytest.raises(history.HistoryError, match=r"not a qgate history store \(tables: users\)"):
        history.append(store, run)
    assert store.read_bytes() == before


def test_unknown_schema_version_is_refused(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    history.append(store, make_night(tmp_path, contract, "2026-12-01", "a" * 40)[0])
    conn = sqlite3.connect(store)
    conn.execute("UPDATE qgate_history SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(history.HistoryError, match="schema_version = '99'; this qgate reads 1"):
        history.read_rows(store)


def test_commit_and_night_checks(tmp_path: Path, contract: Path) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "c0ffee" + "0" * 34)
    assert night_mod.collect(run, commit="c0ffee")[0]["commit_sha"] == "c0ffee"
    with pytest.raises(history.HistoryError, match="record git_sha"):
        night_mod.collect(run, commit="deadbeef")
    with pytest.raises(history.HistoryError, match="expected a date YYYY-MM-DD"):
        night_mod.collect(run, night="2026-13-01")
    # Arms run at different commits: the night's commit must be named, and be one of them.
    path = run / "speed" / "candidate.json"
    data = json.loads(path.read_text())
    data["fingerprint"]["git_sha"] = "d" * 40
    path.write_text(json.dumps(data))
    with pytest.raises(history.HistoryError, match="changed after its compare"):
        night_mod.collect(run)
    rejudge(run, contract)  # the edited results judged again: their verdict records them
    with pytest.raises(history.HistoryError, match="made at different commits .* pass --commit SHA"):
        night_mod.collect(run)
    rows = night_mod.collect(run, commit="d" * 40)
    assert json.loads(rows[1]["fingerprint"])["git_sha"] == {"speed": "d" * 40}
    assert json.loads(rows[0]["fingerprint"])["git_sha"] == {"speed": "c0ffee" + "0" * 34}
    for arm in ("control", "candidate"):
        path = run / "speed" / f"{arm}.json"
        data = json.loads(path.read_text())
        data["fingerprint"]["git_sha"] = None
        path.write_text(json.dumps(data))
    rejudge(run, contract)
    with pytest.raises(history.HistoryError, match="pass --commit SHA"):
        night_mod.collect(run)


def test_verdict_of_other_results_is_refused(tmp_path: Path, contract: Path) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    path = run / "compare-speed" / "verdict.json"
    record = json.loads(path.read_text())
    record["contract"]["sha256"] = "f" * 64
    path.write_text(json.dumps(record))
    with pytest.raises(history.HistoryError, match="not the verdict of these results"):
        night_mod.collect(run)


def test_report_shows_the_night_the_regression_came_in(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    plan = [("2026-12-01", 1.0, 1), ("2026-12-02", 1.01, 1), ("2026-12-03", 0.88, 1), ("2026-12-04", 0.87, 5)]
    verdicts = []
    for i, (night, scale, misses) in enumerate(plan):
        run, verdict = make_night(tmp_path / "runs", contract, night, f"{i + 1}" * 40, scale, misses)
        verdicts.append(verdict)
        history.append(store, run)
    assert verdicts == ["PASS", "PASS", "FAIL", "FAIL"]
    paths = history.write_report(store, tmp_path / "report")
    text = Path(paths["report"]).read_text()
    assert (
        "| 2026-12-03 | `333333333333` | **regression came in** (speed): verdict PASS -> FAIL "
        "(last passing night 2026-12-02 at commit 222222222222) |" in text
    )
    assert "| 2026-12-03 | `333333333333` | candidate below the decode gate: slowest rep" in text
    # Quality regresses on a night that already fails on speed: it still shows the night it came in.
    assert (
        "| 2026-12-04 | `444444444444` | **regression came in** (quality): verdict PASS -> FAIL "
        "(last passing night 2026-12-03 at commit 333333333333) |" in text
    )
    assert "| 2026-12-04 | `444444444444` | candidate below a quality gate: raw 11/16 < 14" in text
    assert text.count("regression came in") == 2
    assert "![decode tok/s and quality per night](history.png)" in text
    assert text.count("\n| 2026-12-0") >= 4 + 4  # the events table and one line per night
    assert Path(paths["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    series = trend.series(history.read_rows(store))
    assert series["regressions"] == ["2026-12-03", "2026-12-04"]
    assert series["verdicts"] == verdicts
    assert series["candidate_mean"][2] < series["gate"][2] < series["candidate_mean"][1]


def test_empty_and_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(history.HistoryError, match="no such history store"):
        history.read_rows(tmp_path / "none.sqlite")
    (tmp_path / "empty").mkdir()
    with pytest.raises(history.HistoryError, match=r"holds no speed/<arm>.json or quality/<arm>.json"):
        night_mod.collect(tmp_path / "empty")
    assert not (tmp_path / "none.sqlite").exists()


def test_cli_append_refuse_and_report(tmp_path: Path, contract: Path) -> None:
    store = tmp_path / "history.sqlite"
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    res = runner.invoke(app, ["append", str(run), "--store", str(store), "--commit", "a" * 40])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("appended: night 2026-12-01 (control, candidate), verdict PASS")
    res = runner.invoke(app, ["append", str(run), "--store", str(store), "--night", "2026-12-01"])
    assert (res.exit_code, res.output.split(":")[0]) == (0, "already recorded")
    other, _ = make_night(tmp_path / "b", contract, "2026-12-01", "a" * 40, scale=0.5)
    res = runner.invoke(app, ["append", str(other), "--store", str(store)])
    assert res.exit_code == 2 and "already recorded" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", "--store", str(store), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "history.md").is_file() and (tmp_path / "rep" / "history.png").is_file()
    res = runner.invoke(app, ["report", "--store", str(tmp_path / "nope.sqlite"), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "no such history store" in res.output


def test_a_night_without_its_verdict_is_refused_and_can_be_appended_once_judged(
    tmp_path: Path, contract: Path
) -> None:
    # Issue 30, defect 6: appended before compare ran, a night was stored with verdict none and could
    # never be completed (the second append was refused as append-only).
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    verdict = run / "compare-quality" / "verdict.json"
    kept = verdict.read_bytes()
    verdict.unlink()
    store = tmp_path / "h.sqlite"
    with pytest.raises(history.HistoryError, match="no verdict for its quality results"):
        history.append(store, run)
    assert not store.exists()
    verdict.write_bytes(kept)
    assert history.append(store, run).verdict == "PASS"


def test_one_run_folder_is_one_night(tmp_path: Path, contract: Path) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    store = tmp_path / "h.sqlite"
    history.append(store, run)
    with pytest.raises(history.HistoryError, match="already recorded as night 2026-12-01"):
        history.append(store, run, night="2026-12-02")
    assert {r["night"] for r in history.read_rows(store)} == {"2026-12-01"}
