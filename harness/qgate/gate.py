"""The one gate type and the one place a PASS / FAIL / INCONCLUSIVE / ERROR decision is made.

A gate is {name, passed, detail, severity}. severity "error" marks a gate whose failure means the
comparison itself cannot be trusted (arms that differ in more than their env, an incomplete result,
a statistic that could not be computed, a route that did not provably run): any such failure makes
the verdict ERROR. severity "fail" marks evidence against the candidate: its failure makes the verdict
FAIL. severity "inconclusive" marks a gate the data could not decide: its failure makes the verdict
INCONCLUSIVE unless a fail or error gate failed too. Precedence: ERROR > FAIL > INCONCLUSIVE > PASS.

Every producer (speed: qgate.speed.gates, quality: qgate.quality.gates, routes: qgate.routes, ablate)
returns this type; records hold `Gate.to_dict()`. Each gate's name comes from a `GateName` registered in
the module that builds it (`gate_name`), so every gate can be found by name: `qgate gates` lists them
(qgate.gate_reference). A leaf module: it imports nothing of qgate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

PASS = "PASS"
FAIL = "FAIL"
INCONCLUSIVE = "INCONCLUSIVE"
ERROR = "ERROR"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR)
SEV_FAIL = "fail"
SEV_INCONCLUSIVE = "inconclusive"
SEV_ERROR = "error"
SEVERITIES = (SEV_FAIL, SEV_INCONCLUSIVE, SEV_ERROR)
# The verdict a failed gate of each severity makes, and the verdicts' order (higher wins).
SEVERITY_VERDICT = {SEV_ERROR: ERROR, SEV_FAIL: FAIL, SEV_INCONCLUSIVE: INCONCLUSIVE}
VERDICT_RANK = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2, ERROR: 3}


@dataclass(frozen=True)
class GateName:
    """A gate's registered name: the `template` its Gate is named by ({field}s filled per use: an arm, a
    route, a contract's threshold), the module that builds it, the verdict its failure makes
    (`severity`, in words: some gates fail INCONCLUSIVE or FAIL by the evidence), what a failure means
    for the candidate, and the docs page that explains it. `shown_as` is the prefix a verdict or an
    ablation puts before the name (compare's "quality: ", an ablation's "<arm>: ")."""

    template: str
    module: str
    severity: str
    failure: str
    doc: str
    shown_as: str = ""

    def __call__(self, **fields: object) -> str:
        """The gate's name with its fields filled in (a missing field is a KeyError: a bug, not input)."""
        return self.template.format(**fields)

    @property
    def listed(self) -> str:
        """The name as it reads in a record, prefix included."""
        return self.shown_as + self.template

    def matches(self, name: str) -> bool:
        """Whether a recorded gate name is one of this gate's (any prefix a record put before it)."""
        parts = re.split(r"\{[a-z_]+\}", self.template)
        pattern = "(?:.+: )?" + ".+".join(re.escape(p) for p in parts)
        return re.fullmatch(pattern, name) is not None


# Every gate name qgate builds, by its listed name (shown_as + template); filled as the modules that build
# gates are imported (qgate.gate_reference imports them all).
GATE_NAMES: dict[str, GateName] = {}


def gate_name(
    template: str, module: str, severity: str, failure: str, doc: str, shown_as: str = ""
) -> GateName:
    """Register a gate's name where the gate is built; a name registered twice is a bug."""
    name = GateName(template, module, severity, failure, doc, shown_as)
    if name.listed in GATE_NAMES:
        raise ValueError(
            f"gate {name.listed!r} registered twice ({GATE_NAMES[name.listed].module}, {module})"
        )
    GATE_NAMES[name.listed] = name
    return name


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    detail: str
    severity: str = SEV_FAIL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, key: str) -> Any:
        # Read access by field name, the way the same gate is read back from a record's JSON
        # (gate["passed"]), so code and tests read a gate and a stored gate alike. Read-only.
        if key not in ("name", "passed", "detail", "severity"):
            raise KeyError(key)
        return getattr(self, key)

    def prefixed(self, prefix: str) -> Gate:
        """The same gate named `<prefix><name>` (a section's or an arm's gates in one verdict)."""
        return replace(self, name=f"{prefix}{self.name}")


def decide(gates: Sequence[Gate]) -> tuple[str, list[str]]:
    """The verdict and its reasons (the failed gates, ERROR-class first, then FAIL, then INCONCLUSIVE).

    An unknown severity counts as error: a gate nobody can classify cannot let a comparison pass.
    """
    if not gates:
        return ERROR, ["no gate was evaluated"]
    failed = [g for g in gates if not g.passed]
    by_rank = sorted(
        failed, key=lambda g: -VERDICT_RANK[SEVERITY_VERDICT.get(g.severity, ERROR)]
    )  # stable: gate order kept within a severity
    reasons = [f"{g.name}: {g.detail}" for g in by_rank]
    if not by_rank:
        return PASS, []
    return SEVERITY_VERDICT.get(by_rank[0].severity, ERROR), reasons
