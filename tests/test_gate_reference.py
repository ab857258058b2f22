"""The gate reference (docs/reference/gates.md, `qgate gates`): every gate is built under a registered
name, the committed page equals the code, and real verdicts name only registered gates."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from golden import support
from typer.testing import CliRunner

from qgate.cli import app
from qgate.compare import Pair, build_verdict
from qgate.gate import GateName, gate_name
from qgate.gate_reference import BUILDERS, PAGE, gate_names, generate

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / PAGE


def _recorded_gates(record: Any) -> list[str]:
    """Every gate name in a record (a {name, passed, detail, severity} mapping at any depth)."""
    if isinstance(record, dict):
        own = [record["name"]] if {"name", "passed", "detail", "severity"} <= set(record) else []
        return own + [n for v in record.values() for n in _recorded_gates(v)]
    if isinstance(record, list):
        return [n for v in record for n in _recorded_gates(v)]
    return []


def _unregistered(names: list[str]) -> list[str]:
    known = gate_names()
    return [n for n in names if not any(g.matches(n) for g in known)]


def test_committed_reference_equals_the_code() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == generate(), (
        f"{PAGE} is stale: run `qgate gates --out {PAGE}`"
    )


def test_every_gate_is_built_under_a_registered_name() -> None:
    """No `Gate("...")` with a name written in place: the first argument is a name built from a
    registered constant (or a name handed in), and the modules that build gates are BUILDERS."""
    builders, literal = set(), []
    for path in sorted((REPO / "harness" / "qgate").rglob("*.py")):
        module = ".".join(["qgate", *path.relative_to(REPO / "harness" / "qgate").with_suffix("").parts])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Gate":
                builders.add(module)
                if node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                    literal.append(f"{module}:{node.lineno}")
    assert literal == []
    assert builders == set(BUILDERS)


def test_every_registered_name_has_its_fields_a_module_and_a_doc_page() -> None:
    names = gate_names()
    assert len(names) >= 38
    for g in names:
        assert g.module in BUILDERS and g.failure and g.severity
        assert (REPO / g.doc).is_file(), f"{g.listed}: no page {g.doc}"


def test_the_golden_verdict_names_only_registered_gates() -> None:
    control, candidate = support.load_pair()
    pair = Pair("speed", control, candidate, "control.json", "candidate.json")
    record = build_verdict([pair], [], support.pinned_contract())
    names = _recorded_gates(record)
    assert len(names) >= 10
    assert _unregistered(names) == []


def test_real_gpu_verdicts_and_ablations_name_only_registered_gates() -> None:
    """The device runs' records under docs/evidence/gpu-runs (a verdict of schema 3, an ablation of
    schema 4)."""
    files = [
        p
        for p in sorted((REPO / "docs" / "evidence" / "gpu-runs").rglob("*.json"))
        if p.name in ("verdict.json", "ablation.json")
    ]
    assert files
    for path in files:
        names = _recorded_gates(json.loads(path.read_text(encoding="utf-8")))
        assert _unregistered(names) == [], path


def test_a_name_matches_with_its_fields_and_prefix_filled_in() -> None:
    g = GateName("decode improvement >= {want} %", "m", "FAIL", "why", "docs/compare.md")
    assert g(want="5") == "decode improvement >= 5 %"
    assert g.matches("decode improvement >= 5 %") and g.matches("quality: decode improvement >= 2.5 %")
    assert not g.matches("decode improvement >= 5") and not g.matches("every candidate rep >= 5 tok/s")
    with pytest.raises(KeyError):
        g()


def test_a_name_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        gate_name("comparable arms", "elsewhere", "ERROR", "why", "docs/compare.md")


def test_cli_lists_the_gates_and_checks_the_page(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["gates"])
    assert res.exit_code == 0, res.output
    listed = "decode regression ruled out beyond {margin} %  [FAIL, INCONCLUSIVE or ERROR]  qgate.speed.gates"
    assert listed in res.output
    out = tmp_path / "gates.md"
    assert runner.invoke(app, ["gates", "--out", str(out)]).exit_code == 0
    assert runner.invoke(app, ["gates", "--check", "--out", str(out)]).exit_code == 0
    out.write_text("stale\n", encoding="utf-8")
    res = runner.invoke(app, ["gates", "--check", "--out", str(out)])
    assert res.exit_code == 1 and "differs from the code" in res.output
