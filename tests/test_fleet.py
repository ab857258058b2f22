"""The fleet: the list's checks, the entry contracts, the gather step on run folders (to SQLite and a
real Postgres), and the JUnit / Bencher exports of a verdict."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from postgres_server import pg_url, postgres  # noqa: F401  (fixtures)
from test_history import contract, make_night, quality_verdict, support  # noqa: F401
from typer.testing import CliRunner

from qgate import history
from qgate.cli import app
from qgate.contract import load_contract
from qgate.fleet import ARTIFACT_PREFIX, FleetError, load_fleet, matrix
from qgate.report import benchmark, junit

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
SPEED, QUALITY = "contracts/smoke-cpu.yaml", "contracts/quality-cpu.yaml"


def fleet_file(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "entries": entries}))
    return path


def entry(name: str, **extra: object) -> dict:
    return {"name": name, "runs-on": ["self-hosted", "cpu"], "speed_contract": SPEED, **extra}


def test_the_checked_in_fleet_list_is_valid() -> None:
    entries = load_fleet(REPO / ".github" / "fleet.yaml", REPO)
    assert entries and all(e.contracts for e in entries)
    assert matrix(entries)["include"][0]["runs-on"] == list(entries[0].runs_on)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([entry("a", speed_contract="contracts/nope.yaml")], r"nope.yaml.: unknown contract"),
        ([entry("a", speed_contract=QUALITY)], "the contract has no speed section"),
        ([entry("a"), entry("a", quality_contract=QUALITY)], r"entries\[1\]: duplicate entry name 'a'"),
        ([entry("a"), entry("b")], r"entries\[1\] \(b\): duplicate entry: runs what entries\[0\] \(a\) runs"),
        ([entry("a", gpu="v100")], r"entries\[0\].gpu: unknown key"),
        ([entry("A b")], r"entries\[0\].name = 'A b'"),
        ([{"name": "a", "runs-on": ["x"]}], "names no contract"),
        ([entry("a", **{"runs-on": []})], "runs-on = \\[\\]: expected a non-empty list"),
    ],
)  # fmt: skip
def test_a_bad_list_is_one_line_exit_2(tmp_path: Path, entries: list[dict], message: str) -> None:
    path = fleet_file(tmp_path, entries)
    with pytest.raises(FleetError, match=message):
        load_fleet(path, REPO)
    res = runner.invoke(app, ["fleet", "check", str(path)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_matrix_and_entry_contracts(tmp_path: Path) -> None:
    env = {"QGATE_X_TEST": "1"}
    path = fleet_file(tmp_path, [entry("a"), entry("b", candidate_env=env)])
    res = runner.invoke(app, ["fleet", "matrix", str(path)])
    assert res.exit_code == 0
    assert json.loads(res.output) == {
        "include": [{"name": n, "runs-on": ["self-hosted", "cpu"]} for n in ("a", "b")]
    }
    out = {}
    for name in ("a", "b"):
        res = runner.invoke(
            app, ["fleet", "contracts", str(path), "--entry", name, "--out", str(tmp_path / name)]
        )
        assert res.exit_code == 0, res.output
        out[name] = Path(res.output.strip().split("=", 1)[1])
    original = load_contract(REPO / SPEED)
    assert load_contract(out["a"]).sha256 == original.sha256  # no override: the contract as it is
    changed = load_contract(out["b"])
    assert changed.sha256 != original.sha256
    assert changed.contract.arms.candidate.env["QGATE_X_TEST"] == "1"
    res = runner.invoke(app, ["fleet", "contracts", str(path), "--entry", "c", "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "no fleet entry 'c'" in res.output


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Made once for both backends (five compares): (the artifacts folder, the fleet list)."""
    tmp_path = tmp_path_factory.mktemp("fleet")
    contract_path = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, contract_path)
    return _artifacts(tmp_path, contract_path)


