"""Route attestation on the harness side: the merge of the route plugin's per-process attestation files
and the gates over them.

The route plugin (kernels_ext/qgate_kernels/plugin.py) runs inside every vLLM process and writes its
counts to `$QGATE_ATTEST_DIR/<process>-<pid>.json`; `collect` merges one engine start's files into
`{route: {hits, fallbacks: {reason: n}, roles: {role: n}, captures: {role: n}}}`, the `routes` entry of a
result. Counts are executions: under CUDA graphs the plugin counts a call captured into a graph once per
replay of that graph (qgate_kernels.graphs), and `captures` says how many calls were captured per role
(none without graphs, where executions are the calls). A route the
candidate switches on must show hits, and the control must show none: otherwise the comparison would
measure something else than it claims (`attestation_gates`, which `qgate compare` turns into ERROR).
Per tensor parallel rank: each worker's file names its rank (`tp_rank`, attestation schema 3), and
`collect` keeps, beside the sums, `ranks: {rank: {hits, roles, starts}}` and the route's `starts` (the
engine starts in which some rank ran it); at TP > 1 `routes.<route>.every_rank` asks every rank of the
result's `engine_args.tensor_parallel_size` for hits, at every listed role, in each such start: the sums
of three ranks would hide a fourth that ran nothing.
The route env vocabulary is qgate_route_env's; the pre-flight of an arm's route env is
qgate.engine.preflight's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from qgate.errors import RouteError
from qgate.gate import SEV_ERROR, Gate, gate_name
from qgate_route_env import ROUTES, listed_roles, override_var, switched_on

_DOC = "docs/routes.md"
CONTROL_CLEAN = gate_name(
    "routes.control_clean", __name__, "ERROR",
    "a route ran in the control (or it has no attestation): the control is not vLLM's own path", _DOC,
)  # fmt: skip
ROUTE_RAN = gate_name(
    "routes.{route}.ran", __name__, "ERROR",
    "a route the candidate switches on had no hits (or missed a listed role, or an engine start's "
    "attestation files were not whole): the candidate did not run, or cannot show it ran, the kernel it "
    "claims", _DOC,
)  # fmt: skip
EVERY_RANK = gate_name(
    "routes.{route}.every_rank", __name__, "ERROR",
    "at tensor parallel > 1 a rank ran none of a route's calls (or missed a listed role, or sat out an "
    "engine start): the candidate did not run the kernel it claims on every rank", _DOC,
)  # fmt: skip
OFF_CLEAN = gate_name(
    "routes.off_clean", __name__, "ERROR",
    "a route this ablation arm leaves off ran: the arm is not the one planned", _DOC, shown_as="{arm}: ",
)  # fmt: skip


def _empty_route() -> dict:
    return {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}}


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for key, n in counts.items():
        into[str(key)] = into.get(str(key), 0) + int(n)


def collect(attest_dir: Path) -> dict:
    """Merge one engine start's attestation files: {route: {hits, fallbacks, roles}}, every route listed.

    A file that cannot be read is an error (RouteError), never silently skipped: a lost worker file
    would hide hits, or hide the control's. A process whose plugin failed counts `plugin_error`.
    """
    merged = {route: _empty_route() for route in ROUTES}
    attest_dir = Path(attest_dir)
    if not attest_dir.is_dir():
        return merged
    for path in sorted(attest_dir.glob("*.json")):
        data = _read(path)
        routes, rank = data["routes"], _file_rank(data)
        if data.get("errors"):
            # The plugin failed in that process (its message is in the engine log and in the file):
            # every route it had on counts it, so no gate can mistake the failure for a clean run.
            for route in data.get("routes_on", []):
                _add(merged.setdefault(route, _empty_route())["fallbacks"], {"plugin_error": 1})
        for route, counts in routes.items():
            into = merged.setdefault(route, _empty_route())
            into["hits"] += int(counts.get("hits", 0))
            _add(into["fallbacks"], counts.get("fallbacks", {}))
            _add(into["roles"], counts.get("roles", {}))
            _add(into.setdefault("captures", {}), counts.get("captures", {}))
            if rank is not None:
                per_rank = into.setdefault("ranks", {}).setdefault(str(rank), {"hits": 0, "roles": {}})
                per_rank["hits"] += int(counts.get("hits", 0))
                _add(per_rank["roles"], counts.get("roles", {}))
    for into in merged.values():
        if "ranks" in into:  # one engine start: each rank ran the route in it or not
            for per_rank in into["ranks"].values():
                per_rank["starts"] = int(per_rank["hits"] > 0)
            into["starts"] = int(any(r["starts"] for r in into["ranks"].values()))
    return merged


def _read(path: Path) -> dict:
    """One process's attestation file, or RouteError naming it (an emptied file says so)."""
    try:
        text = path.read_text(encoding="utf-8")
        if not text:
            raise ValueError("the file is empty (0 bytes)")
        data = json.loads(text)
        if not isinstance(data.get("routes"), dict):
            raise KeyError("routes")
        _file_rank(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RouteError(f"{path}: unreadable route attestation ({type(exc).__name__}: {exc})") from None
    return data


def not_whole(attest_dir: Path, tp_size: int, stages: int = 1, since: float | None = None) -> str | None:
    """Why one finished engine start's attestation files do not hold all of its counts, or None.

    The sums of `collect` cannot tell a lost file from a process that counted nothing: with a route on,
    every process that loads the model (one per tensor parallel rank and pipeline stage: `stages`)
    writes a file naming its rank of `tp_size` (schema 3; `models_loaded` in older files), and a rank
    with none, or with two (another start's file), leaves the sums short or doubled. A file emptied or
    cut short, and one written before the start began (`since`, a time.time()), are named too. One line.
    """
    paths = sorted(Path(attest_dir).glob("*.json")) if Path(attest_dir).is_dir() else []
    problems: list[str] = []
    loaders: list[tuple[str, dict]] = []
    ranked = True  # every file names its process's rank (schema 3), the model loaders' or None
    for path in paths:
        try:
            data = _read(path)
        except RouteError as exc:
            problems.append(str(exc).replace(f"{path}: ", f"{path.name}: ", 1))
            continue
        ranked = ranked and int(data.get("schema_version") or 0) >= 3
        written = data.get("written_at")
        if since is not None and isinstance(written, (int, float)) and written < since:
            problems.append(f"{path.name}: written before this engine start began (another start's file)")
        elif int(data.get("models_loaded") or 0) > 0:
            loaders.append((path.name, data))
    if ranked:
        by_rank: dict[object, list[str]] = {}
        for name, d in loaders:
            if d.get("tp_size") != tp_size:
                problems.append(f"{name}: rank {d.get('tp_rank')} of tensor parallel {d.get('tp_size')}, "
                                f"the engine's is {tp_size}")  # fmt: skip
            else:
                by_rank.setdefault(d.get("tp_rank"), []).append(name)
        for rank in range(tp_size):
            names = by_rank.get(rank, [])
            if len(names) < stages:
                of = f" ({len(names)} of {stages} pipeline stages)" if stages > 1 else ""
                problems.append(f"no file of tensor parallel rank {rank} of {tp_size}{of}")
            elif len(names) > stages:
                problems.append(f"rank {rank} in {len(names)} files ({', '.join(names)})")
    elif len(loaders) != tp_size * stages:  # a plugin older than schema 3: count the loaders
        problems.append(
            f"{len(loaders)} files of processes that loaded the model, the engine has {tp_size * stages}"
        )
    if not problems:
        return None
    return (
        f"the route attestation of this engine start in {attest_dir} is not whole: {'; '.join(problems)}: "
        "its route counts would be short or another start's (a lost or emptied worker file?)"
    )


def _file_rank(data: dict) -> int | None:
    """The tensor parallel rank of a process that loaded a model (schema 3); None for one that loaded
    none (the front end, the engine core) and for files written before ranks were recorded."""
    rank = data.get("tp_rank")
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"tp_rank {rank!r} is not a rank")
    return rank


