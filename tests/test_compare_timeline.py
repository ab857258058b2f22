"""`qgate compare --timeline PROFILES`: the decode-step timeline in the verdict record and its report.

On the compare tests' recorded pair (tests/golden, a PASS) and the H200 profile of 2026-12-04
(tests/fixtures/timeline/h200-prodshape-bf16), without vLLM: the section and its figures in report.md,
the record round-trip, the profiles matched with the two arms (a probe's other variants named, not
refused), the verdict and gates untouched, a bad folder refused before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from golden import support
from typer.testing import CliRunner

from qgate.cli.compare import app
from qgate.report import render_markdown
from qgate.report.timeline import TITLE, timeline_lines
from qgate.results import load_result
from qgate.timeline import TIMELINE_SCHEMA_VERSION, match_arms, read_timeline, thaw

H200 = Path(__file__).parent / "fixtures" / "timeline" / "h200-prodshape-bf16"
GEMV_VAR = "VLLM_SM70_QWEN38_FP16_GEMV"  # the one route env var of the golden pair (0 control, 1 candidate)
NVJET = "nvjet_sm90_tst_512x8_64x3_2x1_v_bz_TNT"  # a vLLM GEMM the candidate's GEMV replaces


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    control, candidate, _ = support.written_pair(tmp_path)
    return control, candidate


def compare(pair: tuple[Path, Path], out: Path, *extra: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in (*pair, "--out", out, *extra)])


def probe_folder(tmp_path: Path, candidate_gemv: str = "1") -> Path:
    """The H200 profiles as a probe's folder holds them: each with the route env it ran
    (arm_env_routes), and variants that are no arm of a comparison beside control and candidate."""
    folder = tmp_path / "probe-timeline"
    folder.mkdir(parents=True)
    for name, source, gemv in (
        ("control", "control", "0"),
        ("candidate", "candidate", candidate_gemv),
        ("only-fp16_gemv", "candidate", "1"),
        ("cand-serial", "candidate", "1"),
    ):
        data = json.loads((H200 / f"{source}.json").read_text())
        data["arm_env_routes"] = {GEMV_VAR: gemv}
        (folder / f"{name}.json").write_text(json.dumps(data))
    (folder / "control.txt").write_text("the profiler's text table: not read")
    return folder


def test_the_section_is_in_the_report_with_the_profiles_figures(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    out = tmp_path / "out"
    res = compare(pair, out, "--timeline", H200)
    assert res.exit_code == 0, res.output
    assert "verdict: PASS" in res.output
    md = (out / "report.md").read_text()
    assert md.index("## Speed") < md.index(TITLE) < md.index("## Gates")
    for want in (
        f"Read from `{H200}`: control.json (sha256 `",
        "Reading: GPU busy -145 us a step (-7.1 %), host gap -32 us: the candidate's kernels are faster "
        "under the profiler.",
        "Kernels against the control: 6 added (+1130.54 us/step), 13 removed (",
        f"| removed | `{NVJET}` | 1.00 -> - | 304.55 -> - | -304.55 |",
        "| control | NVIDIA H200 | 64 | 2053.91 |",
        "| candidate | NVIDIA H200 | 64 | 1908.49 |",
        "No route env recorded in control, candidate: the file names alone tie them to the arms.",
        "judge speed by the speed gate's tok/s",
    ):
        assert want in md, want


def test_the_record_carries_the_timeline_matched_with_the_arms_and_round_trips(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    out = tmp_path / "out"
    assert compare(pair, out, "--timeline", H200).exit_code == 0
    record = load_result(out / "verdict.json", "verdict")
    tl = record["timeline"]
    assert (tl["kind"], tl["schema_version"]) == ("timeline", TIMELINE_SCHEMA_VERSION)
    assert tl["arms"]["candidate"]["gpu_busy_us_per_step"] == 1908.49
    assert tl["against_control"]["candidate"]["kernels"]["totals"]["removed"]["count"] == 13
    assert tl["ablation_arms"] is None
    assert tl["comparison_arms"] == {
        "control": {"in_comparison": True, "env_differs": None},
        "candidate": {"in_comparison": True, "env_differs": None},
    }
    envs = {"control": {GEMV_VAR: "0"}, "candidate": {GEMV_VAR: "1"}}
    assert tl == thaw(match_arms(read_timeline(H200), envs, "comparison"))
    # the report is rendered from verdict.json alone, the section included
    assert render_markdown(record) == (out / "report.md").read_text()


@pytest.mark.parametrize("slower", [False, True], ids=["PASS", "FAIL"])
def test_the_timeline_is_no_gate(tmp_path: Path, pair: tuple[Path, Path], slower: bool) -> None:
    if slower:  # the candidate's mean shown below the contract's 55 tok/s floor: a FAIL
        candidate = json.loads(pair[1].read_text())
        for rep in candidate["reps"]:
            rep["decode_tok_s"] -= 7.0
            rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
        support.write_json(pair[1], candidate)
    runs = {}
    for name, extra in (("plain", ()), ("timeline", ("--timeline", H200))):
        res = compare(pair, tmp_path / name, *extra)
        assert res.exit_code == (1 if slower else 0), res.output
        runs[name] = json.loads((tmp_path / name / "verdict.json").read_text())
    plain, with_tl = runs["plain"], runs["timeline"]
    assert with_tl["verdict"] == plain["verdict"] == ("FAIL" if slower else "PASS")
    assert with_tl["gates"] == plain["gates"] and with_tl["reasons"] == plain["reasons"]
    assert plain["timeline"] is None and with_tl["timeline"] is not None
    same = {k: v for k, v in with_tl.items() if k not in ("timeline", "created_at")}
    assert same == {k: v for k, v in plain.items() if k not in ("timeline", "created_at")}
    # the report is the plain one with the section added, nothing else changed
    section = "\n".join(timeline_lines(with_tl["timeline"])) + "\n"
    md = (tmp_path / "timeline" / "report.md").read_text()
    assert section in md and md.replace(section, "", 1) == (tmp_path / "plain" / "report.md").read_text()


def test_without_timeline_no_section_and_an_older_verdict_renders_as_before(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    out = tmp_path / "out"
    assert compare(pair, out).exit_code == 0
    record = json.loads((out / "verdict.json").read_text())
    md = (out / "report.md").read_text()
    assert record["timeline"] is None and TITLE not in md and "Decode-step timeline" not in md
    # a verdict of schema 3 (no `timeline` key) is still read and renders the same
    old = {k: v for k, v in record.items() if k != "timeline"} | {"schema_version": 3}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert render_markdown(load_result(tmp_path / "old.json", "verdict")) == md


def test_a_probe_folder_names_the_variants_that_are_no_arm_and_checks_each_arms_env(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    out = tmp_path / "out"
    res = compare(pair, out, "--timeline", probe_folder(tmp_path))
    assert res.exit_code == 0, res.output
    record = json.loads((out / "verdict.json").read_text())
    assert record["verdict"] == "PASS"
    match = record["timeline"]["comparison_arms"]
    assert {a: m["in_comparison"] for a, m in match.items()} == {
        "control": True,
        "cand-serial": False,
        "candidate": True,
        "only-fp16_gemv": False,
    }
    assert match["candidate"]["env_differs"] == {} and match["only-fp16_gemv"]["env_differs"] is None
    md = (out / "report.md").read_text()
    assert "Profiles of variants that are no arm of this comparison: cand-serial, only-fp16_gemv." in md
    assert "The route env these profiles recorded is their comparison arm's: control, candidate." in md
    assert "**" not in md.split(TITLE)[1]
    # the candidate's section first, then the probe's other variants by name
    heads = [line for line in md.splitlines() if line.endswith(" against the control")]
    assert heads == [
        f"### {arm} against the control" for arm in ("candidate", "cand-serial", "only-fp16_gemv")
    ]
    # a candidate profile of other code than the candidate's: said in bold, still not a gate
    out2 = tmp_path / "out2"
    res = compare(pair, out2, "--timeline", probe_folder(tmp_path / "moved", candidate_gemv="0"))
    assert res.exit_code == 0, res.output
    assert (
        f"**candidate: the profile ran {GEMV_VAR} = '0', the comparison's arm '1': a profile of other code "
        "than this arm's.**" in (out2 / "report.md").read_text()
    )


def _corrupt(folder: Path) -> tuple[Path, str]:
    data = json.loads((folder / "candidate.json").read_text())
    data["gpu_busy_us_per_step"] = -1
    (folder / "candidate.json").write_text(json.dumps(data))
    return folder, f"{folder / 'candidate.json'}: gpu_busy_us_per_step = -1: expected a finite number >= 0"


def _not_json(folder: Path) -> tuple[Path, str]:
    (folder / "control.json").write_text("{not json")
    return folder, f"{folder / 'control.json'}: "


def _absent(folder: Path) -> tuple[Path, str]:
    return folder / "absent", f"{folder / 'absent'}: no such timeline folder"


@pytest.mark.parametrize("bad", [_corrupt, _not_json, _absent])
def test_a_bad_timeline_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, pair: tuple[Path, Path], bad: Any
) -> None:
    folder = tmp_path / "profiles"
    shutil.copytree(H200, folder)
    where, want = bad(folder)
    out = tmp_path / "out"
    res = compare(pair, out, "--timeline", where)
    assert res.exit_code == 2, res.output
    assert res.output.count("qgate: error:") == 1 and len(res.output.strip().splitlines()) == 1
    assert want in res.output and "Traceback" not in res.output
    assert not out.exists()
