"""The contract reference: generated from the schema, committed, and kept equal to the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from typer.testing import CliRunner

from qgate.cli.contract_doc import app
from qgate.contract.reference import generate

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "contract-reference.md"
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
        "docs/contract-reference.md is stale: run `qgate contract doc --out docs/contract-reference.md`"
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