def _artifacts(tmp_path: Path, contract: Path) -> tuple[Path, Path]:  # noqa: F811
    """Three judged entries (one failing on quality), one whose compare did not run, one never run, one
    killed mid-run (the control's result alone, incomplete), one whose quality run never started."""
    art = tmp_path / "artifacts"
    # bf16 0.85: its candidate mean (~51 tok/s over two launches) shown below the floor of 55: FAIL.
    plan = {"fp16": (1.0, 1), "bf16": (0.85, 1), "wide": (1.02, 5)}
    for i, (name, (scale, misses)) in enumerate(plan.items()):
        run, _ = make_night(tmp_path / "runs" / name, contract, "2026-12-01", f"{i + 1}" * 40, scale, misses)
        shutil.copytree(run, art / f"{ARTIFACT_PREFIX}{name}")
    unjudged, _ = make_night(tmp_path / "runs" / "nojudge", contract, "2026-12-01", "7" * 40, misses=1)
    (unjudged / "compare-quality" / "verdict.json").unlink()
    shutil.copytree(unjudged, art / f"{ARTIFACT_PREFIX}nojudge")
    killed, _ = make_night(tmp_path / "runs" / "killed", contract, "2026-12-01", "8" * 40)
    shutil.rmtree(killed / "compare-speed")
    (killed / "speed" / "candidate.json").unlink()
    control = json.loads((killed / "speed" / "control.json").read_text())
    control["complete"], control["reps"] = False, control["reps"][:3]  # killed after its third rep
    (killed / "speed" / "control.json").write_text(json.dumps(control))
    shutil.copytree(killed, art / f"{ARTIFACT_PREFIX}killed")
    half, _ = make_night(tmp_path / "runs" / "half", contract, "2026-12-01", "6" * 40)  # speed only
    shutil.copytree(half, art / f"{ARTIFACT_PREFIX}half")
    labels = ["self-hosted", "cpu"]
    names = [*plan, "nojudge", "lost", "killed"]
    entries = [{"name": n, "runs-on": [*labels, n], "speed_contract": SPEED} for n in names]
    entries.append(
        {"name": "half", "runs-on": [*labels, "half"], "speed_contract": SPEED, "quality_contract": QUALITY}
    )
    return art, fleet_file(tmp_path, entries)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_gather_appends_every_entry_and_writes_one_report(
    tmp_path: Path,
    artifacts: tuple[Path, Path],
    backend: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = str(tmp_path / "h.sqlite") if backend == "sqlite" else request.getfixturevalue("pg_url")
    art, fleet = artifacts
    monkeypatch.chdir(REPO)  # the list's contract paths are the repository's
    out = tmp_path / "report"
    args = [
        "fleet",
        "gather",
        str(fleet),
        str(art),
        "--out",
        str(out),
        "--store",
        store,
        "--commit",
        "1" * 40,
    ]
    res = runner.invoke(app, args[:-2])
    # Four entries did not finish: the night is an error (exit 3), said on stderr in one line.
    assert res.exit_code == 3, res.output
    assert res.stderr.strip() == "qgate: error: 4 of 7 entries did not finish: nojudge, lost, killed, half"
    lines = dict(line.split(": ", 1) for line in res.stdout.strip().splitlines())
    assert [lines[n].split(":")[0] for n in ("fp16", "bf16", "wide")] == ["appended"] * 3
    assert lines["nojudge"].startswith("not judged") and lines["lost"].startswith("not run")
    killed = "not judged: no verdict for speed results: the entry's compare did not run (killed mid-run?)"
    assert lines["killed"] == killed
    assert lines["half"].startswith("incomplete: appended: night 2026-12-01 -> ")
    assert lines["half"].endswith("; no quality verdict: the entry's quality run did not finish")
    for name in ("fp16", "bf16", "wide", "half"):  # what finished is recorded, half's speed night too
        rows = history.read_rows(store, entry=name)
        assert [r["night"] for r in rows] == ["2026-12-01"] * 2
        assert (out / name / "history.md").is_file()
    assert {r["verdict"] for r in history.read_rows(store, entry="wide")} == {"FAIL"}
    text = (out / "fleet.md").read_text()
    # The report's first lines name what the night lost, before the table.
    assert text.startswith(
        "# qgate fleet night 2026-12-01\n\n**ERROR: 4 of 7 entries did not finish:**\n"
        "- nojudge: not judged: no verdict for quality results: the entry's compare did not run "
        "(killed mid-run?)\n- lost: not run: no qgate-entry-lost artifact: the entry's job did not upload "
        "its run folder\n- killed: not judged: no verdict for speed results"
    ), text
    assert "| wide | self-hosted, cpu, wide | FAIL | PASS | FAIL | [appended](wide/history.md) |" in text
    assert "| lost | self-hosted, cpu, lost | none | - | - | not run: no qgate-entry-lost artifact" in text
    assert "| half | self-hosted, cpu, half | PASS | PASS | - | [incomplete](half/history.md) |" in text
    assert "4 of 7 entries recorded." in text
    suites = ET.parse(out / "junit.xml").getroot()
    names = [s.get("name") for s in suites]
    assert sum(n.startswith("fp16 ") for n in names) == 2 and not any(n.startswith("lost") for n in names)
    assert int(suites.get("failures")) >= 1  # wide's quality gate
    # One test case per entry, first: each entry that did not finish an <error> saying why.
    entries = suites.find("testsuite[@name='qgate fleet entries']")
    assert names[0] == "qgate fleet entries" and (entries.get("tests"), entries.get("errors")) == ("7", "4")
    errors = {c.get("name"): c.find("error") for c in entries.findall("testcase")}
    assert [n for n, e in errors.items() if e is not None] == [
        f"{n} finished" for n in ("nojudge", "lost", "killed", "half")
    ]
    assert errors["killed finished"].get("message").startswith("no verdict for speed results")
    assert (
        errors["half finished"].get("message") == "no quality verdict: the entry's quality run did not finish"
    )
    assert int(suites.get("errors")) >= 4
    bench = json.loads((out / "benchmark.json").read_text())
    assert {"fp16/golden-speed/control", "wide/golden-speed/candidate"} <= set(bench)
    # Again (a retried job): every night already recorded; a different commit is refused, exit 2.
    res = runner.invoke(app, args[:-2])
    assert res.exit_code == 3 and res.stdout.count("already recorded") == 4
    res = runner.invoke(app, [*args[:-1], "2" * 40])
    assert res.exit_code == 2 and "refused" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_night_that_lost_nothing_exits_0_with_a_clean_junit_and_stderr(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    store = str(tmp_path / "h.sqlite") if backend == "sqlite" else request.getfixturevalue("pg_url")
    run, _ = make_night(tmp_path / "runs" / "a", contract, "2026-12-01", "1" * 40, misses=1)
    shutil.copytree(run, tmp_path / "art" / f"{ARTIFACT_PREFIX}a")
    fleet = fleet_file(tmp_path, [entry("a", quality_contract=QUALITY)])
    monkeypatch.chdir(REPO)
    out = tmp_path / "report"
    args = ["fleet", "gather", str(fleet), str(tmp_path / "art"), "--out", str(out), "--store", store]
    for status in ("appended", "already recorded"):  # a retried gather: still a success, silent on stderr
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and res.stderr == "", res.output
        assert res.stdout.startswith(f"a: {status}: night 2026-12-01 -> ")
    suites = ET.parse(out / "junit.xml").getroot()
    assert suites.get("errors") == "0" and suites[0].get("tests") == "1"
    assert (out / "fleet.md").read_text().startswith("# qgate fleet night 2026-12-01\n\n| entry |")


def _record(gates: list[tuple[str, bool, str]], verdict: str, reasons: list[str]) -> dict:
    return {
        "verdict": verdict, "reasons": reasons, "kinds": ["speed"],
        "contract": {"name": "c", "sha256": "ab" * 32},
        "gates": [{"name": n, "passed": p, "severity": s, "detail": f"detail of {n}"} for n, p, s in gates],
    }  # fmt: skip


def test_junit_maps_fail_error_and_inconclusive() -> None:
    record = _record(
        [
            ("ok", True, "fail"),
            ("slow", False, "fail"),
            ("broken", False, "error"),
            ("unsure", False, "inconclusive"),
        ],
        "ERROR",
        ["measure 12 reps per arm"],
    )
    root = ET.fromstring(junit.render([("s", record)]))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "4",
        "1",
        "1",
        "1",
    )
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases["ok"]) == []
    assert cases["slow"].find("failure").get("message") == "detail of slow"
    assert cases["broken"].find("error") is not None
    assert "advice: measure 12 reps per arm" in cases["unsure"].find("skipped").get("message")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == "ERROR"


