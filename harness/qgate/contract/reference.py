"""The contract reference (docs/reference/contract.md), generated from the pydantic schema.

`generate()` walks qgate.contract.Contract and every model nested in it and writes one section per
model (each key path it appears at), one table row per key: type, default (or "required"), the
constraints pydantic enforces (>=, >, pattern, length), and the field's description. Model docstrings
head their sections. A model whose keys are an earlier section's, each made optional (an arm's engine
overrides), points to that section instead of repeating its table. The committed PAGE must equal
`generate()` (tests/test_contract_doc.py), so the reference cannot drift from the schema: after a
schema change run `qgate contract doc --out docs/reference/contract.md`. Pure: returns text, never
prints.
"""

from __future__ import annotations

import inspect
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from qgate.contract import CONTRACT_SCHEMA_VERSION, Contract

# Where the reference is committed: docs/reference/ holds the generated pages, apart from the how-to ones.
PAGE = "docs/reference/contract.md"

HEADER = """# Contract reference

<!-- Generated from qgate.contract.Contract by `qgate contract doc --out {page}`;
     do not edit by hand. tests/test_contract_doc.py fails when this file and the schema differ. -->

A contract is a YAML file (contracts/*.yaml) read strictly: an unknown key, a wrong type or an
impossible value is one error line naming the file, the key path, the value and what was expected
(`qgate contract validate FILE`; exit 2). Contract schema version: {version}.
Below, each section is one mapping of the contract, under the key path it appears at.

A contract is data (contract/strict_yaml.py). Its YAML is read by the YAML 1.2 core schema, and each of
these is one error line naming its line, column and key path:
- a tag (`!!float 2`, `!!str 0100`, `!!binary`, `!!set`, `!!omap`, `!!pairs`, `!!python/...`, `!`):
  every explicit tag, even one that names the key's own type, since the schema checks each key's type
  strictly and the plain or quoted spelling says the same (`2.0`, `"0100"`); the other tags build values
  no contract holds (bytes, a set whose order changed the sha256 from run to run);
- an anchor, an alias or a merge key (`<<`): refused, not resolved, since a merged or aliased key holds
  a value written elsewhere and PyYAML's rule for which of two merged values wins is not one the file
  shows (it turned a candidate into an A/A); share engine args through `engine:` and the arms'
  `engine:` overrides;
- a duplicate key; a value YAML 1.1 reads otherwise (`yes`, `off`, `0100`, `1:30`, `1_000`: write
  `true`, `false`, `100` or quote it);
- an integer of more than 20 digits, NaN or infinity, a string holding NUL or a lone surrogate, anywhere,
  the free-form mappings (`compilation_config`, `hf_overrides`, `chat_template_kwargs`, env) included;
  a key that is not a string; more than 64 KiB, 20,000 values, or [ and {{ nested over 64 deep.
So the contract's canonical JSON, and the sha256 every result carries, are the same on every run.
"""


def _anchor(path: str) -> str:
    return "contract" if not path else re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _models(model: type[BaseModel], path: str, found: dict[type[BaseModel], list[str]]) -> None:
    """Every model reachable from `model`, with the key paths it appears at, in first-seen order."""
    found.setdefault(model, []).append(path)
    for name, field in model.model_fields.items():
        for sub in _nested(field.annotation):
            _models(sub, f"{path}.{name}" if path else name, found)


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _nested(arg)]


