"""The distribution audit's calibration (qgate.speed.dist_calibration) from finished speed runs: each run
folder's reps as (positions compared, discordant) pairs, by model and kind.

    python tools/dist_audit_calibration.py MODEL_KEY KIND=RUN_DIR [KIND=RUN_DIR ...]

KIND is `honest:<name>` (the shipped route, a rounding change: its false FAIL) or a zoo kind of
qgate.speed.dist_calibration.CORRUPTIONS (its power). Prints the JSON entry to paste into
harness/qgate/speed/dist_calibration.py under MODELS[MODEL_KEY], with each run's model spec and the
first rep's figures; docs/speed-audit.md gives the runs behind the shipped entries.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qgate.speed.dist_audit import compared


def pairs(run: Path) -> tuple[list[list[int]], str]:
    control = json.loads((run / "speed" / "control.json").read_text(encoding="utf-8"))
    candidate = json.loads((run / "speed" / "candidate.json").read_text(encoding="utf-8"))
    reps, missing = compared(control, candidate)
    if missing:
        raise SystemExit(f"{run}: reps {missing} record no top-k")
    return [[r["positions"], len(r["discordant"])] for r in reps], str(control["model"]["spec"])


def main(argv: list[str]) -> int:
    key, entry = argv[0], {"model_spec": None, "honest": {}, "corrupt": {}}
    for arg in argv[1:]:
        kind, _, where = arg.partition("=")
        reps, spec = pairs(Path(where))
        entry["model_spec"] = entry["model_spec"] or spec
        if kind.startswith("honest:"):
            entry["honest"][kind.removeprefix("honest:")] = reps
        else:
            entry["corrupt"][kind] = reps
    print(json.dumps({key: entry}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
