"""The one line a contract error prints: what pydantic found, said as the key path, the value and what was
expected, naming what is there (issue 39):

- a key that holds a look-alike or an invisible character (a Cyrillic `а` in `arms`, a zero-width
  space) is shown escaped, with the character's Unicode name, and next to the key it resembles that is
  missing ("did you mean"): pydantic alone says only "arms: Field required";
- a long value or message is cut, with a count of what was cut (a role list of 25,000 characters, a
  whole contract under a bad key).
"""

from __future__ import annotations

import difflib
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from qgate.errors import QgateError, cut

MAX_LINE_CHARS = 400  # a message's own text (a rule's message that lists a long value)


class ContractError(QgateError):
    """A contract that cannot be used; str() is one line for the user."""


def shown(value: Any) -> str:
    """A value as a message shows it: repr, cut."""
    return cut(repr(value))


def _unusual(ch: str) -> bool:
    return not (ch.isascii() and ch.isprintable())


def key_text(key: Any) -> str:
    """A key as a message shows it: plain when it is printable ASCII, else escaped (so an invisible or
    look-alike character can be seen) and cut."""
    if isinstance(key, str) and not any(map(_unusual, key)):
        return cut(key)
    return cut(ascii(key))


def format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(key_text(p) for p in loc) if loc else "<top>"


def odd_chars(key: Any) -> str:
    """What in a key is not printable ASCII: ' (holds U+0430 CYRILLIC SMALL LETTER A at 0)'; else ''."""
    if not isinstance(key, str):
        return ""
    found = [
        f"U+{ord(ch):04X} {unicodedata.name(ch, 'an unnamed character')} at {i}"
        for i, ch in enumerate(key)
        if _unusual(ch)
    ]
    if not found:
        return ""
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return f" (holds {', '.join(found[:3])}{more})"


def skeleton(key: str) -> str:
    """A key reduced to what it looks like: NFKC, invisible characters dropped, a letter of another
    script read as the Latin letter its Unicode name says it is (CYRILLIC SMALL LETTER A -> a)."""
    out = []
    for ch in unicodedata.normalize("NFKC", key):
        if unicodedata.category(ch) in ("Cf", "Cc", "Zs") and ch != " ":
            continue
        name = unicodedata.name(ch, "")
        if not ch.isascii() and " LETTER " in name:
            letter = name.rsplit(" ", 1)[-1]
            if len(letter) == 1 and letter.isascii():
                ch = letter.lower() if "SMALL" in name else letter
        out.append(ch)
    return "".join(out).lower()


def resembles(key: Any, names: list[str]) -> str | None:
    """The name among `names` that `key` looks like (the same skeleton, or a close spelling); else None."""
    if not isinstance(key, str) or not names:
        return None
    sk = skeleton(key)
    same = [n for n in names if skeleton(n) == sk]
    if same:
        return same[0]
    close = difflib.get_close_matches(sk, [skeleton(n) for n in names], n=1, cutoff=0.75)
    return next(n for n in names if skeleton(n) == close[0]) if close else None


def lookup(data: Any, loc: tuple[Any, ...]) -> Any:
    cur = data
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return "<missing>"
    return cur


def data_loc(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of a pydantic error location that is in the data: pydantic adds the type it tried
    (`version.int` for `version: [1]` against `int | str`), which is no key of the user's file."""
    cur, kept = data, []
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            break
        kept.append(part)
    return tuple(kept)


def _known_keys(model: type[BaseModel], parent: tuple[Any, ...]) -> list[str]:
    """The keys the schema knows at `parent` (a path into the contract), or [] where it names none."""
    cur: Any = model
    for part in parent:
        field = cur.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        cur = model_in(field.annotation)
        if cur is None:
            return []
    return list(cur.model_fields)


def model_in(annotation: Any) -> type[BaseModel] | None:
    import inspect
    from typing import get_args

    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None


def _more(exc: ValidationError, shown_n: int) -> str:
    return f" (+{exc.error_count() - shown_n} more)" if exc.error_count() > shown_n else ""


def _unknown_key(path: Path, data: Any, exc: ValidationError, model: type[BaseModel]) -> ContractError | None:
    """An unknown key, said with what it holds and the known key it resembles (a missing one first)."""
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if not unknown:
        return None
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    for err in unknown:  # an unknown key beside a missing one it resembles is the one to name
        loc = tuple(err["loc"])
        parent, key = loc[:-1], loc[-1]
        gone = [str(m[-1]) for m in missing if m[:-1] == parent]
        like = resembles(key, gone)
        if like is not None:
            return ContractError(
                f"{path}: {format_loc(loc)}: unknown key{odd_chars(key)}; did you mean {like!r} (required, "
                f"missing)?{_more(exc, 2)}"
            )
    if any(e["type"] == "missing" for e in errors[:1]):
        return None  # the first error is a missing key no unknown key resembles: say that
    loc = tuple(unknown[0]["loc"])
    like = resembles(loc[-1], [k for k in _known_keys(model, loc[:-1]) if k != loc[-1]])
    hint = f"; did you mean {like!r}?" if like else ""
    return ContractError(
        f"{path}: {format_loc(loc)} = {shown(lookup(data, loc))}: unknown key{odd_chars(loc[-1])}{hint}"
        f"{_more(exc, 1)}"
    )


def first_error(path: Path, data: Any, exc: ValidationError, model: type[BaseModel]) -> ContractError:
    """One line for a contract pydantic refused: the first error, said with what is there."""
    named = _unknown_key(path, data, exc, model)
    if named is not None:
        return named
    errors = exc.errors()
    err = errors[0]
    loc = tuple(p for p in err["loc"] if p not in ("function-after",))
    msg = cut(err["msg"].removeprefix("Value error, "), MAX_LINE_CHARS)
    if not loc:  # a cross-field rule: its message names the keys and values itself
        return ContractError(f"{path}: {msg}")
    where = data_loc(data, loc)
    if err["type"] == "missing":
        return ContractError(f"{path}: {format_loc(loc)} = '<missing>': {msg}{_more(exc, 1)}")
    if where != loc and len(loc) == len(where) + 1:
        # One value tried against each type of a union: say what each expected, once.
        tried = [e for e in errors if data_loc(data, tuple(e["loc"])) == where]
        msg = " or ".join(dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in tried))
        return ContractError(
            f"{path}: {format_loc(where)} = {shown(lookup(data, where))}: expected {cut(msg, MAX_LINE_CHARS)}"
            f"{_more(exc, len(tried))}"
        )
    value = lookup(data, where)
    if err["type"] == "value_error" and isinstance(value, (dict, list)):
        # A rule across a section's keys: its message names them; the whole section is noise.
        return ContractError(f"{path}: {format_loc(where)}: {msg}{_more(exc, 1)}")
    return ContractError(f"{path}: {format_loc(where)} = {shown(value)}: {msg}{_more(exc, 1)}")
