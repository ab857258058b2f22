"""qgate_route_env, the one home of the route env vocabulary: the on/off parser (and compare's refusal
of a value that is neither), and a scan of the sources for a second copy of the vocabulary."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

import qgate_route_env as route_env
from qgate import compare
from qgate.results import ResultError

GEMV = "VLLM_SM70_QWEN38_FP16_GEMV"
HC = "VLLM_SM70_QWEN38_FUSED_HC_FP16"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("0", False),
        (" Off ", False),
        ("no", False),
        ("false", False),
        ("1", True),
        ("TRUE", True),
        (" on ", True),
        ("yes", True),
        ("2", None),
        ("maybe", None),
        ("enabled", None),
        ("1.0", None),
    ],
)
def test_parse_switch(value: str | None, expected: bool | None) -> None:
    assert route_env.parse_switch(value) is expected


def test_routes_on_refuses_an_unknown_value_and_lists_routes_in_order() -> None:
    assert route_env.routes_on({HC: "1", GEMV: "yes", "OTHER": "maybe"}) == ["fp16_gemv", "fused_hc_fp16"]
    with pytest.raises(route_env.SwitchError, match=f"^{HC}='maybe': expected 1 or 0"):
        route_env.routes_on({GEMV: "1", HC: "maybe"})
    # The lenient reading (the plugin's, beside switch_problems naming the value) never reads it as on.
    assert route_env.switched_on({HC: "maybe"}) == set()
    assert route_env.switch_problems({HC: "maybe"}) == [
        f"{HC}='maybe': expected 1 or 0 (also true/false, yes/no, on/off)"
    ]


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_compare_refuses_a_switch_that_is_neither_on_nor_off(value: str) -> None:
    # compare's reading of an arm's routes (it used to read any value other than 0/false/off/no as on).
    with pytest.raises(ResultError, match=f"^arm env: {GEMV}={value!r}"):
        compare.switched_routes({GEMV: value})
    assert compare.switched_routes({GEMV: "on", HC: "0"}) == ["fp16_gemv"]
    assert compare.switched_routes({}) == []


def test_static_problems_of_overrides() -> None:
    impl = route_env.override_var("fp16_gemv")
    assert route_env.static_problems({GEMV: "1", impl: "pkg.mod:fn"}) == []
    assert route_env.static_problems({impl: "pkg.mod:fn"}) == [
        f"{impl} is set but the route is off ({GEMV} is not 1)"
    ]
    assert route_env.static_problems({GEMV: "1", impl: "pkg.mod"}) == [
        f"{impl}='pkg.mod': expected 'package.module:function'"
    ]
    (unknown,) = route_env.static_problems({"QGATE_ROUTE_IMPL_GEMV": "a:b"})
    assert unknown.startswith("QGATE_ROUTE_IMPL_GEMV: unknown route override")


# --- no second copy ------------------------------------------------------------------------------

SOURCES = [REPO / "harness" / "qgate", REPO / "kernels_ext" / "qgate_kernels"]
HOME = REPO / "route_env" / "qgate_route_env" / "__init__.py"
ROUTE_NAMES = frozenset(route_env.ROUTES)
# Env variable names and prefixes: code names them through route_env, never by a literal.
ENV_WORDS = frozenset(
    {
        *route_env.ROUTES.values(),
        *(route_env.override_var(r) for r in route_env.ROUTES),
        route_env.ATTEST_DIR_ENV,
        route_env.SHIMS_ENV,
        route_env.SITES_ENV,
        route_env.SWITCH_PREFIX,
        route_env.OVERRIDE_PREFIX,
        *route_env.ARM_ENV_PREFIXES,
        *route_env.SITE_KEYS,
        *route_env.SHIMS,
    }
)
# Known copies, by (file, where): the operator screen's tables and contract schema keyed by literal route
# names (files this change did not own: they should import route_env), demo.py's override variable,
# and the op qgate::qsa_topk, whose name is its route's (an op name, not a copy of the route).
KNOWN_ELSEWHERE = {
    ("kernels_ext/qgate_kernels/__init__.py", "__all__"),
    ("kernels_ext/qgate_kernels/_library.py", "SCHEMAS"),
    ("kernels_ext/qgate_kernels/ops.py", "_CPU_REFERENCE_KERNELS"),
    ("kernels_ext/qgate_kernels/overrides.py", "ROUTE_OP"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _strings(node: ast.AST, skip: set[int]) -> set[str]:
    return {
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    }


def _copies() -> set[tuple[str, str, str]]:
    """(file, where, word): an env word as a string literal anywhere (docstrings aside), or a route
    name in the value of a module-level name (a constant, a table, a Literal of route names)."""
    found = set()
    for path in sorted(p for root in SOURCES for p in root.rglob("*.py")):
        if path == HOME:
            continue
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for word in _strings(tree, skip) & ENV_WORDS:
            found.add((rel, "literal", word))
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = ",".join(t.id for t in targets if isinstance(t, ast.Name))
                for word in _strings(stmt.value, skip) & ROUTE_NAMES:
                    found.add((rel, names, word))
    return found


def test_no_second_copy_of_the_route_vocabulary() -> None:
    copies = _copies()
    unexpected = sorted(c for c in copies if c[:2] not in KNOWN_ELSEWHERE)
    assert not unexpected, f"import these from qgate_route_env instead: {unexpected}"
    gone = sorted(k for k in KNOWN_ELSEWHERE if not any(c[:2] == k for c in copies))
    assert not gone, f"no longer a copy: remove from KNOWN_ELSEWHERE: {gone}"


def test_the_scan_finds_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check is real: a module defining a route name or naming the attestation variable is caught.
    pkg = tmp_path / "harness" / "qgate"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text(
        '"""QGATE_ATTEST_DIR in a docstring is prose."""\n'
        'ROUTE = "qsa_topk"\n'
        'def f(env):\n    return env.get("QGATE_ATTEST_DIR")\n',
        encoding="utf-8",
    )
    monkeypatch.setitem(globals(), "SOURCES", [pkg])
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    assert _copies() == {
        ("harness/qgate/bad.py", "ROUTE", "qsa_topk"),
        ("harness/qgate/bad.py", "literal", "QGATE_ATTEST_DIR"),
    }
