"""Find import cycles among the project's own modules (qgate, qgate_kernels, qgate_route_env).

Every import counts, a lazy one inside a function too: a cycle through a lazy import is still two
modules that each need the other to be understood. Reads the sources with `ast`; imports nothing.
Prints each cycle found (one strongly connected component a line) and each arrow that runs against the
layering below (UPWARD: a lower package or room importing a higher one), and exits 1 when there is one.

    python tools/import_cycles.py            # from the repository root
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = {
    "qgate": Path("harness/qgate"),
    "qgate_kernels": Path("kernels_ext/qgate_kernels"),
    "qgate_route_env": Path("route_env/qgate_route_env"),
}
# Package data, not modules of the package: qgate/data/faulty_routes holds the demo's gamed routes
# (test fixtures the engine imports by name from an arm's PYTHONPATH, qgate/shipped.py), never qgate.*.
DATA = (Path("harness/qgate/data"),)
# Compiled modules (no source to read, built only where the extension is): a leaf each.
COMPILED = ("qgate_kernels._C",)


def module_files(repo: Path) -> dict[str, Path]:
    """Module name -> source file, for every .py under the project's packages."""
    out: dict[str, Path] = {}
    for package, rel in ROOTS.items():
        base = repo / rel
        for path in sorted(base.rglob("*.py")):
            if any(path.is_relative_to(repo / d) for d in DATA):
                continue
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def graph(repo: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (compiled modules are leaves)."""
    known: dict[str, Path | None] = {**module_files(repo), **dict.fromkeys(COMPILED)}
    return {mod: imports_of(mod, path, known) if path else set() for mod, path in known.items()}


def _resolve(name: str, known: dict[str, Path | None]) -> str | None:
    """The longest known module that `name` names or lies inside (a.b.func -> a.b)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, known: dict[str, Path | None]) -> set[str]:
    """The project modules `module` imports, at any depth of its source."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            # `from pkg import mod` is an edge to the submodule; `from pkg import name`, to pkg.
            names = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names
            ]
        else:
            continue
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                found.add(target)
    # A package's __init__ that runs before its submodule is not counted as an edge: only what the
    # source names.
    return found


# (importer, imported) prefixes that must never be joined by an import: the packages' boundary runs one
# way (qgate -> qgate_kernels -> qgate_route_env; the vocabulary imports neither), the contract is read
# below the engine that runs it, and the engine runs workloads it does not import (the child imports
# the one its spec names) on a model its caller resolved. An arrow that must run up anyway is written
# here with its reason in ARCHITECTURE.md ("Import arrows that run back up"), never silently.
UPWARD = (
    ("qgate_kernels", "qgate"),
    ("qgate_route_env", "qgate"),
    ("qgate_route_env", "qgate_kernels"),
    ("qgate.contract", "qgate.engine"),
    ("qgate.engine", "qgate.speed"),
    ("qgate.engine", "qgate.quality"),
    ("qgate.engine", "qgate.models"),
    ("qgate.engine", "qgate.cli"),
    # The built-in models are below the workloads that run them (quality/run.py -> models.py -> tiny/):
    # the frozen GSM8K items the trained model learns live in qgate.gsm8k, below both.
    ("qgate.tiny", "qgate.quality"),
    ("qgate.gsm8k", "qgate.quality"),
    ("qgate.gsm8k", "qgate.tiny"),
    ("qgate", "qgate_kernels"),  # the folders: harness/ reaches kernels_ext/ only where EXCEPT says
)
# Importers an UPWARD pair lets through: the operator screen and benchmark (qgate.ops) run the routes'
# ops and their pure-torch references; nothing else of qgate imports qgate_kernels.
EXCEPT = {("qgate", "qgate_kernels"): ("qgate.ops",)}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import `a -> b` that one of UPWARD forbids (and EXCEPT does not let through)."""
    return sorted(
        {
            f"{a} -> {b}"
            for a, targets in edges.items()
            for b in targets
            for low, high in UPWARD
            if _within(a, low)
            and _within(b, high)
            and not any(_within(a, ok) for ok in EXCEPT.get((low, high), ()))
        }
    )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def main() -> int:
    edges = graph(Path.cwd())
    found = cycles(edges)
    for component in found:
        print("cycle: " + " <-> ".join(component))
    print(f"{len(found)} import cycle(s)" if found else "no import cycles")
    up = upward(edges)
    for arrow in up:
        print(f"upward: {arrow}")
    print(f"{len(up)} upward import(s)" if up else "no upward imports")
    return 1 if found or up else 0


if __name__ == "__main__":
    sys.exit(main())
