"""What two arms mean, and the A/A they make without a word (issue 45).

A contract compares a candidate against a control. Arms whose env differs only in how a switch is
spelt (`"off"` against `"0"`: both off, as the plugin reads them) run the same thing twice: an A/A,
which measures the noise and is never evidence for a change, yet `qgate compare` would judge it as a
candidate (it refuses an A/A only where the two envs are equal as text). So the contract compares the
arms by what they mean, not by their text:

- the routes switched on, each read by qgate_route_env.parse_switch (the plugin's one parser; unset is
  off), with the override each of them is sent to (`package.module:function`, as split_spec reads it);
- every other env variable as written (qgate cannot know what another program's variable means);
- the engine args each arm runs with (the shared `engine:` with the arm's overrides, engine_for).

Arms that mean the same are refused unless the contract says `aa: true`; a contract that says it
and whose arms differ is refused too. Nothing but the arms is compared: shims, sites and roles are one
setting for both arms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qgate_route_env import OVERRIDE_PREFIX, ROUTES, override_var, parse_switch, split_spec

_SWITCHES = frozenset(ROUTES.values())


def arm_meaning(env: Mapping[str, str], engine: Mapping[str, Any]) -> dict[str, Any]:
    """What one arm runs: {routes: {route: override (module, function) or None}, env: the rest of its env,
    engine: its engine args}. A switch neither on nor off counts as off (the schema refuses it first)."""
    routes: dict[str, Any] = {}
    for route, var in ROUTES.items():
        if parse_switch(env.get(var)) is True:
            spec = env.get(override_var(route))
            routes[route] = split_spec(spec) if spec is not None else None
    other = {k: v for k, v in env.items() if k not in _SWITCHES and not k.startswith(OVERRIDE_PREFIX)}
    return {"routes": routes, "env": other, "engine": dict(engine)}


def differences(control: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """What differs between two arm_meaning()s, one short phrase each, in a fixed order."""
    out = []
    for part, label in (("routes", "routes"), ("env", "env"), ("engine", "engine args")):
        a, b = control[part], candidate[part]
        keys = sorted(k for k in set(a) | set(b) if a.get(k, _MISSING) != b.get(k, _MISSING))
        if keys:
            out.append(f"{label} {', '.join(keys)}")
    return out


_MISSING = object()


def aa_problem(
    control: tuple[Mapping[str, str], Mapping[str, Any]],
    candidate: tuple[Mapping[str, str], Mapping[str, Any]],
    declared: bool,
) -> str | None:
    """One line when the arms' meaning and the contract's `aa:` disagree; else None. Each arm is (env,
    engine args)."""
    a, b = arm_meaning(*control), arm_meaning(*candidate)
    differ = differences(a, b)
    if declared and differ:
        return (
            f"aa: true declares an A/A, but the arms differ in {'; '.join(differ)}: remove `aa` to compare "
            "them, or make the arms the same"
        )
    if not declared and not differ:
        on = ", ".join(a["routes"]) or "none"
        return (
            f"arms.candidate runs what arms.control runs (routes on: {on}, with the same overrides, other "
            "env and engine args; a switch is read as on or off, however it is spelt): an A/A, never "
            "evidence for a change; switch the candidate's route on, or declare `aa: true` to run an A/A "
            "on purpose"
        )
    return None
