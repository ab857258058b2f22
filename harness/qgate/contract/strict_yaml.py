"""Reading a contract's YAML strictly: a contract is data, and yaml.safe_load lets through much that is not.

- Tags, anchors, aliases and merge keys (issue 45): refused, each with its line, column and key path,
  before anything is built. A tag is refused wherever it stands, `!!float 2` on a float key included:
  scalars are resolved by the YAML 1.2 core schema before any key's type is known, then the schema
  checks each type strictly, so a tag adds nothing that the plain or quoted spelling (`2.0`, `"0100"`)
  does not say, and the other tags (`!!binary`, `!!set`, `!!omap`, `!!pairs`, `!!timestamp`,
  `!!python/...`) build values no contract holds (bytes, a set whose order changes the sha256 run to
  run, tuples a NaN hid in). Anchors, aliases and merge keys are refused rather than resolved: a merged
  or aliased key holds a value written elsewhere, and which of two merged values wins (`<<: [{S: "0"},
  {S: "1"}]`) is PyYAML's rule (the mapping's own key over a merged one, the first merged over later
  ones, duplicates found by object identity), which no reviewer reads and which turned a candidate into
  an A/A; a shared engine block is what the shared `engine:` with per-arm `engine:` overrides is for.
- A duplicate key: safe_load keeps the last one silently, so a candidate's second `env:` could turn it
  into an A/A without a word. Refused with both lines.
- More than MAX_NODES values, and [ and { nested beyond MAX_FLOW_DEPTH (PyYAML's scanner takes
  quadratic time over them), refused before they are built (issue 30's alias bomb).
- A plain value that YAML 1.1 (PyYAML's default) and YAML 1.2 read differently (issue 39): `yes` / `off`
  (a bool in 1.1, text in 1.2), `1:30` (90 in 1.1), `0100` (64 in 1.1, 100 in 1.2), `1_000`, `0b11`.
  Scalars are resolved by the YAML 1.2 core schema (so `1e5` is a number, as its author meant), and a
  value whose meaning depends on the YAML version is refused with its line, column and key path and
  what to write instead.
- An integer of more than MAX_INT_DIGITS digits (a 401-digit `repetitions:` was an OverflowError), NaN
  or infinity (no contract value means them; a range check would report NaN as "should be less than
  100"), a string no UTF-8 can hold (a lone surrogate) or holding NUL (no path or environment can), in
  every value, the free-form dicts (`compilation_config`, `hf_overrides`, env) included: what is built
  is only dicts with string keys, lists, strings, finite numbers, bools and null, so the contract's
  canonical JSON, and its sha256, are the same on every run.

Any file up to MAX_BYTES is answered in well under a second.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, NodeEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from qgate.errors import cut

# Bounds far above any contract (the largest shipped one is 3.3 KB, a few hundred nodes) and low enough
# that reading the worst file within them stays well under a second.
MAX_BYTES = 64 << 10
MAX_NODES = 20_000  # nodes after alias expansion
MAX_FLOW_DEPTH = 64  # [ and { nesting: a contract's deepest is a handful
# Past every 64-bit value (2**64 has 20 digits), so a key's own bound names a value just past its range
# (a seed of 2**64); below where a count turns into a float that overflows (a 401-digit repetitions).
MAX_INT_DIGITS = 20


class StrictYamlError(ValueError):
    """YAML that is valid but not acceptable as a contract; str() is one line (without the file)."""


# libyaml's parser when PyYAML has it (pure-Python PyYAML took 33 s for a 400 KB list on a loaded
# 2-core machine); the constructor (duplicate keys, below) is Python either way.
_BASE: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# The YAML 1.2 core schema's plain scalars (yaml.org/spec/1.2.2 10.3.2); anything else is text.
_CORE = (
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|"),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE"),
    ("tag:yaml.org,2002:int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"),
    (
        "tag:yaml.org,2002:float",
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
    ),
)
_FIRST = "~nNtTfF-+0123456789."
_YAML11 = Resolver()  # PyYAML's own (YAML 1.1) resolution, to find values whose meaning differs
_YAML11_VALUES = yaml.constructor.SafeConstructor()
_SCALAR_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Loader(_BASE):
    yaml_implicit_resolvers: dict[Any, Any] = {}  # filled below: the 1.2 core schema only

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, ScalarNode):
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    if key in seen:
                        raise StrictYamlError(
                            f"line {line}: duplicate key {key!r} (first at line {seen[key]}): the last "
                            "would silently win; remove one"
                        )
                    seen[key] = line
        return super().construct_mapping(node, deep=deep)


for _tag, _pattern in _CORE:
    _Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_FIRST) + [""])


def _int12(text: str) -> int:
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 16) if text.startswith("0x") else int(text, 10)


def _float12(text: str) -> float:
    low = text.lower()
    return float(low.replace(".", "")) if low.endswith((".inf", ".nan")) else float(low)


def _value12(tag: str, text: str) -> Any:
    """A plain scalar's value under the 1.2 core schema, given the tag _Loader resolved."""
    if tag == "tag:yaml.org,2002:int":
        return _int12(text)
    if tag == "tag:yaml.org,2002:float":
        return _float12(text)
    if tag == "tag:yaml.org,2002:bool":
        return text.lower() == "true"
    return None if tag == "tag:yaml.org,2002:null" else text


_Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: _int12(node.value))
_Loader.add_constructor("tag:yaml.org,2002:float", lambda loader, node: _float12(node.value))


def _version_trap(node: ScalarNode) -> str | None:
    """What to write instead of a plain scalar that YAML 1.1 and 1.2 read differently; else None."""
    if node.style:  # quoted or a block scalar: text in both (plain is None, or "" from libyaml)
        return None
    text = node.value
    old = _YAML11.resolve(ScalarNode, text, (True, False))
    if old not in _SCALAR_TAGS:
        return None
    try:
        was = _YAML11_VALUES.construct_object(ScalarNode(old, text))
        now = _value12(node.tag, text)
    except (ValueError, yaml.YAMLError):
        return None
    if type(now) is type(was) and (now == was or (isinstance(was, float) and math.isnan(was))):
        return None
    now_tag = node.tag
    if isinstance(was, bool):
        # the reader does not know the key's type: `launches: yes` meant 1 there, `enforce_eager: yes` true
        fix = f"write {_shown(was)} for a bool ({int(was)} for a number) or quote it ({text!r}) for text"
    elif now_tag == "tag:yaml.org,2002:str":
        fix = f"write {was!r} or quote it ({text!r}) for text"
    else:
        fix = f"write {now!r}, or {was!r} if that was meant"
    return f"YAML 1.1 reads it as {_shown(was)}, YAML 1.2 as {_shown(now)}: {fix}"


def _int_too_long(node: ScalarNode) -> str | None:
    """Why a plain integer is too long to be a contract's value; else None. Measured on the text: int()
    of a long one is slow and refused past 4,300 digits."""
    if node.style or node.tag != "tag:yaml.org,2002:int":
        return None
    text = node.value.lstrip("+-")
    if text.startswith(("0x", "0o")):  # counted in decimal when short enough to convert, else as written
        body = text[2:].lstrip("0")
        digits = str(_int12(text[:2] + (body or "0"))) if len(body) <= 2 * MAX_INT_DIGITS else body
    else:
        digits = text.lstrip("0")
    if len(digits) <= MAX_INT_DIGITS:
        return None
    return (
        f"an integer of {len(digits)} digits: a contract's integers have at most {MAX_INT_DIGITS} (every "
        "key's range is far below); write the number it was meant to be"
    )


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _version_traps(root: Node) -> str | None:
    """The first plain scalar (a key or a value) whose meaning depends on the YAML version, an integer too
    long or a number not finite, with its line, column and key path; None when there is none. Each
    distinct node is visited once."""
    seen: set[int] = set()
    stack: list[tuple[Node, str]] = [(root, "")]
    while stack:
        node, at = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ScalarNode):
            mark = node.start_mark
            where = f"line {mark.line + 1} column {mark.column + 1}: {at or '<top>'}"
            trap = _int_too_long(node) or _version_trap(node)
            if trap:
                return f"{where} = {cut(node.value)}: {trap}"
            if node.tag == "tag:yaml.org,2002:float" and not math.isfinite(value := _float12(node.value)):
                spelt = node.value.lower().lstrip("+-") in (
                    ".inf",
                    ".nan",
                )  # else 1e999: say what was written
                written = "" if spelt else f" (written {cut(node.value)})"
                return f"{where} = {value!r}: expected a finite number{written}"
        elif isinstance(node, SequenceNode):
            stack.extend((c, f"{at}.{i}" if at else str(i)) for i, c in reversed(list(enumerate(node.value))))
        elif isinstance(node, MappingNode):
            for key, value in reversed(node.value):
                if key.tag != "tag:yaml.org,2002:str":
                    mark = key.start_mark
                    text = key.value if isinstance(key, ScalarNode) else type(key).__name__
                    return (
                        f"line {mark.line + 1} column {mark.column + 1}: {at or '<top>'}: the key "
                        f"{cut(repr(text))} is not a name ({key.tag.rsplit(':', 1)[-1]}): keys are names; "
                        "quote it if it is one"
                    )
                name = key.value if isinstance(key, ScalarNode) else "<key>"
                stack.append((value, f"{at}.{name}" if at else str(name)))
                stack.append((key, f"{at}: the key" if at else "the key"))
    return None


