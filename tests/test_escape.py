"""Every string from a contract or a record escaped for where it goes (issue 63): a contract name cannot
forge a verdict heading, raw HTML and javascript: links render as text in report.md and history.md,
junit.xml stays well-formed XML, and the terminal never gets a control byte raw. The markdown is
rendered by markdown-it (CommonMark, as GitHub parses it; installed with rich) to check what a reader
would see. No engine: the hand-made fixture pair."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from golden import support
from markdown_it import MarkdownIt
from test_history import make_night  # noqa: F401
from typer.testing import CliRunner

from qgate import comparable, history
from qgate.cli import app
from qgate.compare import Pair, build_verdict
from qgate.contract import LoadedContract, parse_contract
from qgate.report import junit, render_markdown, speed_png
from qgate.report.escape import Md, html_text, md, md_cell, md_code, term, xml_text
from qgate.report.tables import table

runner = CliRunner()
EVIL = (
    "evil\n\n# qgate verdict: PASS\n<script>alert(1)</script> <img src=x onerror=alert(1)> </details> "
    "[click](javascript:alert(1)) <javascript:alert(1)> | cell `tick \a\x1b]0;pwned\a\rover \u202ertl "
    "$\\bad{x}$"
)


def _html(text: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(text)


def _safe(html: str) -> None:
    """What a reader's browser would get: no tag, handler or link a string brought."""
    for bad in (
        "<script",
        '<img src="x"',
        "<img src=x",
        "</details",
        'href="javascript:',
        "<javascript:",
        "\x07",
        "\x1b",
        "\r",
    ):
        assert bad not in html, bad


def test_md_renders_as_the_text_it_is() -> None:
    html = _html(f"- {md(EVIL)}\n")
    _safe(html)
    assert html.count("<li>") == 1 and "<h1>" not in html and "<code>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "[click](javascript:alert(1))" in html
    # What reads as text stays as written: no backslash is added where nothing could be markup.
    assert md("CI [1.18, 1.21]; >= 55 tok/s; VLLM_SM70_QWEN38_FP16_GEMV") == (
        "CI [1.18, 1.21]; >= 55 tok/s; VLLM_SM70_QWEN38_FP16_GEMV"
    )
    assert md("# h") == "\\# h" and md("12. x") == "12\\. x" and md_cell("-1.5 %") == "-1.5 %"
    assert _html(md_code("a``b`")) == "<p><code>a``b`</code></p>\n"


def test_a_table_escapes_its_data_and_keeps_its_markup() -> None:
    import pandas as pd

    text = table(pd.DataFrame([{"a": EVIL, "b": Md("**bold**"), "c": md_code("x|y")}]))
    html = _html(text)
    _safe(html)
    assert html.count("<tr>") == 2 and "<strong>bold</strong>" in html and "<code>x|y</code>" in html


def _evil_contract() -> LoadedContract:
    data = support.pinned_contract().contract.model_dump(mode="json")
    data["name"] = EVIL
    return LoadedContract(
        path=f"c/{EVIL}.yaml", sha256=support.FIXTURE_SHA, contract=parse_contract(data, Path("c"))
    )


def _failing_record(monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(comparable, "routes", support.standin_routes())
    control, candidate = support.load_pair()
    for rep in candidate["reps"]:  # half the control's rate: FAIL
        rep["decode_tok_s"] *= 0.5
        rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
    candidate["env"]["PYTHONPATH"] = EVIL  # into a gate's detail and the env table
    return build_verdict([Pair("speed", control, candidate, EVIL, "t.json")], [], _evil_contract())


def test_a_contract_name_cannot_forge_the_verdict_heading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _failing_record(monkeypatch)
    speed_png(record, tmp_path / "speed.png")  # the title's $...$ is no mathtext (it would not parse)
    assert record["verdict"] == "FAIL"
    text = render_markdown(record)
    assert [line for line in text.splitlines() if line.startswith("# ")] == ["# qgate verdict: FAIL"]
    html = _html(text)
    _safe(html)
    assert html.count("<h1>") == 1 and "<h1>qgate verdict: FAIL</h1>" in html


def test_junit_is_valid_xml_whatever_a_record_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    record = _failing_record(monkeypatch)
    next(g for g in record["gates"] if not g["passed"])["detail"] = "bad \x00\x01\x0b\x1b[31m\ufffe bytes"
    xml = junit.render([(junit.suite_name(record), record)])
    root = ET.fromstring(xml.encode())  # expat refuses what XML 1.0 cannot hold
    assert root.find("testsuite/properties/property[@name='contract']").get("value") == xml_text(EVIL)
    assert "\\x1b[31m" in xml and "\x1b" not in xml
    assert xml_text("a\tb\nc") == "a\tb\nc"
    assert html_text('<a href="x">\x1b') == "&lt;a href=&quot;x&quot;&gt;\\x1b"


def test_history_md_escapes_the_store_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contract = tmp_path / "contract.yaml"
    data = yaml.safe_load(support.FIXTURE_CONTRACT.read_text())
    data["name"] = EVIL
    contract.write_text(yaml.safe_dump(data))
    run, verdict = make_night(tmp_path, contract, "2026-12-01", "a" * 40, scale=0.5)
    assert verdict == "FAIL"
    store = tmp_path / "h.sqlite"
    history.append(store, run)
    text = Path(history.write_report(store, tmp_path / "rep")["report"]).read_text()
    assert [line for line in text.splitlines() if line.startswith("# ")] == ["# qgate nightly history"]
    _safe(_html(text))
    history.publish(store, tmp_path / "site")  # the static site: HTML and SVG through html_text
    pages = [p.read_text() for p in (tmp_path / "site").rglob("*.html")]
    assert pages
    for page in pages:
        for bad in ("<script>alert", "<img src=x", "</details", "\x07", "\x1b", "\r"):
            assert bad.encode().decode("unicode_escape") not in page, bad


def test_the_terminal_gets_no_control_byte(tmp_path: Path) -> None:
    data = yaml.safe_load(support.FIXTURE_CONTRACT.read_text())
    data["name"] = EVIL
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["contract", "validate", str(path)])
    assert res.exit_code == 0, res.output
    assert res.output.count("\n") == 1 and "\\x07\\x1b]0;pwned\\x07\\rover \\u202ertl" in res.output
    for bad in ("\a", "\x1b", "\r", "\u202e"):
        assert bad not in res.output
    assert term("a\nb\x9b") == "a\\nb\\x9b"
    res = runner.invoke(
        app, ["compare", str(tmp_path / "nope\a\x1b[2J"), str(tmp_path), "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "\x1b" not in res.output and "\a" not in res.output, res.output
