"""One gamed candidate of the zoo (qgate.demo.FAULTY_KINDS) against the first engine start of a finished
control, at the production shapes: `python3 tools/gpu_engine/zoo.py CONTRACT CONTROL_JSON OUT KIND`.

A GPU session cannot pay three engine starts (~90 s each at 48 layers) for every gamed kind; the
control's first launch of the honest verdict's run (its control.json) stands for the control: written
into OUT/speed/control.json as `qgate.speed.run.first_launches` cuts it (its looks and audit dropped:
they judged the honest candidate), so the candidate decodes the same prompts (the run seed is read from
it). Then one engine start of the candidate with the kind's GEMV switched in (`qgate.demo.
faulty_candidate`: QGATE_ROUTE_IMPL_FP16_GEMV and the fixtures on its PYTHONPATH), and the token audit's
engine start of the control when its tokens differ (`qgate.speed.run.run_audit`). `qgate compare` of
OUT then judges it as any run (77-zoo.sh). A lab tool of the device calls: no gate lives here.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from qgate import models
from qgate.contract import load_contract
from qgate.demo import FAULTY_KINDS, faulty_candidate
from qgate.engine.arms import ARMS, contract_arms, run_arms
from qgate.results import atomic_write_json
from qgate.speed.run import SpeedWorkload, first_launches, run_audit, run_seed

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def main(contract: str, control_json: str, out: str, kind: str) -> int:
    if kind not in FAULTY_KINDS:
        print(f"zoo: kind {kind!r}: expected one of {', '.join(FAULTY_KINDS)}", file=sys.stderr)
        return 2
    loaded = load_contract(contract)
    out_dir = Path(out)
    control = json.loads(Path(control_json).read_text(encoding="utf-8"))
    first = first_launches(control, 1)
    first = {k: v for k, v in first.items() if k not in ("sequential", "audit")}
    first["launches"] = [x for x in first.get("launches") or [] if x.get("launch") == 0]
    first["repeats"] = [x for x in first.get("repeats") or [] if x.get("launch") == 0]
    first["complete"] = True
    (out_dir / "speed").mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "speed" / "control.json", first)
    ctrl, cand = contract_arms(loaded, ARMS)
    faulty = faulty_candidate(cand, kind)
    # The checkout's fixtures themselves (the shipped folder holds links to them, which a copied tree
    # may not keep), in front of the arm's path as faulty_candidate puts the shipped folder.
    rest = faulty.env["PYTHONPATH"].split(os.pathsep)[1:]
    env = {**faulty.env, "PYTHONPATH": os.pathsep.join([str(FIXTURES), *rest])}
    plans = [ctrl, replace(faulty, env=env)]
    seed = run_seed(loaded, out_dir)
    work = SpeedWorkload(loaded, out_dir, resume=False, launch_count=1, prompt_seed=seed)
    model = lambda: models.resolve_model(loaded.contract.model)  # noqa: E731
    results = run_arms(loaded, out_dir, work, ("candidate",), model=model, plans=[plans[1]])
    run_audit(loaded, out_dir, {"control": first, **results}, seed, plans=plans)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