def _expanded_size(root: Node) -> int:
    """Nodes the constructed data would hold, aliases expanded; each distinct node is sized once."""
    sizes: dict[int, int] = {}
    # Post-order without recursion (a deeply nested file must not hit Python's recursion limit).
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        if ready:
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[id(node)] = min(total, MAX_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


_CORE_TAG = "tag:yaml.org,2002:"
_AS_DATA = (
    "a contract is data, written out where it applies: no tags, anchors, aliases or merge keys "
    "(docs/reference/contract.md)"
)


def _tag_fix(event: NodeEvent, tag: str) -> str:
    """What to write instead of a tagged node: the plain spelling of the value the tag asked for."""
    if not isinstance(event, ScalarEvent):
        return "write the list or mapping without it"
    text = cut(event.value, 40)
    if tag in ("!!str", "!"):
        return f"quote it ({text!r}) for text"
    if tag == "!!float" and re.fullmatch(r"[-+]?[0-9]+", event.value):
        return f"write {text}.0"
    if tag in ("!!int", "!!float", "!!bool", "!!null"):
        return f"write {text} (the key's type is in the schema)"
    return "write plain text, a number, a list or a mapping"


def _event_problem(event: NodeEvent, is_key: bool) -> str | None:
    """Why a node of the event stream is not plain data (a tag, an anchor, an alias, a merge key)."""
    if isinstance(event, AliasEvent):
        return f"the alias *{cut(str(event.anchor), 40)}: {_AS_DATA}; write the value here"
    if event.anchor is not None:
        return f"the anchor &{cut(str(event.anchor), 40)}: {_AS_DATA}; remove it"
    tag = getattr(event, "tag", None)
    if tag is not None:
        shown = "!!" + tag[len(_CORE_TAG) :] if tag.startswith(_CORE_TAG) else tag
        return f"the tag {cut(shown, 40)}: {_AS_DATA}; {_tag_fix(event, shown)}"
    if is_key and isinstance(event, ScalarEvent) and event.value == "<<" and not event.style:
        return (
            f"the merge key <<: {_AS_DATA}; write the keys out here (which of two merged values wins "
            "is PyYAML's rule, not one the file shows)"
        )
    return None


def _not_data(text: str) -> str | None:
    """The first tag, anchor, alias or merge key in text, with its line, column and key path; None when
    there is none. Read from the parser's events, before anything is composed or built (the composer
    resolves and the constructor acts on tags, aliases and merges). One pass, no recursion."""
    loader = _BASE(text)
    # One frame per open collection: [is a mapping, its key path, next node is a key, last key, index]
    frames: list[list[Any]] = []
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, CollectionEndEvent):
                frames.pop()
                _advance(frames)
                continue
            if not isinstance(event, NodeEvent):
                continue  # stream and document events
            at, is_key = _place(frames)
            problem = _event_problem(event, is_key)
            if problem is not None:
                mark = event.start_mark
                merge = problem.startswith("the merge key")  # it names the key itself
                where = f"{at or '<top>'}: the key" if is_key and not merge else at or "<top>"
                return f"line {mark.line + 1} column {mark.column + 1}: {where}: {problem}"
            if is_key:
                frames[-1][3] = event.value if isinstance(event, ScalarEvent) else "<key>"
            if isinstance(event, CollectionStartEvent):
                frames.append([event.__class__.__name__.startswith("Mapping"), at, True, None, 0])
            else:
                _advance(frames)
    finally:
        loader.dispose()
    return None


