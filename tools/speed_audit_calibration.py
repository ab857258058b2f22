"""Calibrate the speed audit (qgate.speed.audit) on finished speed runs: the control's model scores, by
teacher forcing from the first token, every rep of both arms of each run folder given, in one engine start
of the control's env per folder (run it under the engine lock). The control's own greedy tokens measure
the scoring's noise floor (its prefill reads them with batched GEMMs, decode made them with batch-one
GEMVs: a legitimate rounding change the audit must never call implausible); a candidate's tokens measure
what the audit sees of it. Writes, per folder and arm, every rep's margins to OUT (JSON):

    python tools/speed_audit_calibration.py OUT.json legitimate:NAME=RUN_DIR[:arms] broken:NAME=RUN_DIR ...

`arms` is control, candidate or both (default: both); the folder is copied first (the audit record of
the copy's control result is what the engine start writes), the original is not touched.
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
from qgate.speed.run import AUDIT_ARM, AuditWorkload, arm_path


def score_folder(run: Path, arms: tuple[str, ...]) -> dict[str, list[list[float]]]:
    """{arm: [margins of rep 0, rep 1, ...]} for the given arms of one run folder, every token scored."""
    results = {arm: json.loads(arm_path(run, arm).read_text()) for arm in ARMS}
    loaded = load_contract(results["control"]["contract"]["path"])
    items = [
        {"index": r["index"], "prompt_sha256": r["prompt_sha256"], "token_ids": r["token_ids"], "from": 0}
        for arm in arms
        for r in results[arm]["reps"]
    ]
    with tempfile.TemporaryDirectory(prefix="qgate-audit-cal-") as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(run / "speed", copy / "speed")
        control = dict(results["control"], audit={})
        plan = next(p for p in contract_arms(loaded, ARMS) if p.name == "control")
        work = AuditWorkload(loaded, copy, control, items, int(control["prompt"]["seed"]))
        audit_plan = replace(plan, name=AUDIT_ARM, env=dict(results["control"]["env"]))
        run_arms(
            loaded, copy, work, (AUDIT_ARM,), plans=[audit_plan],
            model=lambda: models.resolve_model(loaded.contract.model),
        )  # fmt: skip
        scored = work.control["audit"]["reps"]
    out: dict[str, list[list[float]]] = {}
    for arm, entry in zip([a for a in arms for _ in results[a]["reps"]], scored, strict=True):
        out.setdefault(arm, []).append([round(m, 4) for m in entry["margins"]])
    return out


def main(argv: list[str]) -> int:
    out_path, specs = Path(argv[0]), argv[1:]
    data: dict = {"legitimate": {}, "broken": {}}
    for spec in specs:
        kind, _, rest = spec.partition(":")
        name, _, where = rest.partition("=")
        folder, _, which = where.partition(":")
        arms = ARMS if which in ("", "both") else (which,)
        for arm, margins in score_folder(Path(folder), arms).items():
            data[kind][f"{name}/{arm}"] = margins
            flat = [m for rep in margins for m in rep]
            above = {t: sum(m > t for m in flat) for t in (0.01, 0.5, 1.0, 2.0)}
            print(
                f"{kind} {name}/{arm}: {len(margins)} reps, {len(flat)} tokens, max {max(flat):.4f}, "
                f"above {above}"
            )
    out_path.write_text(json.dumps(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
