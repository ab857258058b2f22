"""Reading a contract's YAML strictly: what yaml.safe_load lets through that a contract must not hold.

- A duplicate key: safe_load keeps the last one silently, so a candidate's second `env:` could turn it
  into an A/A without a word. Refused with both lines.
- Aliases that expand beyond MAX_NODES nodes (a "billion laughs" file): safe_load builds the whole
  expansion (issue 30: one was accepted after 96 s and 1.8 GB). The composed graph is measured
  first, each shared node once, so the check is linear in the file.
- NaN or infinity: no contract value means them, and a range check would report NaN as "should be
  less than 100". Refused with the key path.

- [ and { nested beyond MAX_FLOW_DEPTH, which PyYAML's scanner takes quadratic time over.
- A plain value that YAML 1.1 (PyYAML's default) and YAML 1.2 read differently (issue 39): `yes` / `off`
  (a bool in 1.1, text in 1.2), `1:30` (90 in 1.1), `0100` (64 in 1.1, 100 in 1.2), `1_000`, `0b11`.
  Scalars are resolved by the YAML 1.2 core schema (so `1e5` is a number, as its author meant), and a
  value whose meaning depends on the YAML version is refused with its line, column and key path and
  what to write instead.

Anchors and aliases within the bound stay allowed (a shared engine block is a fair use). Any file up to
MAX_BYTES is answered in well under a second.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from qgate.errors import cut

# Bounds far above any contract (the largest shipped one is 3.3 KB, a few hundred nodes) and low enough
# that reading the worst file within them stays well under a second.
MAX_BYTES = 64 << 10
MAX_NODES = 20_000  # nodes after alias expansion
MAX_FLOW_DEPTH = 64  # [ and { nesting: a contract's deepest is a handful


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


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    yaml_implicit_resolvers: dict[Any, Any] = {}  # filled below: the 1.2 core schema only

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
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
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


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


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _version_traps(root: Node) -> str | None:
    """The first plain scalar (a key or a value) whose meaning depends on the YAML version, with its line,
    column and key path; None when there is none. Each distinct node is visited once (aliases)."""
    seen: set[int] = set()
    stack: list[tuple[Node, str]] = [(root, "")]
    while stack:
        node, at = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ScalarNode):
            trap = _version_trap(node)
            if trap:
                mark = node.start_mark
                where = f"line {mark.line + 1} column {mark.column + 1}: {at or '<top>'}"
                return f"{where} = {node.value}: {trap}"
        elif isinstance(node, SequenceNode):
            stack.extend((c, f"{at}.{i}" if at else str(i)) for i, c in reversed(list(enumerate(node.value))))
        elif isinstance(node, MappingNode):
            for key, value in reversed(node.value):
                if key.tag != "tag:yaml.org,2002:str" and key.tag != "tag:yaml.org,2002:merge":
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


def _non_finite(data: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in data, or None."""
    stack: list[tuple[Any, str]] = [(data, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return f"{at or '<top>'} = {value!r}"
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{at}.{i}" if at else str(i)) for i, v in enumerate(value))
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
    bad = _non_finite(data)
    if bad is not None:
        raise StrictYamlError(f"{bad}: expected a finite number")
    return data
