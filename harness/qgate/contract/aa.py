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

from qgate_route_env import (
    ARM_ENV_PREFIXES,
    OVERRIDE_PREFIX,
    RECORDED_ENV_PREFIXES,
    ROUTES,
    override_var,
    parse_switch,
    split_spec,
)

_SWITCHES = frozenset(ROUTES.values())
# Env that changes what code runs, beyond the route switches and overrides (issue 63): the loader
# (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...), Python's path and start-up (PYTHONPATH, PYTHONHOME,
# PYTHONSTARTUP, ...), qgate's and kernels_ext's own knobs (QGATE_*, VLLM_SM70_* other than the route
# switches and overrides), and every variable the launcher records as able to change what vLLM, torch
# or the kernels do (VLLM_* engine settings such as VLLM_ATTENTION_BACKEND, CUDA_VISIBLE_DEVICES,
# OMP_NUM_THREADS, TORCH*, TRITON_*, ...: qgate_route_env.RECORDED_ENV_PREFIXES). An arm that sets one
# apart from the other arm runs code no gate measured for what it is: the comparison's `arm env` gate
# is INCONCLUSIVE unless the contract declares the name in `code_env`.
CODE_ENV_PREFIXES = (*RECORDED_ENV_PREFIXES, *ARM_ENV_PREFIXES, "LD_", "PYTHON", "VLLM_")


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


def is_code_env(name: str) -> bool:
    """Whether an arm env name changes what code runs beyond the route switches (CODE_ENV_PREFIXES)."""
    if name in _SWITCHES or name.startswith(OVERRIDE_PREFIX):
        return False
    return name.startswith(CODE_ENV_PREFIXES)


def code_env_differences(control: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """The code-changing names (is_code_env) the two arms' env set apart: in one arm alone or to other
    values, sorted."""
    keys = set(control) | set(candidate)
    return sorted(
        k for k in keys if is_code_env(k) and control.get(k, _MISSING) != candidate.get(k, _MISSING)
    )


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
