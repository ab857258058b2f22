"""A verdict record as JUnit XML, which every CI test reporter shows.

One <testsuite> per verdict (named for its contract and kinds), one <testcase> per gate: a gate that
passed is a passing case; a failed gate of severity "fail" a <failure>, of severity "error" an
<error>, of severity "inconclusive" <skipped> with the verdict's advice (its reasons: what to measure
next). The suite's properties carry the verdict. A fleet night (qgate.fleet_gather) adds, first, a
suite "qgate fleet entries" of one test case per entry: an entry that did not finish is an <error> saying
why, so a night that lost entries is never a clean run to CI. Pure: records in, text out.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from qgate.report.escape import xml_text

_TAG = {"fail": "failure", "error": "error", "inconclusive": "skipped"}


def _suite(record: dict[str, Any], name: str) -> ET.Element:
    gates = record.get("gates") or []
    failed = [g for g in gates if not g.get("passed")]
    count = {
        tag: sum(1 for g in failed if _TAG.get(g.get("severity"), "error") == tag) for tag in _TAG.values()
    }
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(gates)),
        failures=str(count["failure"]),
        errors=str(count["error"]),
        skipped=str(count["skipped"]),
    )
    props = ET.SubElement(suite, "properties")
    contract = record.get("contract") or {}
    for key, value in (
        ("verdict", record.get("verdict")),
        ("contract", contract.get("name")),
        ("contract_sha256", contract.get("sha256")),
        ("kinds", ",".join(record.get("kinds") or [])),
    ):
        ET.SubElement(props, "property", name=key, value=str(value))
    advice = "; ".join(record.get("reasons") or [])
    for gate in gates:
        case = ET.SubElement(suite, "testcase", classname=name, name=str(gate.get("name")))
        if gate.get("passed"):
            continue
        tag = _TAG.get(gate.get("severity"), "error")  # a severity qgate does not know: an error
        detail = str(gate.get("detail") or "")
        message = f"{detail} (advice: {advice})" if tag == "skipped" and advice else detail
        node = ET.SubElement(case, tag, message=message)
        if tag != "skipped":
            node.set("type", f"qgate.{gate.get('severity')}")
            node.text = f"{record.get('verdict')}: {gate.get('name')}: {detail}"
    return suite


ENTRIES_SUITE = "qgate fleet entries"


def _entries_suite(entries: list[tuple[str, str | None, str]]) -> ET.Element:
    """One test case per fleet entry (name, why it was lost or None, what happened): lost is an <error>."""
    lost = [e for e in entries if e[1] is not None]
    suite = ET.Element(
        "testsuite", name=ENTRIES_SUITE, tests=str(len(entries)), failures="0", errors=str(len(lost)),
        skipped="0",
    )  # fmt: skip
    for name, why, what in entries:
        case = ET.SubElement(suite, "testcase", classname=ENTRIES_SUITE, name=f"{name} finished")
        if why is not None:
            node = ET.SubElement(case, "error", message=why, type="qgate.lost")
            node.text = f"fleet entry {name}: {what}"
    return suite


def render(
    records: Iterable[tuple[str, dict[str, Any]]], entries: list[tuple[str, str | None, str]] | None = None
) -> str:
    """JUnit XML of (suite name, verdict record) pairs: one <testsuites> document. entries: a fleet
    night's (entry name, why it was lost or None, what happened to it), one test case each, first."""
    root = ET.Element("testsuites", name="qgate")
    if entries is not None:
        root.append(_entries_suite(entries))
    for name, record in records:
        root.append(_suite(record, name))
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in root)))
    for node in root.iter():  # every string from a record: what XML 1.0 cannot hold shown escaped
        node.text = None if node.text is None else xml_text(node.text)
        for key, value in node.attrib.items():
            node.set(key, xml_text(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def suite_name(record: dict[str, Any], prefix: str = "") -> str:
    contract = (record.get("contract") or {}).get("name") or "contract"
    name = f"qgate {'+'.join(record.get('kinds') or [])} {contract}"
    return f"{prefix} {name}".strip()
