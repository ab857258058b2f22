"""Compare two quality results: the contract's gates on the candidate, the paired test, per-item rates.

`compare_quality(control, candidate, loaded)` is what `qgate compare` calls for `kind: quality`
results (qgate.compare.comparers: the one comparer signature). The control is the reference (the
control arm's run, or a stored reference result given in its place). The shared checks (same contract,
model, versions; route attestation) are run once by qgate.compare; the checks here are the
quality-specific ones: the same items, sampling and prompts.
"""

from __future__ import annotations

from typing import Any

from qgate.contract import LoadedContract
from qgate.contract.quality import Quality
from qgate.gate import SEV_ERROR, Gate, gate_name
from qgate.quality.gates import arm_gates, paired_gate, summarize
from qgate.quality.paired import seed_of, single_seed_caveat

SAME_INPUTS = gate_name(
    "same items and prompts", __name__, "ERROR",
    "the arms ran other items, sampling or prompt token ids: their answers cannot be paired",
    "docs/quality.md", shown_as="quality: ",
)  # fmt: skip


def _quality_section(loaded: LoadedContract | None, candidate: dict[str, Any]) -> Quality:
    """The contract's quality section, or (without a contract in hand) the candidate's record of it."""
    if loaded is not None and loaded.contract.quality is not None:
        return loaded.contract.quality
    return Quality.model_validate(candidate["quality"])


def same_inputs_gate(control: dict[str, Any], candidate: dict[str, Any]) -> Gate:
    """Both arms ran the same items with the same quality settings and the same prompt token ids."""
    problems = []
    for key in ("dataset", "quality"):
        a, b = dict(control.get(key) or {}), dict(candidate.get(key) or {})
        a.pop("source", None), b.pop("source", None)  # the same items may come from another path
        if a != b:
            problems.append(f"{key} differs")
    prompts_a = {r["index"]: r.get("prompt_sha256") for r in control.get("items", [])}
    prompts_b = {r["index"]: r.get("prompt_sha256") for r in candidate.get("items", [])}
    differing = sorted(i for i in prompts_a.keys() & prompts_b.keys() if prompts_a[i] != prompts_b[i])
    if differing:
        problems.append(f"prompt token ids differ for items {differing}")
    if problems:
        return Gate(SAME_INPUTS(), False, "refuse to compare: " + "; ".join(problems), SEV_ERROR)
    return Gate(SAME_INPUTS(), True, "same items, sampling and prompt token ids", SEV_ERROR)


def _frozen_run(items: list[dict[str, Any]], frozen_seed: int | None) -> list[dict[str, Any]]:
    if frozen_seed is None:
        return list(items)
    return [r for r in items if seed_of(r, frozen_seed) == frozen_seed]


def miss_table(
    control: dict[str, Any], candidate: dict[str, Any], frozen_seed: int | None = None
) -> list[dict[str, Any]]:
    """One row per item that either arm missed (raw or strict) on the frozen seed's run (all records
    when frozen_seed is None), predicted vs expected for both."""
    ctrl = {r["index"]: r for r in _frozen_run(control.get("items", []), frozen_seed)}
    rows = []
    for r in sorted(_frozen_run(candidate.get("items", []), frozen_seed), key=lambda x: x["index"]):
        c = ctrl.get(r["index"], {})
        missed = [not x.get(k, False) for x in (r, c) for k in ("raw_correct", "strict_correct")]
        if not any(missed):
            continue
        new = (not r["raw_correct"] and c.get("raw_correct", True)) or (
            not r["strict_correct"] and c.get("strict_correct", True)
        )
        rows.append(
            {
                "index": r["index"],
                "gold": r["gold"],
                "control_raw": c.get("raw_answer"),
                "control_strict": c.get("strict_answer"),
                "candidate_raw": r["raw_answer"],
                "candidate_strict": r["strict_answer"],
                "candidate_finish": r["finish_reason"],
                "candidate_tokens": r["output_tokens"],
                "new_miss": bool(new),
            }
        )
    return rows


def compare_quality(
    control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract | None
) -> dict[str, Any]:
    """Gates (qgate.gate.Gate) and the data the report shows: settings, miss table, figures, the paired
    test. Data only: qgate.report.quality renders it."""
    q = _quality_section(loaded, candidate)
    seeds = q.run_seeds
    # Recounted from the item records: the saved summary is derived data.
    sums = {
        "control": summarize(control.get("items", []), q.n_items, seeds),
        "candidate": summarize(candidate.get("items", []), q.n_items, seeds),
    }
    ctrl = {**control, "summary": sums["control"]}
    cand = {**candidate, "summary": sums["candidate"]}
    gates = [same_inputs_gate(control, candidate)]
    gates.append(arm_gates(ctrl, q.gates, "control")[0])  # the reference must be complete too
    gates += arm_gates(cand, q.gates, "candidate")
    test = None
    if q.gates.matched_misses:
        gate, test = paired_gate(ctrl, cand, seeds, q.gates)
        gates.append(gate)
    return {
        "gates": gates,
        "settings": _settings(q),
        "misses": miss_table(control, candidate, seeds[0]),
        "figures": sums,
        "seeds": seeds,
        "paired_test": test.to_dict() if test is not None else None,
        "caveat": single_seed_caveat(q.gates.alpha) if len(seeds) == 1 else None,
    }


def _settings(q: Quality) -> dict[str, Any]:
    """What the report says about the run: the items, the sampling and the strict formats."""
    sp = q.sampling
    return {
        "split": q.split,
        "first_index": q.first_index,
        "last_index": q.last_index,
        "n_items": q.n_items,
        "run_seeds": list(q.run_seeds),
        "sampling": {k: getattr(sp, k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens")},
        "strict_formats": list(q.strict_formats),
    }
