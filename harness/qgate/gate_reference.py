"""The gate reference (docs/reference/gates.md, `qgate gates`): every gate qgate builds, by name.

Each gate's name is registered where the gate is built (qgate.gate.gate_name: a constant in that
module); importing the modules that build gates fills qgate.gate.GATE_NAMES, and this module lists it:
the name as a record shows it ({field}s stand for what a run fills in), the module, the verdict its
failure makes, what a failure means and the page that explains it. The committed PAGE must equal
`generate()` (tests/test_gate_reference.py): after adding or renaming a gate run
`qgate gates --out docs/reference/gates.md`. Pure: returns data and text, never prints.
"""

from __future__ import annotations

import importlib
import posixpath

from qgate.gate import GATE_NAMES, GateName

# The modules that build gates (`Gate(` appears in these only: tests/test_gate_reference.py checks).
BUILDERS = (
    "qgate.comparable",
    "qgate.routes",
    "qgate.speed.gates",
    "qgate.speed.audit",
    "qgate.speed.dist_audit",
    "qgate.speed.repetition",
    "qgate.quality.gates",
    "qgate.quality.compare",
    "qgate.compare",
    "qgate.ablate",
)

# Where the reference is committed (beside the contract reference: docs/reference/ holds the generated
# pages); its links to the user pages are relative to it.
PAGE = "docs/reference/gates.md"

HEADER = f"""# Gates

<!-- Generated from the gate names registered where each gate is built (qgate.gate.gate_name) by
     `qgate gates --out {PAGE}`; do not edit by hand. tests/test_gate_reference.py
     fails when this file and the code differ. -->

Every gate a verdict (`qgate compare`) or an ablation (`qgate ablate`) records, by name. A `{{field}}`
stands for what the run fills in: the arm (`control`, `candidate`, an ablation arm such as
`only-fp16_gemv`), the route, the contract's threshold (its keys: [contract.md](contract.md)). A
verdict shows the quality gates after `quality: ` and the checks both kinds share in each kind's
section (so `quality: comparable arms`); an ablation shows an arm's route gates after `<arm>: `.

The verdict is decided over the failed gates (qgate/gate.py `decide`): ERROR (the comparison cannot be
trusted) > FAIL (evidence against the candidate) > INCONCLUSIVE (the data cannot decide) > PASS.
`On failure` is the verdict a failed gate makes; some make one or another by the evidence.

| Gate | On failure | What a failure means | Built in | Docs |
|---|---|---|---|---|
"""


def gate_names() -> list[GateName]:
    """Every registered gate name, in the order of BUILDERS and, within a module, of its source."""
    for module in BUILDERS:
        importlib.import_module(module)
    order = {m: i for i, m in enumerate(BUILDERS)}
    return sorted(GATE_NAMES.values(), key=lambda g: order.get(g.module, len(order)))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def generate() -> str:
    """PAGE's text: one table row per gate name."""
    rows = [
        f"| `{_cell(g.listed)}` | {g.severity} | {_cell(g.failure)} | `{g.module}` | {_link(g.doc)} |"
        for g in gate_names()
    ]
    return HEADER + "\n".join(rows) + "\n"


def _link(doc: str) -> str:
    """A link from PAGE to a page of the repository (`docs/verdict.md` -> `../verdict.md`)."""
    return f"[{doc}]({posixpath.relpath(doc, posixpath.dirname(PAGE))})"


def listing() -> list[dict[str, str]]:
    """The gates as rows of plain data (`qgate gates` prints them)."""
    return [
        {"name": g.listed, "module": g.module, "severity": g.severity, "failure": g.failure, "doc": g.doc}
        for g in gate_names()
    ]
