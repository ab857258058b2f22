"""Shared helpers of the compare tests (loaded by path: tests/ is not a package).

The fixture pair (speed_control.json, speed_candidate.json) is hand-made: control ~50 tok/s,
candidate ~60 tok/s (+20 %), CV ~0.3 %, identical tokens, one route switched on and attested; two
launches of 5 reps per arm (the contract's launches: 2; a verdict across engine starts needs them).
Schema 1's shape (no run_id: tests/test_result_fuzz.py makes schema-2 copies) with the prompt hashes
of schema 3 (every rep and warm-up its own prompt, the same in both arms), which the speed gate needs.
`one_launch` cuts a result to its first launch (what a run of launches: 1 records).
"""

from __future__ import annotations

import copy
import importlib
import json
import types
from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract, load_contract
from qgate.gate import SEV_ERROR, Gate

GOLDEN = Path(__file__).resolve().parent
FIXTURE_SHA = "0" * 60 + "90de"  # the pinned contract hash the fixtures carry
FIXTURE_CONTRACT = GOLDEN / "contract.yaml"
STANDIN_ROUTES = {
    "fp16_gemv": "VLLM_SM70_QWEN38_FP16_GEMV",
    "fused_hc_fp16": "VLLM_SM70_QWEN38_FUSED_HC_FP16",
    "fused_gdn_input_fp16": "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16",
    "qsa_topk": "VLLM_SM70_QWEN38_QSA_TOPK",
}


def load_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Fresh deep copies of the fixture pair, safe to mutate."""
    pair = [json.loads((GOLDEN / f"speed_{arm}.json").read_text()) for arm in ("control", "candidate")]
    return copy.deepcopy(pair[0]), copy.deepcopy(pair[1])


def one_launch(result: dict[str, Any]) -> dict[str, Any]:
    """The result as a run of one launch would have recorded it: launch 0's reps and segment."""
    result["reps"] = [r for r in result["reps"] if r.get("launch", 0) == 0]
    result["launches"] = [x for x in result["launches"] if x.get("launch", 0) == 0]
    result["workload"]["launches"] = 1
    for route in result["routes"].values():
        route["hits"] //= 2
        route["fallbacks"] = {k: v // 2 for k, v in route.get("fallbacks", {}).items()}
        route["roles"] = {k: v // 2 for k, v in route.get("roles", {}).items()}
    return result


def pinned_contract() -> LoadedContract:
    """The fixture contract with its hash pinned to the one the fixtures carry."""
    loaded = load_contract(FIXTURE_CONTRACT)
    return LoadedContract(path="tests/golden/contract.yaml", sha256=FIXTURE_SHA, contract=loaded.contract)


def rehash(result: dict[str, Any], contract_path: Path) -> dict[str, Any]:
    """Point a fixture at a real contract file and its real hash (for the CLI, which hashes it)."""
    loaded = load_contract(contract_path)
    result["contract"].update(sha256=loaded.sha256, path=str(contract_path))
    return result


def standin_routes() -> types.ModuleType:
    """A stand-in for qgate.routes with the documented semantics (the real one belongs to issue 5)."""
    mod = types.ModuleType("qgate.routes")
    # Everything else of the real module (the contract reads its env vocabulary), when it imports.
    try:
        real = importlib.import_module("qgate.routes")
        mod.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    except ImportError:
        mod.OVERRIDE_PREFIX = "QGATE_ROUTE_IMPL_"
        mod.override_var = lambda route: mod.OVERRIDE_PREFIX + route.upper()
    mod.ROUTES = dict(STANDIN_ROUTES)

    def attestation_gates(control: dict[str, Any], candidate: dict[str, Any]) -> list[Gate]:
        gates = []
        for route, var in STANDIN_ROUTES.items():
            if candidate["env"].get(var, "0") not in ("", "0"):
                hits = candidate["routes"].get(route, {}).get("hits", 0)
                gates.append(Gate(f"route {route} ran in the candidate", hits > 0, f"{hits} hits", SEV_ERROR))
        control_hits = sum(r.get("hits", 0) for r in control["routes"].values())
        gates.append(
            Gate("no route ran in the control", control_hits == 0, f"{control_hits} hits", SEV_ERROR)
        )
        return gates

    mod.attestation_gates = attestation_gates
    return mod


def history_night(root: Path, night: str, control: dict[str, Any], candidate: dict[str, Any]) -> Path:
    """A night's run folder as the nightly leaves it (speed results and the speed verdict's record),
    for `qgate history append`: the results' first engine start moved to `night`."""
    run = root / night
    for arm, result in (("control", control), ("candidate", candidate)):
        result = copy.deepcopy(result)
        for launch in result["launches"]:
            launch["started_at"] = f"{night}T01:30:00+00:00"
        for i, rep in enumerate(result["reps"]):  # after their engine start, in index order
            rep["started_at"] = f"{night}T01:31:{i:02d}+00:00"
        write_json(run / "speed" / f"{arm}.json", result)
    verdict = {
        "kind": "verdict", "schema_version": 2, "verdict": "INCONCLUSIVE", "reasons": [], "gates": [],
        "kinds": ["speed"], "contract": control["contract"], "figures": {},
    }  # fmt: skip
    write_json(run / "compare-speed" / "verdict.json", verdict)
    return run


def written_pair(tmp: Path) -> tuple[Path, Path, Path]:
    """The fixture pair under tmp, rehashed against a copy of the fixture contract there:
    (a/control.json, b/candidate.json, contract.yaml)."""
    contract = tmp / "contract.yaml"
    contract.write_bytes(FIXTURE_CONTRACT.read_bytes())
    control, candidate = (rehash(r, contract) for r in load_pair())
    return (
        write_json(tmp / "a" / "control.json", control),
        write_json(tmp / "b" / "candidate.json", candidate),
        contract,
    )


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path
