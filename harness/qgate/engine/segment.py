"""One engine start of one arm (a segment of a run), for the arm spine (engine/arms.py).

Runs the child with the arm's environment (preflight.ArmEnv, computed once per run) and records that
environment as it is, before the child starts, so a kept record of a launch that died holds it as a
finished one does: the inherited variables that can change what vLLM does (a later segment, a launch or
a resume, with other values is refused, not mixed in) and the QGATE_* / VLLM_SM70_* names dropped.
After the child, it folds in what only exists then: the route counts the vLLM processes wrote (summed
over segments).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qgate.engine.launcher import EngineError, run_child
from qgate.engine.preflight import ArmEnv
from qgate.errors import cut
from qgate.results import ResultError
from qgate.routes import RouteError, collect, collect_shims, merge_ranks, merge_shims


def merge_routes(total: dict, part: dict) -> dict:
    """Sum route counts {route: {hits, fallbacks: {reason: n}, roles: {role: n}, captures: {role: n}}}
    of two segments (a result written before captures were counted has none: zero), and, where the
    workers named their ranks, {ranks: {rank: {hits, roles, starts}}, starts} (qgate.routes.collect)."""
    merged = {
        k: {
            "hits": v["hits"],
            "fallbacks": dict(v["fallbacks"]),
            "roles": dict(v["roles"]),
            "captures": dict(v.get("captures") or {}),
        }
        | ({"ranks": merge_ranks(v["ranks"], {}), "starts": v.get("starts", 0)} if "ranks" in v else {})
        for k, v in total.items()
    }
    for route, rec in part.items():
        cur = merged.setdefault(route, {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}})
        cur["hits"] += rec.get("hits", 0)
        for key in ("fallbacks", "roles", "captures"):
            for name, n in rec.get(key, {}).items():
                cur[key][name] = cur[key].get(name, 0) + n
        if "ranks" in rec:
            cur["ranks"] = merge_ranks(cur.get("ranks") or {}, rec["ranks"])
            cur["starts"] = cur.get("starts", 0) + rec.get("starts", 0)
    return merged


def refuse_changed_env(result: dict, arm: ArmEnv, label: str) -> None:
    """A result with launches, resumed in an environment other than the one they ran with: refused
    (ResultError, one line naming each variable's value then and now). run_arms asks it of every kept
    result before the pre-flight (its children import vLLM: a minute on a GPU machine, 2026-12-05), and
    run_segment again before each engine start."""
    recorded, inherited = result.get("inherited_env"), arm.record()["inherited_env"]
    if not result["launches"] or recorded is None or recorded == inherited:
        return
    changed = sorted(k for k in set(recorded) | set(inherited) if recorded.get(k) != inherited.get(k))
    # Each value as it was and is: a PYTHONPATH that only repeats an entry reads the same to a
    # person and differently to Python (the GPU session of 2026-12-05 lost a call to one).
    said = "; ".join(
        f"{k} was {cut(repr(recorded.get(k, '<unset>')))}, now {cut(repr(inherited.get(k, '<unset>')))}"
        for k in changed
    )
    raise ResultError(
        f"{label}: the environment differs from the one the result's earlier launches ran with "
        f"(recorded under inherited_env): {said}: run from the same environment"
    )


def run_segment(
    spec: dict,
    arm: ArmEnv,
    log_path: Path,
    attest_dir: Path,
    result: dict,
    on_event: Callable[[dict], None],
    save: Callable[[dict], None],
    label: str,
) -> dict:
    """Run one engine child for `result` (updated in place by on_event); save it even when it failed."""
    refuse_changed_env(result, arm, label)
    record = arm.record()
    result["inherited_env"] = record["inherited_env"]
    # A resume from another shell may drop other names: the record keeps every launch's.
    result["dropped_env"] = sorted(set(result["dropped_env"]) | set(record["dropped_env"]))
    launches = len(result["launches"])
    try:
        outcome = run_child(spec, arm, log_path, on_event, attest_dir, spec.get("stall_timeout_s"))
    except BaseException as exc:
        # Stopped (a signal) or a failure while records came in (the engine died or stalled): the
        # records kept on disk came from this segment, so its route counts (what the processes wrote
        # before they ended) go with them.
        if result["launches"]:
            try:
                try:
                    part, shims = collect(attest_dir), collect_shims(attest_dir)
                except RouteError as err:  # an emptied file: the start's counts cannot be summed
                    if len(result["launches"]) > launches:  # and a --resume must not read as whole
                        result["launches"][-1]["attestation_lost"] = str(err)
                    part, shims = {}, {}
                result["routes"] = merge_routes(result["routes"], part)
                result["shims"] = merge_shims(result.get("shims") or {}, shims)
                save(result)
            except Exception:  # the stop or failure in flight is what the user must see
                pass
        if isinstance(exc, EngineError):  # which engine start it was
            raise EngineError(f"{label}: {exc}") from None
        raise
    lost = outcome.attestation_lost
    if lost and len(result["launches"]) > launches:  # kept with the start: a --resume cannot drop it
        result["launches"][-1]["attestation_lost"] = lost
    try:
        part, shims = collect(attest_dir), collect_shims(attest_dir)
    except RouteError:  # an emptied or cut file: said in `lost`, the start's counts are not summed
        if not lost:
            raise
        part, shims = {}, {}
    result["routes"] = merge_routes(result["routes"], part)
    result["shims"] = merge_shims(result.get("shims") or {}, shims)  # never route hits
    save(result)
    if outcome.error:
        raise EngineError(f"{label}: {outcome.error} (log: {outcome.log_path})")
    return result
