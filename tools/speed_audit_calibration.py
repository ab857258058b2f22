"""Calibrate the speed audit (qgate.speed.audit) on finished speed runs: for every run folder given, the
reps the gate would score (qgate.speed.audit.audit_items: each candidate rep whose tokens left the
control's, and the control's own tokens from the same position) are scored by the control's model in one
engine start of the control's env (run it under the engine lock), and each rep's pair of margins (the
candidate's, the control's own; both empty where the tokens agree) is written to OUT (JSON) under its
kind (legitimate: a candidate that only rounds differently; broken: one that does other math):

    python tools/speed_audit_calibration.py OUT.json legitimate:NAME=RUN_DIR broken:NAME=RUN_DIR ...

The folder is copied first (the copy's control result gets the audit record), the original is untouched.
qgate.speed.audit.error_rates reads the pairs; tests/test_speed_audit.py reproduces the documented rates.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from qgate import models
from qgate.contract import load_contract
from qgate.engine.arms import ARMS, contract_arms, run_arms
from qgate.speed.audit import IMPLAUSIBLE_NATS, audit_items
from qgate.speed.run import AUDIT_ARM, AuditWorkload, arm_path


def score_folder(run: Path) -> list[list[list[float]]]:
    """[[candidate's margins, control's own], ...] per candidate rep of one run folder, in index order."""
    results = {arm: json.loads(arm_path(run, arm).read_text()) for arm in ARMS}
    control = {**results["control"], "audit": {}}
    items = audit_items(control, results["candidate"])
    scored: list[dict] = []
    if items:
        loaded = load_contract(results["control"]["contract"]["path"])
        with tempfile.TemporaryDirectory(prefix="qgate-audit-cal-") as tmp:
            copy = Path(tmp) / "run"
            shutil.copytree(run / "speed", copy / "speed")
            plan = replace(contract_arms(loaded, ARMS)[0], name=AUDIT_ARM, env=dict(control["env"]))
            work = AuditWorkload(loaded, copy, control, items, int(control["prompt"]["seed"]))
            run_arms(
                loaded, copy, work, (AUDIT_ARM,), plans=[plan],
                model=lambda: models.resolve_model(loaded.contract.model),
            )  # fmt: skip
            scored = work.control["audit"]["reps"]
    by = {(a["index"], a["arm"]): [round(m, 3) for m in a["margins"]] for a in scored}
    indices = sorted(r["index"] for r in results["candidate"]["reps"])
    return [[by.get((i, "candidate"), []), by.get((i, "control"), [])] for i in indices]


def main(argv: list[str]) -> int:
    out_path, specs = Path(argv[0]), argv[1:]
    data: dict = {"legitimate": {}, "broken": {}}
    for spec in specs:
        kind, _, rest = spec.partition(":")
        name, _, folder = rest.partition("=")
        pairs = data[kind][name] = score_folder(Path(folder))
        cand = [m for p in pairs for m in p[0]]
        own = [m for p in pairs for m in p[1]]
        print(
            f"{kind} {name}: {len(pairs)} reps, {sum(bool(p[0]) for p in pairs)} diverging; candidate "
            f"{sum(m > IMPLAUSIBLE_NATS for m in cand)} of {len(cand)} tokens above {IMPLAUSIBLE_NATS:g} "
            "nats "
            f"(max {max(cand, default=0):.3f}), control's own {sum(m > IMPLAUSIBLE_NATS for m in own)} of "
            f"{len(own)} (max {max(own, default=0):.3f})",
            flush=True,
        )
    out_path.write_text(json.dumps(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
