"""One engine start of one arm (a segment of a run), for the arm spine (engine/arms.py).

Runs the child, then folds what only exists after it ends into the arm's result: the route counts the
vLLM processes wrote (summed over segments) and the inherited env variables that were dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qgate.engine.launcher import EngineError, run_child
from qgate.routes import collect, collect_shims, merge_shims


def merge_routes(total: dict, part: dict) -> dict:
    """Sum route counts {route: {hits, fallbacks: {reason: n}, roles: {role: n}}} of two segments."""
    merged = {
        k: {"hits": v["hits"], "fallbacks": dict(v["fallbacks"]), "roles": dict(v["roles"])}
        for k, v in total.items()
    }
    for route, rec in part.items():
        cur = merged.setdefault(route, {"hits": 0, "fallbacks": {}, "roles": {}})
        cur["hits"] += rec.get("hits", 0)
        for key in ("fallbacks", "roles"):
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
    try:
        outcome = run_child(spec, env, log_path, on_event, attest_dir)
    except BaseException:
        # Stopped (a signal) or a failure while records came in: the records kept on disk came from
        # this segment, so its route counts (what the processes wrote before they ended) go with them.
        if result["launches"]:
            try:
                result["routes"] = merge_routes(result["routes"], collect(attest_dir))
                result["shims"] = merge_shims(result.get("shims") or {}, collect_shims(attest_dir))
                save(result)
            except Exception:  # the stop or failure in flight is what the user must see
                pass
        raise
    result["routes"] = merge_routes(result["routes"], collect(attest_dir))
    result["shims"] = merge_shims(result.get("shims") or {}, collect_shims(attest_dir))  # never route hits
    result["dropped_env"] = sorted(set(result["dropped_env"]) | set(outcome.dropped_env))
    save(result)
    if outcome.error:
        raise EngineError(f"{label}: {outcome.error} (log: {outcome.log_path})")
    return result
