"""What of an arm's code the operator screen did not see: plain data in (the arm's env as the engine
gets it, the routes the screen ran), one line per blind spot out.

The screen (qgate.ops.screen, with the arm's overrides in place of the kernels) runs the route ops in
the harness's own process. It sees the code the engine runs for a route only when
- the route is one the screen ran (the contract's `ops.routes`): a route switched on in the arm but not
  listed there runs a kernel (or an override) that nobody screened;
- nothing on the arm's PYTHONPATH changes what the engine imports or runs around the route: a
  `sitecustomize.py` / `usercustomize.py` there runs in every engine process (it can patch vLLM, the
  plugin or the op after the screen's view), and a module or package there named like one the route
  path imports (qgate_kernels, qgate_route_env, qgate, torch, vllm) replaces it in the engine but not in
  the screen (which imported the installed one first).
- the arm's env sets nothing else otherwise than the control (a vLLM backend switch, a kernel
  library's variable): that changes code the screen does not run.
A screen with any blind spot cannot vouch for the candidate's code: the demo does not PASS on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from qgate_route_env import (
    ATTEST_DIR_ENV,
    RECORD_CALLS_ENV,
    RECORD_DIR_ENV,
    ROLES_ENV,
    ROUTES,
    override_var,
    switched_on,
)

# Python runs these at start-up from any sys.path entry (the site module), before vLLM or the plugin.
STARTUP_HOOKS = ("sitecustomize", "usercustomize")
# Env the screen accounts for (route switches and overrides, PYTHONPATH: above) or that changes no
# computation (which projections a route takes: the roles; the recording and attestation folders).
_ACCOUNTED = frozenset(
    {"PYTHONPATH", ROLES_ENV, RECORD_DIR_ENV, RECORD_CALLS_ENV, ATTEST_DIR_ENV}
    | set(ROUTES.values())
    | {override_var(r) for r in ROUTES}
)
# The packages the route path goes through: a copy of one on the arm's PYTHONPATH is what the engine
# imports, not what the screen ran.
ROUTE_PATH_PACKAGES = ("qgate_kernels", "qgate_route_env", "qgate", "torch", "vllm")


def _importable_names(entry: Path) -> set[str]:
    """The top-level module / package names a directory on sys.path provides (.py, .so, packages,
    namespace packages, .pth-less: Python reads .pth files only in site directories)."""
    names = set()
    for p in entry.iterdir():
        if p.is_dir() and p.name.isidentifier():
            names.add(p.name)
        elif p.suffix in (".py", ".pyc", ".so", ".pyd"):
            names.add(p.name.split(".", 1)[0])
    return names


def _same_copy(name: str, entry: Path) -> bool:
    """The entry provides the very copy of `name` this process imported (a source checkout on both
    paths): the screen ran it too."""
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    if where is None:
        return False
    top = Path(where).resolve().parent
    if Path(where).name == "__init__.py":
        top = top.parent
    return top == entry.resolve()


def pythonpath_blind_spots(env: Mapping[str, str]) -> list[str]:
    """One line per PYTHONPATH entry of the arm whose code the screen does not run (module docstring)."""
    out = []
    for raw in [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]:
        entry = Path(raw)
        if not entry.exists():
            continue  # nothing to import from it
        if not entry.is_dir():
            out.append(f"PYTHONPATH entry {raw} is not a directory (a zip?): its code cannot be inspected")
            continue
        try:
            names = _importable_names(entry)
        except OSError as exc:
            out.append(f"PYTHONPATH entry {raw} cannot be listed ({exc.strerror})")
            continue
        hooks = sorted(n for n in names if n in STARTUP_HOOKS)
        if hooks:
            out.append(
                f"PYTHONPATH entry {raw} holds {', '.join(hooks)}: code every engine process runs at "
                "start-up, which the screen does not run"
            )
        shadow = sorted(n for n in names if n in ROUTE_PATH_PACKAGES and not _same_copy(n, entry))
        if shadow:
            out.append(
                f"PYTHONPATH entry {raw} holds {', '.join(shadow)}: the engine imports that copy, the screen "
                "the installed one"
            )
    return out


def env_blind_spots(env: Mapping[str, str], control: Mapping[str, str]) -> list[str]:
    """One line per variable the arm sets otherwise than the control that is no route switch or
    override: it changes what vLLM runs (a backend, a kernel choice), which no operator screen runs."""
    out = []
    for key in sorted(set(env) | set(control)):
        if key in _ACCOUNTED or env.get(key) == control.get(key):
            continue
        mine = f"{key}={env[key]}" if key in env else f"{key} unset"
        theirs = f"{control[key]!r}" if key in control else "unset"
        out.append(
            f"env {mine} differs from the control's ({theirs}): not a route switch or override, and "
            "what it changes in the engine the screen does not run"
        )
    return out


def blind_spots(
    env: Mapping[str, str], screened: Iterable[str], control: Mapping[str, str] | None = None
) -> list[str]:
    """Every way the code the arm's engine runs differs from what a screen of `screened` routes ran;
    with `control` (the control arm's env), the arm's other env differences too."""
    ran = set(screened)
    out = []
    for route in ROUTES:
        if route in switched_on(env) and route not in ran:
            spec = env.get(override_var(route), "").strip()
            impl = f"its override {override_var(route)}={spec}" if spec else "its kernel"
            out.append(f"route {route} is switched on but not in ops.routes: {impl} was not screened")
    out += pythonpath_blind_spots(env)
    return out + (env_blind_spots(env, control) if control is not None else [])
