"""The speed comparison: two speed results -> statistics (qgate.stats), figures and gates
(qgate.speed.gates).

`compare_speed(control, candidate, loaded)` is what `qgate compare` calls for `kind: speed` results
(qgate.compare.comparers: the one comparer signature, with the history's rows bound when a store was
given); the checks every kind shares (refuse to compare, route attestation) are run once there; the
decision over the gates is qgate.gate.decide. With one engine start per arm the decode ratio is judged
across starts only with the history's between-launch estimate (qgate.launch_cv); without it the gates
on the ratio are INCONCLUSIVE (qgate.speed.gates.across_starts).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qgate.contract import LoadedContract
from qgate.contract.speed import PROMPT_KEYS, WORKLOAD_KEYS
from qgate.launch_cv import estimate as history_estimate
from qgate.speed import gates as vd
from qgate.speed.dist_audit import summary as dist_summary
from qgate.speed.figures import arm_figures, rep_values, result_launches
from qgate.speed.repetition import summary as repetition_summary
from qgate.stats import (
    LaunchDataError,
    MetricStats,
    StatsConfig,
    compare_samples,
    error_record,
    group_by_launch,
)

# Dotted keys a speed result adds to the refuse-to-compare check (qgate.comparable.differences).
SPEED_EXTRA_KEYS = (
    "prompt.sha256",
    "prompt.seed_pinned",
    *(f"prompt.{key}" for key in PROMPT_KEYS.values()),
    *(f"workload.{key}" for key in WORKLOAD_KEYS),
)


def _rep_problem(result: dict[str, Any], field: str) -> str | None:
    """One line naming the first rep whose value is not a finite positive number, or None."""
    for i, rep in enumerate(result.get("reps") or []):
        v = rep.get(field) if isinstance(rep, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"rep {i} {field} = {v!r}: expected a finite number"
    return None


def _arm_samples(result: dict[str, Any], field: str, name: str) -> tuple[np.ndarray | None, str | None]:
    """An arm's reps of one field, launch-major (stats.group_by_launch); or None and a one-line reason."""
    problem = _rep_problem(result, field)
    if problem is not None:
        return None, f"{name} {problem}"
    reps = [rep for rep in result.get("reps") or [] if isinstance(rep, dict)]
    try:
        ids = [rep.get("launch") for rep in reps]
        return group_by_launch(rep_values(result, field), ids, result_launches(result)), None
    except LaunchDataError as exc:
        return None, f"{name} reps: {exc}"


def _compare_field(
    control: dict[str, Any],
    candidate: dict[str, Any],
    field: str,
    cfg: StatsConfig,
    higher: bool,
    between: dict[str, float] | None = None,
    critical_z: float | None = None,
) -> MetricStats:
    launches = result_launches(control)
    c, why_c = _arm_samples(control, field, "control")
    t, why_t = _arm_samples(candidate, field, "candidate")
    if c is None or t is None:
        reason = str(why_c or why_t)
        return error_record(field, reason, higher, "launch" if launches > 1 else "rep")
    return compare_samples(
        c, t, cfg, field, higher_is_better=higher, launches=launches, between=between, critical_z=critical_z
    )


def stopped_look_z(result: dict[str, Any]) -> float | None:
    """The z boundary of the look a `--until-decided` run stopped at (its `sequential` record), or None
    for a fixed-design run: compare judges the decode ratio of stopped data at that look's boundary."""
    seq = result.get("sequential")
    if not isinstance(seq, dict) or not isinstance(seq.get("looks"), list) or not seq["looks"]:
        return None
    z = (seq.get("design") or {}).get("z_boundaries")
    index = len(seq["looks"]) - 1
    if not isinstance(z, list) or index >= len(z) or not isinstance(z[index], (int, float)):
        return None
    return float(z[index])


def decode_stats(control: dict[str, Any], candidate: dict[str, Any], cfg: StatsConfig) -> MetricStats:
    """The decode tok/s comparison of two speed results (the looks of qgate.speed.sequential read it)."""
    return _compare_field(control, candidate, "decode_tok_s", cfg, True)