def type_text(annotation: Any, paths: dict[type[BaseModel], list[str]]) -> str:
    """A reader's name for a type: `integer`, `one of "a", "b"`, `list of string`, a link to a section."""
    origin = get_origin(annotation)
    if origin is Annotated:  # a bounded type (contract/base.py's seeds): the type and its bounds
        base, *metas = get_args(annotation)
        flat = [x for m in metas for x in (m.metadata if isinstance(m, FieldInfo) else [m])]
        bounds = [
            f"{sign} {getattr(m, a)}" for m in flat for a, sign in _BOUNDS if getattr(m, a, None) is not None
        ]
        return f"{type_text(base, paths)} ({', '.join(bounds)})" if bounds else type_text(base, paths)
    if origin is Literal:
        return "one of " + ", ".join(
            f"`{v!r}`" if isinstance(v, str) else f"`{v}`" for v in get_args(annotation)
        )
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        text = " or ".join(type_text(a, paths) for a in args)
        return f"{text} or null" if len(args) < len(get_args(annotation)) else text
    if origin is list:
        return "list of " + type_text(get_args(annotation)[0], paths)
    if origin is dict:
        key, value = get_args(annotation) or (str, Any)
        if value is Any:
            return "mapping"
        return f"mapping of {type_text(key, paths)} to {type_text(value, paths)}"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        where = paths[annotation]
        return f"mapping: [{', '.join(f'`{p}`' for p in where)}](#{_anchor(where[0])})"
    names = {int: "integer", float: "number", str: "string", bool: "boolean"}
    return names.get(
        annotation, "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))
    )


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        if isinstance(made, BaseModel):
            return "its own defaults"
        return f"`{made!r}`"
    if field.default is None or field.default is PydanticUndefined:
        return "unset"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    return f"`{field.default!r}`" if isinstance(field.default, str) else f"`{field.default}`"


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def constraints_text(field: FieldInfo) -> str:
    """The checks pydantic applies to the value, from the field's metadata."""
    out = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS:
            if getattr(meta, attr, None) is not None:
                out.append(f"{sign} {getattr(meta, attr)}")
        if getattr(meta, "min_length", None) is not None:
            out.append(f"at least {meta.min_length} long")
        if getattr(meta, "max_length", None) is not None:
            out.append(f"at most {meta.max_length} long")
        if getattr(meta, "pattern", None) is not None:
            out.append(f"matches `{meta.pattern}`")
    return ", ".join(out)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rules(model: type[BaseModel]) -> list[str]:
    """The model's validators that say what they check (their docstrings' first lines)."""
    decorators = model.__pydantic_decorators__
    found = []
    validators: list[Any] = [*decorators.field_validators.values(), *decorators.model_validators.values()]
    for dec in validators:
        doc = inspect.getdoc(dec.func)
        if doc:
            keys = ", ".join(f"`{f}`" for f in getattr(dec.info, "fields", ()))
            found.append(
                f"- Rule{' on ' + keys if keys else ''}: {' '.join(doc.split(chr(10) * 2)[0].split())}"
            )
    return [*found, ""] if found else []


def _row(name: str, field: FieldInfo, paths: dict[type[BaseModel], list[str]]) -> list[str]:
    """A key's cells: name, type, default, constraints, description."""
    return [
        f"`{name}`",
        type_text(field.annotation, paths),
        default_text(field),
        constraints_text(field),
        field.description or "",
    ]


def optional_copy(
    model: type[BaseModel], base: type[BaseModel], paths: dict[type[BaseModel], list[str]]
) -> bool:
    """`model` has `base`'s keys in its order, each with `base`'s type or that type or null, its
    constraints and description, and unset by default (an arm's engine overrides of `engine:`)."""
    if not model.model_fields or list(model.model_fields) != list(base.model_fields):
        return False
    for name, field in model.model_fields.items():
        _, kind, default, *rest = _row(name, field, paths)
        _, base_kind, _, *base_rest = _row(name, base.model_fields[name], paths)
        if kind not in (base_kind, f"{base_kind} or null") or default != "unset" or rest != base_rest:
            return False
    return True


def _section(
    model: type[BaseModel],
    where: list[str],
    paths: dict[type[BaseModel], list[str]],
    copy_of: type[BaseModel] | None = None,
) -> list[str]:
    title = ", ".join(f"`{p}`" for p in where) if where[0] else "top level"
    lines = [f'<a id="{_anchor(where[0])}"></a>', "", f"## {title}", ""]
    doc = inspect.getdoc(model) if model.__doc__ else None
    if doc:
        lines += [" ".join(doc.split("\n\n", 1)[0].split()), ""]
    lines += _rules(model)
    if copy_of is not None:  # the same table again would only add "or null" and "unset" to each row
        base = paths[copy_of][0]
        link = f"[{', '.join(f'`{p}`' for p in paths[copy_of])}](#{_anchor(base)})"
        same = f"The keys of {link}, with their types, constraints and descriptions; each also takes `null`"
        return [*lines, same + " and is unset by default.", ""]
    lines += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        lines.append("| " + " | ".join(_cell(c) for c in _row(name, field, paths)) + " |")
    return [*lines, ""]


def generate(model: type[BaseModel] = Contract) -> str:
    """The whole reference as markdown (deterministic: same schema, same text)."""
    paths: dict[type[BaseModel], list[str]] = {}
    _models(model, "", paths)
    lines = [HEADER.format(version=CONTRACT_SCHEMA_VERSION, page=PAGE)]
    shown: list[type[BaseModel]] = []
    for sub, where in paths.items():
        copy_of = next((base for base in shown if optional_copy(sub, base, paths)), None)
        lines += _section(sub, where, paths, copy_of)
        shown.append(sub)
    return "\n".join(lines).rstrip("\n") + "\n"