def merge_ranks(total: dict, part: dict) -> dict:
    """Sum the per-rank counts {rank: {hits, roles, starts}} of two engine starts of one arm."""
    merged = {
        r: {"hits": v["hits"], "roles": dict(v["roles"]), "starts": v["starts"]} for r, v in total.items()
    }
    for rank, counts in part.items():
        into = merged.setdefault(rank, {"hits": 0, "roles": {}, "starts": 0})
        into["hits"] += int(counts.get("hits", 0))
        into["starts"] += int(counts.get("starts", 0))
        _add(into["roles"], counts.get("roles", {}))
    return merged


def collect_shims(attest_dir: Path) -> dict:
    """The platform shims of one engine start: {shim: {applied: what it did, calls: n}} summed over the
    vLLM processes (every process of both arms applies the same shims; calls happen in the worker)."""
    merged: dict[str, dict] = {}
    attest_dir = Path(attest_dir)
    if not attest_dir.is_dir():
        return merged
    for path in sorted(attest_dir.glob("*.json")):
        try:
            shims = json.loads(path.read_text(encoding="utf-8")).get("shims") or {}
        except (OSError, ValueError, AttributeError) as exc:
            raise RouteError(f"{path}: unreadable route attestation ({type(exc).__name__}: {exc})") from None
        for name, info in shims.items():
            into = merged.setdefault(name, {"applied": info.get("applied", ""), "calls": 0})
            into["calls"] += int(info.get("calls", 0))
    return merged


