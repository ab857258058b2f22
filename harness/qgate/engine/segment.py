"""One engine start of one arm (a segment of a run), for the arm spine (engine/arms.py).

Runs the child, then folds what only exists after it ends into the arm's result: the route counts the
vLLM processes wrote (summed over segments). The inherited env variables the launch drops are recorded
before it starts, so a kept record of a launch that died lists them as a finished one does. The
inherited variables that can change what vLLM does (launcher.inherited_env) are recorded before the
child starts; a later segment (a launch, a resume) with other values is refused, not mixed in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from qgate.engine.launcher import EngineError, inherited_env, run_child
from qgate.engine.preflight import arm_process_env
from qgate.results import ResultError
from qgate.routes import collect, collect_shims, merge_shims


def merge_routes(total: dict, part: dict) -> dict:
    """Sum route counts {route: {hits, fallbacks: {reason: n}, roles: {role: n}, captures: {role: n}}}
    of two segments (a result written before captures were counted has none: zero)."""
    merged = {
        k: {
            "hits": v["hits"],
            "fallbacks": dict(v["fallbacks"]),
            "roles": dict(v["roles"]),
            "captures": dict(v.get("captures") or {}),
        }
        for k, v in total.items()
    }
    for route, rec in part.items():
        cur = merged.setdefault(route, {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}})
        cur["hits"] += rec.get("hits", 0)
        for key in ("fallbacks", "roles", "captures"):
            for name, n in rec.get(key, {}).items():
                cur[key][name] = cur[key].get(name, 0) + n
    return merged


def run_segment(
    spec: dict,
    env: dict[str, str],
    log_path: Path,
    attest_dir: Path,
    result: dict,
    on_event: Callable[[dict], None],
    save: Callable[[dict], None],
    label: str,
) -> dict:
    """Run one engine child for `result` (updated in place by on_event); save it even when it failed."""
    inherited = inherited_env(dict(os.environ), env)
    recorded = result.get("inherited_env")
    if result["launches"] and recorded is not None and recorded != inherited:
        changed = sorted(k for k in set(recorded) | set(inherited) if recorded.get(k) != inherited.get(k))
        raise ResultError(
            f"{label}: the environment differs from the one the result's earlier launches ran with in "
            f"{', '.join(changed)} (recorded under inherited_env): run from the same environment"
        )
    result["inherited_env"] = inherited
    # The names the launch drops are known before it starts: a killed launch's kept record lists them
    # as a finished one's does (issue 39: they were added only after the child ended well).
    _, dropped = arm_process_env(dict(os.environ), env)
    result["dropped_env"] = sorted(set(result["dropped_env"]) | set(dropped))
    try:
        outcome = run_child(spec, env, log_path, on_event, attest_dir, spec.get("stall_timeout_s"))
    except BaseException as exc:
        # Stopped (a signal) or a failure while records came in (the engine died or stalled): the
        # records kept on disk came from this segment, so its route counts (what the processes wrote
        # before they ended) go with them.
        if result["launches"]:
            try:
                result["routes"] = merge_routes(result["routes"], collect(attest_dir))
                result["shims"] = merge_shims(result.get("shims") or {}, collect_shims(attest_dir))
                save(result)
            except Exception:  # the stop or failure in flight is what the user must see
                pass
        if isinstance(exc, EngineError):  # which engine start it was
            raise EngineError(f"{label}: {exc}") from None
        raise
    result["routes"] = merge_routes(result["routes"], collect(attest_dir))
    result["shims"] = merge_shims(result.get("shims") or {}, collect_shims(attest_dir))  # never route hits
    result["dropped_env"] = sorted(set(result["dropped_env"]) | set(outcome.dropped_env))
    save(result)
    if outcome.error:
        raise EngineError(f"{label}: {outcome.error} (log: {outcome.log_path})")
    return result
