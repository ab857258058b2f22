"""An arm's environment, computed once before any engine starts (`ArmEnv`, `arm_envs`): the env its
engines see (built without side effects: no run token, no folder made), what the result records of the
caller's shell, and the check of its route switches, overrides and sites. The launcher adds only its
own variables (run token, pid file, attestation folder); segment.py records the ArmEnv as it is.

`check_overrides` refuses a route env that cannot work with one line (RouteError); when an override or
a site must be imported it does so in a child interpreter with the engine's env, the way the engine
will (`python -m qgate_kernels.overrides`). No vLLM or torch import here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from qgate.errors import RouteError
from qgate.launch_env import UNBUFFERED_ENV
from qgate.redact import redact_env
from qgate_route_env import (
    ARM_ENV_PREFIXES,
    OVERRIDE_PREFIX,
    RECORDED_ENV_PREFIXES,
    ROUTE_GDN,
    ROUTE_HC,
    ROUTE_TOPK,
    SITES_ENV,
    static_problems,
    switched_on,
)

# Routes whose sites the pre-flight check imports (GEMV's are vLLM's linear methods, always there).
SITED_ROUTES = frozenset({ROUTE_HC, ROUTE_GDN, ROUTE_TOPK})
CHECK_TIMEOUT_S = 120.0
CHECK_WORKERS = 4  # children at once: each holds an import of vLLM and torch (~1 GB)
CHECK_COMMAND = (sys.executable, "-m", "qgate_kernels.overrides")


def arm_process_env(
    environ: Mapping[str, str], arm_env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """An engine process's env from `environ`: minus qgate's and kernels_ext's variables the arm does
    not set (returned: the dropped names), plus the arm's env. Pure: the launcher adds its own
    variables (run token, pid file, attestation folder) to it."""
    env = dict(environ)
    dropped = sorted(k for k in env if k.startswith(ARM_ENV_PREFIXES) and k not in arm_env)
    for key in dropped:
        del env[key]
    env.update(arm_env)
    env[UNBUFFERED_ENV] = "1"
    return env, dropped


def inherited_env(environ: Mapping[str, str], arm_env: Mapping[str, str]) -> dict[str, str]:
    """The inherited variables that can change what vLLM, torch or the kernels do and that the arm does
    not set: what the result records (`inherited_env`) and compare checks between the arms. Secrets
    (HF_TOKEN, VLLM_API_KEY, a URL's password) are recorded redacted (qgate.redact): results are shared."""
    return redact_env(
        {
            k: environ[k]
            for k in sorted(environ)
            if k.startswith(RECORDED_ENV_PREFIXES) and not k.startswith(ARM_ENV_PREFIXES) and k not in arm_env
        }
    )


@dataclass(frozen=True)
class ArmEnv:
    """One arm's environment, computed once per run (`arm_env`) and then only read: `declared` is the
    contract's (or a derived arm's) env, `process` what every engine process of the arm starts from (the
    launcher adds only its own variables), `dropped` the inherited QGATE_* / VLLM_SM70_* names left out,
    `inherited` the inherited variables that can change what vLLM does (recorded, compared)."""

    name: str
    declared: Mapping[str, str]
    process: Mapping[str, str]
    dropped: tuple[str, ...]
    inherited: Mapping[str, str]

    def record(self) -> dict:
        """The result's fields of this env, as they are recorded (`env`, `dropped_env`, `inherited_env`)."""
        return {
            "env": dict(self.declared),
            "dropped_env": list(self.dropped),
            "inherited_env": dict(self.inherited),
        }


def arm_env(name: str, declared: Mapping[str, str], environ: Mapping[str, str]) -> ArmEnv:
    """The arm's ArmEnv from its declared env and the caller's environment (pure; checks nothing)."""
    process, dropped = arm_process_env(environ, declared)
    return ArmEnv(
        name,
        MappingProxyType(dict(declared)),
        MappingProxyType(process),
        tuple(dropped),
        MappingProxyType(inherited_env(environ, declared)),
    )


def engine_env(declared: Mapping[str, str]) -> dict[str, str]:
    """The env an engine sees: the caller's minus stray route variables, plus the arm's."""
    return dict(arm_env("", declared, os.environ).process)


def check_overrides(
    env: Mapping[str, str], cwd: Path | None = None, process: Mapping[str, str] | None = None
) -> None:
    """Refuse a route env that cannot work, before any engine starts: RouteError with one clear line.

    Checks switch values, override variable names, overrides of routes that are off, and, when an
    override is set, imports it in a child interpreter with this env and cwd (the engine's: give the
    launcher's cwd) and checks its signature against the route op's. env is the arm's env, process the
    env its engines start from (default: engine_env(env)).
    """
    _check_side_by_side([(env, process)], cwd)


def _check_side_by_side(
    arms: list[tuple[Mapping[str, str], Mapping[str, str] | None]], cwd: Path | None
) -> None:
    """(declared env, process env or None for engine_env(declared)) per arm: the children the arms need
    started together, read in order; the first arm's problem is raised, and the children still running
    then (a failing arm, a stop, the time limit) are killed, never waited for."""
    started: list[object] = []  # per arm in order: its child, None (no child needed), or its RouteError
    try:
        for declared, process in arms:
            try:
                started.append(_start_check(declared, process, cwd))
            except RouteError as exc:  # raised in its turn: the arms before it may fail first
                started.append(exc)
                break
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        for item in started:
            if isinstance(item, RouteError):
                raise item
            if isinstance(item, subprocess.Popen):
                _finish_check(item, max(0.0, deadline - time.monotonic()))
    finally:
        _reap(started)


def _needs_child(env: Mapping[str, str]) -> bool:
    """RouteError for a problem seen without importing anything; else whether a child must import."""
    problems = static_problems(env)
    if problems:
        raise RouteError(problems[0])
    sited = SITED_ROUTES & switched_on(env)
    return any(k.startswith(OVERRIDE_PREFIX) for k in env) or bool(sited) or SITES_ENV in env


def _start_check(
    declared: Mapping[str, str], process: Mapping[str, str] | None, cwd: Path | None
) -> subprocess.Popen | None:
    """The arm's checking child, started (None when nothing needs an import; RouteError as _needs_child)."""
    if not _needs_child(declared):
        return None
    env = dict(process if process is not None else engine_env(declared))
    return subprocess.Popen(
        CHECK_COMMAND, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish_check(child: subprocess.Popen, timeout: float) -> None:
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RouteError(
            f"checking the route overrides and sites took over {CHECK_TIMEOUT_S:.0f} s"
        ) from None
    _raise_child_problems(subprocess.CompletedProcess(child.args, child.returncode, out, err))


def _reap(children: Iterable[object]) -> None:
    """Kill and wait for the children still running (a failing arm, a stop, a timeout): none outlives
    the check."""
    for child in children:
        if isinstance(child, subprocess.Popen):
            if child.poll() is None:
                child.kill()
            child.communicate()


def _raise_child_problems(proc: subprocess.CompletedProcess) -> None:
    lines = proc.stdout.strip().splitlines()
    try:
        problems = json.loads(lines[-1])["problems"] if lines else None
    except (ValueError, KeyError, TypeError):
        problems = None
    if problems is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named qgate_kernels" in proc.stderr:
            tail = "qgate_kernels is not installed (pip install --no-build-isolation -e kernels_ext)"
        raise RouteError(f"cannot check the route overrides: {tail}")
    if problems:
        raise RouteError(str(problems[0]))


def check_arm_envs(envs: Iterable[ArmEnv], machine: bool = True) -> None:
    """Every check of a run that needs no engine, beyond the contract's own, over each arm's env:
    `qgate contract validate` applies it too, so a contract it passes is not refused by `qgate run`
    before an engine starts. The engine child runs in this folder, so the check does too.

    An arm's route overrides and the contract's sites are imported and checked (a child interpreter).
    `machine=False` (validate) leaves out the arms that set neither: for them the check is only whether
    this machine's vLLM has the sites of the switched-on routes (a property of the machine, not of the
    contract, and an import of vLLM: a minute on a loaded machine).

    The arms' children run side by side (each is an import of vLLM and torch: 15-20 s on the H200, where
    an ablation's arms spent 63-89 s in them one after another, 2026-12-05); the first arm's problem in
    the caller's order is the one raised, as before, and the children still running then (a failing arm,
    a stop, the time limit) are killed, never waited for."""
    todo = [
        env
        for env in envs
        if machine or any(k.startswith(OVERRIDE_PREFIX) or k == SITES_ENV for k in env.declared)
    ]
    cwd = Path.cwd()
    size = max(1, min(os.cpu_count() or 1, CHECK_WORKERS))
    for first in range(0, len(todo), size):
        _check_side_by_side([(env.declared, env.process) for env in todo[first : first + size]], cwd)


def arm_envs(
    arms: Iterable[tuple[str, Mapping[str, str]]], environ: Mapping[str, str], machine: bool = True
) -> list[ArmEnv]:
    """Every arm's ArmEnv, built once from its declared env and `environ` (the caller's, read once) and
    checked (check_arm_envs: a broken route override fails here, before any engine starts)."""
    built = [arm_env(name, declared, environ) for name, declared in arms]
    check_arm_envs(built, machine)
    return built
