"""Reading a contract's YAML strictly: what yaml.safe_load lets through that a contract must not hold.

- A duplicate key: safe_load keeps the last one silently, so a candidate's second `env:` could turn it
  into an A/A without a word. Refused with both lines.
- Aliases that expand beyond MAX_NODES nodes (a "billion laughs" file): safe_load builds the whole
  expansion (issue 30: one was accepted after 96 s and 1.8 GB). The composed graph is measured
  first, each shared node once, so the check is linear in the file.
- NaN or infinity: no contract value means them, and a range check would report NaN as "should be
  less than 100". Refused with the key path.

- [ and { nested beyond MAX_FLOW_DEPTH, which PyYAML's scanner takes quadratic time over.

Anchors and aliases within the bound stay allowed (a shared engine block is a fair use). Any file up to
MAX_BYTES is answered in well under a second.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

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


class _Loader(_BASE):  # type: ignore[misc, valid-type]
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
        data = loader.construct_document(root)
    finally:
        loader.dispose()
    bad = _non_finite(data)
    if bad is not None:
        raise StrictYamlError(f"{bad}: expected a finite number")
    return data
