"""The typed record models (qgate.records): the schema versions in code, the checked-in JSON Schemas equal
to the models, real records accepted, and a record the models refuse refused in one line (exit 2)."""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path

import jsonschema
import pytest
from golden import support
from typer.testing import CliRunner

from qgate import night, records, results
from qgate.cli import app
from qgate.compare import Pair, build_verdict
from qgate.records.night import NightRow
from qgate.speed.record import check_speed_result

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"


def _real_records() -> list[Path]:
    """Every record file checked in: the test fixtures, the example report and the GPU runs' records."""
    found = []
    for base in ("tests", "reports", "docs/evidence/gpu-runs"):
        for path in sorted((REPO / base).rglob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("kind") in records.MODELS:
                found.append(path)
    return found


REAL = _real_records()


def test_the_registry_is_the_models() -> None:
    """results.SCHEMAS is read from the models: one place holds a kind's versions."""
    assert results.SCHEMAS == {kind: m.schema_versions() for kind, m in records.MODELS.items()}
    for kind, model in records.MODELS.items():
        assert results.current_schema(kind) == model.schema_versions()[-1]
        assert model.kind_name() == kind


def test_checked_in_schemas_equal_the_models() -> None:
    files = records.schema_files()
    assert sorted(p.name for p in SCHEMAS.glob("*.schema.json")) == sorted(files)
    for name, text in files.items():
        assert (SCHEMAS / name).read_text(encoding="utf-8") == text, (
            f"schemas/{name} is stale: run `qgate records schema --out schemas`"
        )


def test_the_real_records_are_the_kinds_named() -> None:
    kinds = {json.loads(p.read_text(encoding="utf-8"))["kind"] for p in REAL}
    # docs/evidence/gpu-runs' speed/control.json, candidate.json, verdict.json, ablation.json among them;
    # tests/fixtures/records/quality_control.json: a real `qgate run quality -c contracts/quality-cpu.yaml
    # --arm control` on the CPU (its items cut to the first 2 of 48, to stay small)
    assert {"speed", "quality", "verdict", "ablation", "ops_bench", "processes"} <= kinds
    assert any(p.match("docs/evidence/gpu-runs/*/run/compare/verdict.json") for p in REAL)


@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(REPO)))
def test_real_records_validate_against_the_models_and_the_schemas(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    records.validate(data["kind"], data, str(path))
    schema = json.loads((SCHEMAS / f"{data['kind']}.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, schema)


def test_a_verdict_written_today_validates() -> None:
    control, candidate = support.load_pair()
    pair = Pair("speed", control, candidate, "control.json", "candidate.json")
    record = json.loads(json.dumps(build_verdict([pair], [], support.pinned_contract())))
    model = records.validate("verdict", {**record, "created_at": "2026-12-06T00:00:00+00:00"}, "verdict.json")
    assert model.schema_version == results.current_schema("verdict") and model.gates


def test_a_speed_rep_keeps_keys_it_does_not_name() -> None:
    """Reps gain keys while the speed audit grows (per-rep top-k logprobs): a new key is kept, not refused."""
    control, _ = support.load_pair()
    control["reps"][0]["top_logprobs"] = [[[5, -0.1], [7, -2.3]]]
    model = records.validate("speed", control, "control.json")
    assert model.reps[0].model_extra == {"top_logprobs": [[[5, -0.1], [7, -2.3]]]}


def test_a_verdict_key_qgate_does_not_write_is_refused_in_one_line() -> None:
    record = json.loads((REPO / "reports" / "example-cpu" / "verdict.json").read_text(encoding="utf-8"))
    with pytest.raises(results.ResultError) as err:
        records.validate("verdict", {**record, "verdcit": "PASS"}, "v.json")
    assert str(err.value) == "v.json: verdcit: not a key of this record (qgate does not write it)"


def test_what_the_hand_checks_pass_the_model_refuses_in_one_line() -> None:
    """The hand checks come first (their messages are the held-out corpora's), the model after them."""
    control, _ = support.load_pair()
    check_speed_result(copy.deepcopy(control), "control.json")  # the intact record passes both
    control["launch_order"] = {"scheme": "alternate", "seed": "7", "first": ["control"]}
    with pytest.raises(results.ResultError) as err:
        check_speed_result(control, "control.json")
    assert str(err.value) == "control.json: launch_order.seed = '7': Input should be a valid integer"
    bad = copy.deepcopy(control)
    bad["reps"][2]["decode_tok_s"] = "fast"  # the hand check's message, as before
    with pytest.raises(
        results.ResultError, match=r"^control.json: reps\[2\].decode_tok_s = 'fast': expected a number$"
    ):
        check_speed_result(bad, "control.json")


def test_compare_refuses_a_record_the_model_refuses_with_exit_2(tmp_path: Path) -> None:
    control, candidate = support.load_pair()
    control["prompt"]["seed_pinned"] = "yes"
    for arm, data in (("control", control), ("candidate", candidate)):
        support.rehash(data, support.FIXTURE_CONTRACT)
        (tmp_path / f"{arm}.json").write_text(json.dumps(data), encoding="utf-8")
    res = CliRunner().invoke(
        app,
        ["compare", str(tmp_path / "control.json"), str(tmp_path / "candidate.json"),
         "--contract", str(support.FIXTURE_CONTRACT), "--out", str(tmp_path / "out")],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert (
        res.output.strip()
        .splitlines()[-1]
        .endswith("prompt.seed_pinned = 'yes': Input should be a valid boolean")
    )
    assert "Traceback" not in res.output


def test_the_night_row_is_the_stores_columns() -> None:
    """records.night.NightRow and night.COLUMNS: the same names in the same order, of the SQL types."""
    assert tuple(NightRow.model_fields) == night.COLUMN_NAMES
    sql = {"TEXT": str, "INTEGER": int, "REAL": float}
    for (name, decl), field in zip(night.COLUMNS, NightRow.model_fields.values(), strict=True):
        base = sql[decl.split()[0]]
        args = typing.get_args(field.annotation)
        if "NOT NULL" in decl:
            assert field.annotation is base and field.is_required(), name
        else:
            assert set(args) == {base, type(None)} and not field.is_required(), name


def test_a_night_collected_today_is_a_night_row(tmp_path: Path) -> None:
    """night.collect's rows, as the store holds them (appended_at set on append), are NightRows."""
    run = support.history_night(tmp_path, "2026-12-01", *support.load_pair())
    rows = night.collect(run)
    assert [r["arm"] for r in rows] == ["control", "candidate"]
    for row in rows:
        stored = NightRow.model_validate({**row, "appended_at": "2026-12-02T00:00:00+00:00"})
        assert stored.decode_reps == row["decode_reps"] and stored.content_sha256 == row["content_sha256"]


def test_cli_writes_and_checks_the_schemas(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["records", "schema", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["records", "schema", "--check", "--out", str(tmp_path)]).exit_code == 0
    (tmp_path / "speed.schema.json").write_text("{}\n", encoding="utf-8")
    res = runner.invoke(app, ["records", "schema", "--check", "--out", str(tmp_path)])
    assert res.exit_code == 1 and "speed.schema.json differ from the models" in res.output