def merge_shims(total: dict, part: dict) -> dict:
    """Sum the shim calls of two engine starts of one arm."""
    merged = {k: dict(v) for k, v in total.items()}
    for name, info in part.items():
        into = merged.setdefault(name, {"applied": info.get("applied", ""), "calls": 0})
        into["calls"] += int(info.get("calls", 0))
    return merged


def _fmt(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def attestation_gates(control: dict, candidate: dict) -> list[Gate]:
    """ERROR-class gates proving the arms ran what their env says (a failed one means ERROR):

    - routes.control_clean: no route has hits in the control.
    - routes.<route>.ran: each route the candidate's env switches on has hits in the candidate.
    A result without `routes` fails the gates that need it.
    """
    gates = []
    ctrl_routes = control.get("routes")
    if not isinstance(ctrl_routes, dict):
        gates.append(_gate(CONTROL_CLEAN(), False, "the control result has no route attestation"))
    else:
        hot = {r: v.get("hits", 0) for r, v in ctrl_routes.items() if v.get("hits", 0) > 0}
        detail = f"control hits: {_fmt(hot)}" if hot else "no route ran in the control"
        gates.append(_gate(CONTROL_CLEAN(), not hot, detail))
    return gates + ran_gates(candidate)


def ran_gates(result: dict) -> list[Gate]:
    """routes.<route>.ran: each route the result's env switches on has hits in the result, at every role
    the contract lists for it (QGATE_ROUTE_ROLES in the result's env); at tensor parallel > 1 (the
    result's engine_args) routes.<route>.every_rank: the same of every rank, in every engine start."""
    gates = []
    rec = result.get("routes")
    env = result.get("env", {})
    try:
        listed = listed_roles(env)
        tp = _tp_size(result)
    except ValueError as exc:  # a result whose roles or TP size cannot be read proves nothing about them
        return [_gate(ROUTE_RAN(route=route), False, str(exc)) for route in sorted(switched_on(env))]
    lost = _lost_starts(result)
    for route in sorted(switched_on(env)):
        name = ROUTE_RAN(route=route)
        if not isinstance(rec, dict):
            gates.append(_gate(name, False, "the candidate result has no route attestation"))
            continue
        if lost:  # the sums miss (or double) an engine start's counts: they prove nothing whole
            gates.append(_gate(name, False, lost))
            continue
        gate = _route_ran_gate(name, route, rec.get(route, _empty_route()), listed.get(route, []))
        spec = (result.get("env") or {}).get(override_var(route))
        if spec and gate.passed:  # every hit of an overridden route ran the override, not qgate's kernel
            gate = Gate(
                gate.name,
                True,
                f"{gate.detail}; every hit ran the override {override_var(route)}={spec}",
                gate.severity,
            )
        gates.append(gate)
        if tp > 1:
            counts = rec.get(route) or {}
            gates.append(_every_rank_gate(EVERY_RANK(route=route), counts, tp, listed.get(route, [])))
    return gates


def _lost_starts(result: dict) -> str | None:
    """The engine starts whose attestation files were not whole (the launcher's `attestation_lost` on
    the start's `launches` entry: routes.not_whole), in one line; None when every start's were."""
    lost = [
        f"engine start {launch.get('segment', i)}: {launch['attestation_lost']}"
        for i, launch in enumerate(result.get("launches") or [])
        if isinstance(launch, dict) and launch.get("attestation_lost")
    ]
    if not lost:
        return None
    more = f" (and {len(lost) - 1} more engine starts)" if len(lost) > 1 else ""
    return lost[0] + more


def _tp_size(result: dict) -> int:
    """The result's tensor parallel size (its engine args; 1 when unset, vLLM's default)."""
    tp = (result.get("engine_args") or {}).get("tensor_parallel_size", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"engine_args.tensor_parallel_size {tp!r} is not a size")
    return tp


def _every_rank_gate(name: str, counts: dict, tp: int, listed: list[str]) -> Gate:
    """Each rank 0..tp-1 has hits, at every listed role, in every engine start in which any rank had
    them: a worker whose plugin did not run, or whose every call fell back, fails here even when the
    other ranks' hits pass routes.<route>.ran."""
    ranks = counts.get("ranks")
    if not isinstance(ranks, dict) or not ranks:
        return _gate(
            name,
            False,
            f"no per-rank attestation at tensor parallel {tp}: no worker file named its rank (a plugin "
            "older than attestation schema 3, or no worker wrote one)",
        )
    starts = int(counts.get("starts", 0))
    problems = []
    for rank in range(tp):
        got = ranks.get(str(rank)) or {}
        idle = [r for r in listed if int((got.get("roles") or {}).get(r, 0)) == 0]
        if int(got.get("hits", 0)) == 0:
            problems.append(f"rank {rank}: no hits" + ("" if got else " (no worker file named this rank)"))
        elif int(got.get("starts", 0)) < starts:
            problems.append(f"rank {rank}: hits in {got.get('starts', 0)} of the {starts} engine starts")
        elif idle:
            problems.append(f"rank {rank}: listed roles without hits: {', '.join(idle)}")
    extra = sorted(r for r in ranks if not r.isdigit() or int(r) >= tp)
    if extra:
        problems.append(f"ranks {', '.join(extra)} reported beyond tensor parallel {tp}")
    order = sorted(ranks.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1)
    hits = ", ".join(f"rank {r}: {int(v.get('hits', 0))}" for r, v in order)
    if problems:
        return _gate(name, False, f"{'; '.join(problems)} (hits {hits})")
    return _gate(name, True, f"every rank of {tp} ran it in each of {starts} engine starts (hits {hits})")


def off_clean_gate(result: dict) -> Gate:
    """routes.off_clean: no route the result's env leaves off shows hits (an arm of an ablation)."""
    rec = sub if isinstance(sub := result.get("routes"), dict) else {}
    on = switched_on(result.get("env") or {})
    hot = {r: int(v.get("hits", 0)) for r, v in rec.items() if r not in on and int(v.get("hits", 0)) > 0}
    detail = "hits in routes switched off: " + ", ".join(f"{r}: {n}" for r, n in sorted(hot.items()))
    return _gate(OFF_CLEAN(), not hot, detail if hot else "no route that is off ran")


def _route_ran_gate(name: str, route: str, counts: dict, listed: list[str]) -> Gate:
    """Hits, and when the contract lists the route's roles, hits at every listed role."""
    hits = int(counts.get("hits", 0))
    fallbacks = counts.get("fallbacks", {})
    roles = counts.get("roles", {})
    idle = [r for r in listed if int(roles.get(r, 0)) == 0]
    if hits > 0 and idle:
        return _gate(
            name,
            False,
            f"listed roles without hits: {', '.join(idle)}; hits: {_fmt(roles)}; "
            f"fallbacks: {_fmt(fallbacks)}",
        )
    if hits > 0:
        return _gate(
            name, True, f"{hits} hits ({_fmt(counts.get('roles', {}))}); fallbacks: {_fmt(fallbacks)}"
        )
    captured = sum(int(n) for n in (counts.get("captures") or {}).values())
    if captured:
        detail = (
            f"{ROUTES[route]} is on and {captured} calls were captured into CUDA graphs "
            f"({_fmt(counts.get('captures') or {})}), but no replay ran them; fallbacks: {_fmt(fallbacks)}"
        )
    elif not fallbacks:
        detail = (
            f"{ROUTES[route]} is on but no vLLM process recorded a call: the route plugin did not run "
            "(kernels_ext not installed, plugin failed to import, VLLM_PLUGINS excludes qgate_routes, "
            "or QGATE_ATTEST_DIR unset; see the engine log)"
        )
    elif "plugin_error" in fallbacks:
        detail = f"{ROUTES[route]} is on but the route plugin failed (see the engine log): {_fmt(fallbacks)}"
    elif "no_site_in_model" in fallbacks:
        detail = f"{ROUTES[route]} is on but no layer of the model can take it; fallbacks: {_fmt(fallbacks)}"
    else:
        detail = f"{ROUTES[route]} is on but every call fell back: {_fmt(fallbacks)}"
    return _gate(name, False, detail)


def _gate(name: str, passed: bool, detail: str) -> Gate:
    # ERROR-class: a route that did not provably run (or ran where it should not) voids the comparison.
    return Gate(name, passed, detail, SEV_ERROR)


def route_summary(result: dict) -> list[dict]:
    """One row of plain data per route (route, env var, switched on, hits, total fallbacks, hits by
    role and fallbacks by reason as mappings, calls captured into CUDA graphs in all and by role); hits
    are executions (a captured call counts once per replay); report/ renders it. Stored in ablation
    records."""
    routes = result.get("routes") or {}
    on = switched_on(result.get("env", {}))
    rows = []
    for route, var in ROUTES.items():
        counts = routes.get(route, _empty_route())
        fallbacks = {str(k): int(n) for k, n in (counts.get("fallbacks") or {}).items()}
        captures = {str(k): int(n) for k, n in (counts.get("captures") or {}).items()}
        rows.append(
            {
                "route": route,
                "env": var,
                "switched_on": route in on,
                "hits": int(counts.get("hits", 0)),
                "fallbacks": sum(fallbacks.values()),
                "roles": {str(k): int(n) for k, n in (counts.get("roles") or {}).items()},
                "fallback_reasons": fallbacks,
                "captures": sum(captures.values()),
                "captures_by_role": captures,
            }
        )
    return rows