def test_compare_writes_junit_and_bmf(tmp_path: Path, contract: Path) -> None:  # noqa: F811
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    args = ["compare", str(run / "speed" / "control.json"), str(run / "speed" / "candidate.json")]
    res = runner.invoke(
        app, [*args, "--contract", str(contract), "--out", str(tmp_path / "c"),
              "--junit", str(tmp_path / "j.xml"), "--bmf", str(tmp_path / "b.json")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert ET.parse(tmp_path / "j.xml").getroot().get("failures") == "0"
    bench = json.loads((tmp_path / "b.json").read_text())
    record = json.loads((tmp_path / "c" / "verdict.json").read_text())
    for arm in ("control", "candidate"):
        tok = bench[f"qgate/golden-speed/{arm}"]["decode-tok-s"]
        reps = record["figures"][arm]["decode_tok_s"]
        assert tok["value"] == pytest.approx(sum(reps) / len(reps))
        assert tok["lower_value"] < tok["value"] < tok["upper_value"]
        assert "tpot-ms" in bench[f"qgate/golden-speed/{arm}"]
    # The interval is the one the speed floor reads: the gate line's Welch-t CI of the candidate mean.
    floor = next(g["detail"] for g in record["gates"] if g["name"].startswith("candidate mean decode"))
    cand = bench["qgate/golden-speed/candidate"]["decode-tok-s"]
    assert f"CI [{cand['lower_value']:.2f}, {cand['upper_value']:.2f}]" in floor
    assert benchmark.bmf({"verdict": "PASS"}) == {}
