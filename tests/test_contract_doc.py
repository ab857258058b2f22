"""The contract reference: generated from the schema, committed, and kept equal to the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from typer.testing import CliRunner

from qgate.cli.contract_doc import app
from qgate.contract.reference import PAGE, generate

REFERENCE = Path(__file__).resolve().parents[1] / PAGE
runner = CliRunner()


class _Inner(BaseModel):
    """Inner part.

    Second paragraph: not shown.
    """

    model_config = ConfigDict(extra="forbid")
    rate: float = Field(0.5, gt=0, le=1, description="a share")


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="who | what")
    mode: Literal["a", "b"] = "a"
    sha: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    items: list[int] = Field(default_factory=list)
    inner: _Inner = Field(default_factory=_Inner)
    more: dict[str, _Inner] | None = None

    @field_validator("name")
    @classmethod
    def _no_space(cls, value: str) -> str:
        """Names hold no spaces."""
        return value


def test_committed_reference_equals_the_schema() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == generate(), (
        f"{PAGE} is stale: run `qgate contract doc --out {PAGE}`"
    )


def test_reference_names_every_section_of_the_contract() -> None:
    text = generate()
    for heading in ("## top level", "## `engine`", "## `arms.control`, `arms.candidate`", "## `speed`",
                    "## `speed.gates`", "## `speed.stats`"):  # fmt: skip
        assert heading in text
    floor = "the candidate's mean decode rate >= this (one-sided bound; low reps reported)"
    assert f"| `min_decode_tok_s` | number or null | unset | >= 0 | {floor} |" in text
    assert "| `input_tokens` | integer | **required** | >= 1, <= 10000000 |  |" in text


def test_generator_renders_types_defaults_constraints_and_rules() -> None:
    text = generate(_Outer)
    assert "| `name` | string | **required** | at least 1 long | who \\| what |" in text
    assert "| `mode` | one of `'a'`, `'b'` | `'a'` |  |  |" in text
    assert "| `sha` | string or null | unset | matches `^[0-9a-f]{64}$` |  |" in text
    assert "| `items` | list of integer | `[]` |  |  |" in text
    assert "| `inner` | mapping: [`inner`, `more`](#inner) | its own defaults |  |  |" in text
    assert (
        "| `more` | mapping of string to mapping: [`inner`, `more`](#inner) or null | unset |  |  |" in text
    )
    assert "## `inner`, `more`\n\nInner part.\n" in text and "Second paragraph" not in text
    assert "| `rate` | number | `0.5` | > 0, <= 1 | a share |" in text
    assert "- Rule on `name`: Names hold no spaces." in text


class _Overrides(BaseModel):  # _Inner's keys, each optional: a pointer, not a second table
    rate: float | None = Field(None, gt=0, le=1, description="a share")


class _Other(BaseModel):  # the same key with another bound: its own table
    rate: float | None = Field(None, gt=0, le=2, description="a share")


class _Arms(BaseModel):
    inner: _Inner
    over: _Overrides
    other: _Other


def test_an_optional_copy_points_to_its_section_and_anything_else_has_a_table() -> None:
    text = generate(_Arms)
    pointer = "The keys of [`inner`](#inner), with their types, constraints and descriptions"
    assert text.count(pointer) == 1
    assert text.index("## `over`") < text.index(pointer) < text.index("## `other`")
    assert text.count("| `rate` | number | `0.5` | > 0, <= 1 | a share |") == 1
    assert "| `rate` | number or null | unset | > 0, <= 2 | a share |" in text
    contract = generate()  # an arm's engine overrides: the shared engine's keys, each optional
    section = contract.split("## `arms.control.engine`, `arms.candidate.engine`", 1)[1].split("\n## ", 1)[0]
    assert "The keys of [`engine`](#engine)" in section and "| key |" not in section


def test_cli_prints_writes_and_checks(tmp_path: Path) -> None:
    res = runner.invoke(app, [])
    assert res.exit_code == 0 and res.output == generate()
    out = tmp_path / "ref.md"
    assert runner.invoke(app, ["--check", "--out", str(out)]).exit_code == 1  # missing file
    res = runner.invoke(app, ["--out", str(out)])
    assert res.exit_code == 0 and out.read_text() == generate()
    assert runner.invoke(app, ["--check", "--out", str(out)]).exit_code == 0
    out.write_text(generate().replace("| `seed` |", "| `sed` |", 1))
    res = runner.invoke(app, ["--check", "--out", str(out)])
    assert res.exit_code == 1 and "differs from the schema" in res.output
    assert runner.invoke(app, ["--check"]).exit_code == 2