def _place(frames: list[list[Any]]) -> tuple[str, bool]:
    """(key path of the next node, whether it is a key)."""
    if not frames:
        return "", False
    is_map, at, key_next, key, index = frames[-1]
    if is_map and key_next:
        return at, True
    part = str(key) if is_map else str(index)
    return (f"{at}.{part}" if at else part), False


def _advance(frames: list[list[Any]]) -> None:
    """A node of the innermost collection is done: a mapping's key then value alternate."""
    if frames:
        if frames[-1][0]:
            frames[-1][2] = not frames[-1][2]
        else:
            frames[-1][4] += 1


def _value_problem(data: Any) -> str | None:
    """The key path, value and problem of the first value that is not plain finite data: NaN or
    infinity, a string no UTF-8 can hold or holding NUL, a type no contract holds; else None."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, at = stack.pop()
        where = at or "<top>"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} = {value!r}: expected a finite number"
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                return f"{where} = {cut(ascii(value))}: {problem}"
        elif isinstance(value, dict):
            for k, v in value.items():
                problem = _text_problem(k) if isinstance(k, str) else "a key that is no name"
                if problem:
                    return f"{where}: the key {cut(ascii(k))}: {problem}"
                stack.append((v, f"{at}.{k}" if at else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{at}.{i}" if at else str(i)) for i, v in enumerate(value))
        elif value is not None and not isinstance(value, (bool, int, float)):
            return f"{where}: a {type(value).__name__}, which no contract holds"
    return None


def _text_problem(text: str) -> str | None:
    if "\0" in text:
        return "holds a NUL character, which no path or environment can hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} (a lone surrogate) is no character UTF-8 can hold"
    return None


def _flow_depth(text: str) -> int:
    """The deepest nesting of [ and { outside quotes and comments (PyYAML's scanner is quadratic in it:
    measured 2 s for 900 levels, so it is bounded before the scanner sees the text)."""
    if text.count("[") + text.count("{") <= MAX_FLOW_DEPTH:
        return 0
    depth = deepest = 0
    quote = ""
    comment = False
    prev = "\n"
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev in " \t\n":
            comment = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
        prev = ch
    return deepest


def describe_yaml_error(exc: yaml.YAMLError, text: str) -> str:
    """One line for what PyYAML refused, with the line and column (a bad character's too: PyYAML's
    reader gives only its offset)."""
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position] if isinstance(exc.position, int) else ""
        line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        ch = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        name = unicodedata.name(ch, "a control character")
        return (
            f"line {line} column {column}: the character U+{ord(ch[:1] or chr(0)):04X} ({name}) cannot be in "
            "YAML text; remove it (or write it as an escape inside double quotes)"
        )
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    said = f"{problem} ({context})" if context else problem
    return f"{where}not valid YAML: {cut(' '.join(str(said).split()))}"


def load_yaml(text: str) -> Any:
    """The data of a contract's text; StrictYamlError or yaml.YAMLError for what cannot be one."""
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise StrictYamlError(f"[ and {{ nested more than {MAX_FLOW_DEPTH} deep: not a contract")
    problem = _not_data(text)
    if problem is not None:
        raise StrictYamlError(problem)
    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()  # PyYAML's composer recurses once per level of nesting
        except RecursionError:
            raise StrictYamlError("nested too deeply: not a contract") from None
        if root is None:
            return None
        size = _expanded_size(root)
        if size > MAX_NODES:
            raise StrictYamlError(
                f"more than {MAX_NODES} values once its aliases are expanded (a YAML alias bomb?): "
                "not a contract"
            )
        trap = _version_traps(root)
        if trap is not None:
            raise StrictYamlError(trap)
        data = loader.construct_document(root)
    finally:
        loader.dispose()
    problem = _value_problem(data)
    if problem is not None:
        raise StrictYamlError(problem)
    return data