def _change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    change = 100.0 * (new / old - 1.0)
    return float(change) if np.isfinite(change) else None


def compare_speed(
    control: dict[str, Any],
    candidate: dict[str, Any],
    loaded: LoadedContract,
    history_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Statistics, figures and gates (qgate.gate.Gate) for two speed results. `checks`: each result's
    own soundness (complete, intact reps), which the verdict lists before the route attestation.
    history_rows (qgate.history.read_rows): with one launch per arm, the between-launch variance of the
    control estimated from them (qgate.launch_cv) goes into the decode statistics when it can be used."""
    assert loaded.contract.speed is not None
    cfg = StatsConfig.from_contract(loaded.contract.speed.stats)
    history = ttft_history = None
    if history_rows is not None and result_launches(control) == 1:
        history = history_estimate(history_rows, control)
        ttft_history = history_estimate(history_rows, control, metric="ttft")
    between = None
    if history is not None and history.used and history.rel_var is not None:
        between = {"rel_var": history.rel_var, "df": math.inf}
    critical_z = stopped_look_z(control)
    decode = _compare_field(control, candidate, "decode_tok_s", cfg, True, between, critical_z)
    ttft_between = None
    if ttft_history is not None and ttft_history.used and ttft_history.rel_var is not None:
        ttft_between = {"rel_var": ttft_history.rel_var, "df": math.inf}
    ttft = _compare_field(control, candidate, "ttft_ms", cfg, False, ttft_between)
    figs: dict[str, Any] = {
        "control": arm_figures(control),
        "candidate": arm_figures(candidate),
        "unit": decode.unit,
    }
    c, t = figs["control"], figs["candidate"]
    figs["throughput_change_pct"] = _change(t["decode_tok_s_mean"], c["decode_tok_s_mean"])
    figs["tpot_change_pct"] = _change(t["tpot_ms_mean"], c["tpot_ms_mean"])
    figs["ttft_median_change_pct"] = _change(t["ttft_ms_median"], c["ttft_ms_median"])
    figs["min_decode_tok_s"] = loaded.contract.speed.gates.min_decode_tok_s
    speed = loaded.contract.speed
    ni = vd.non_inferiority(decode, speed.gates.max_decode_regression_pct, speed)
    figs["non_inferiority"] = {**ni, "sample_size": vd.sample_size_text(ni) or None}
    seq = control.get("sequential")
    figs["sequential"] = seq if isinstance(seq, dict) else None
    figs["between_launch"] = across = vd.across_starts(decode, history, result_launches(control))
    across["ttft_history"] = None if ttft_history is None else ttft_history.to_dict()
    figs["variance_components"] = {
        arm: (None if comp is None else comp.__dict__.copy())
        for arm, comp in (("control", decode.control_components), ("candidate", decode.candidate_components))
    }
    tokens = vd.token_summary(control, candidate)
    # The audits' figures (their gates come with speed_gates): the distributions where both arms read one
    # prefix, and TEST04's repeated reps.
    top_k = speed.audit_top_k
    tokens["distributions"] = dist_summary(control, candidate, top_k) if top_k else None
    figs["repetition"] = repetition_summary(control, candidate) if speed.repeat_reps else None
    checks = [
        vd.prompts_gate(control, candidate),
        vd.completeness_gate(control, "control"),
        vd.completeness_gate(candidate, "candidate"),
        vd.integrity_gate(control, "control", loaded.contract),
        vd.integrity_gate(candidate, "candidate", loaded.contract),
    ]
    gates = [
        *vd.statistics_gates(decode, ttft),
        *vd.speed_gates(
            loaded.contract, candidate, decode, figs["ttft_median_change_pct"], tokens, across, ttft, control
        ),
    ]
    return {
        "checks": checks,
        "gates": gates,
        "stats": {"decode_tok_s": decode.to_dict(), "ttft_ms": ttft.to_dict()},
        "figures": figs,
        "tokens": tokens,
    }
