"""What every record model builds on: the kind and its schema versions in code, strict types, frozen.

A record kind is one pydantic model (`Record` subclass): `kind` a Literal of its name, `schema_version`
a Literal of the versions qgate reads, oldest first, the last the one it writes (qgate.results.SCHEMAS
is read from these: one source of truth). Models are strict (no "3" for 3, no 1 for true) and frozen
(a record is evidence: read, never edited). Each kind decides what an unknown key means (`extra`):
"forbid" where qgate writes the whole record at once and reads it back (a key it does not know is a
record it did not write), "allow" where writers add keys while a session runs (the speed rep) or where a
nested block is free-form data. Imports nothing of qgate but errors.py: every module that reads or writes
records sits above this package.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qgate.errors import QgateError, cut

HEX64 = r"^[0-9a-f]{64}$"


class ResultError(QgateError):
    """A result file that cannot be used; str() is one line for the user (qgate.results re-exports it)."""


class Part(BaseModel):
    """A nested part of a record: strict, frozen, unknown keys refused unless the part says otherwise."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class Open(BaseModel):
    """A nested part whose writers add keys over time: the keys named here are typed, others kept."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")


class Record(BaseModel):
    """A record kind; subclasses give `kind: Literal["<kind>"]` and `schema_version: Literal[...]`."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    @classmethod
    def kind_name(cls) -> str:
        (name,) = get_args(cls.model_fields["kind"].annotation)
        return str(name)

    @classmethod
    def schema_versions(cls) -> tuple[int, ...]:
        """The versions qgate reads, oldest first; the last is the one it writes."""
        return tuple(int(v) for v in get_args(cls.model_fields["schema_version"].annotation))


# Parts of a pydantic error location that name a type tried, not a key (a union's members).
_TYPE_TAGS = ("str", "int", "float", "bool", "none", "list", "dict")


def _is_type_tag(part: str) -> bool:
    return part in _TYPE_TAGS or "[" in part or part in {m.__name__ for m in _models()}


def _models() -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [Part, Open, Record]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def loc_text(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the dotted key path the hand checkers print (`reps[3].token_ids`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_type_tag(str(part)) and not str(part).startswith("function-"):
            out += f".{part}" if out else str(part)
    return out or "<top>"


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)}>"
    return repr(value)


def one_line(exc: ValidationError, where: str) -> ResultError:
    """The first problem pydantic found, as the one line every refusal is: `<file>: <key> = <value>:
    <why>`."""
    err = exc.errors(include_url=False)[0]
    key = loc_text(tuple(err.get("loc", ())))
    if err.get("type") == "missing":
        return ResultError(f"{where}: {key}: missing (a record qgate writes holds it)")
    if err.get("type") == "extra_forbidden":
        return ResultError(f"{where}: {key}: not a key of this record (qgate does not write it)")
    return ResultError(f"{where}: {key} = {cut(_show(err.get('input')), 60)}: {err.get('msg', 'invalid')}")


__all__ = ["HEX64", "Field", "Open", "Part", "Record", "ResultError", "loc_text", "one_line"]
