"""Start one engine child per arm launch with the arm's environment, and stream its records back.

The environment is passed as a dict to a fresh interpreter (never through a shell), so it reaches every
process vLLM spawns. Route switches and route overrides inherited from the caller's shell are removed
unless the arm sets them: an arm's routes are exactly what the contract says.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qgate.errors import RunFailure

# Inherited variables with these prefixes would switch routes behind the contract's back.
ROUTE_ENV_PREFIXES = ("VLLM_SM70_", "QGATE_ROUTE_IMPL_")


class EngineError(RunFailure, RuntimeError):
    """The engine child failed; str() is one line, the log path says where the details are."""


@dataclass(frozen=True)
class ChildOutcome:
    returncode: int
    error: str | None
    log_path: str
    dropped_env: tuple[str, ...]


def child_env(arm_env: dict[str, str], attest_dir: Path | None) -> tuple[dict[str, str], list[str]]:
    """The child's environment: the caller's, minus stray route switches, plus the arm's env."""
    env = dict(os.environ)
    dropped = sorted(k for k in env if k.startswith(ROUTE_ENV_PREFIXES) and k not in arm_env)
    for key in dropped:
        del env[key]
    env.update(arm_env)
    env["PYTHONUNBUFFERED"] = "1"
    if attest_dir is not None:
        attest_dir.mkdir(parents=True, exist_ok=True)
        env["QGATE_ATTEST_DIR"] = str(attest_dir.resolve())
    return env, dropped


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_child(
    spec: dict,
    arm_env: dict[str, str],
    log_path: Path,
    on_event: Callable[[dict], None],
    attest_dir: Path | None = None,
) -> ChildOutcome:
    """Run the engine child to the end; call on_event for every record it emits, in order."""
    env, dropped = child_env(arm_env, attest_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    error: str | None = None
    # The child runs in the caller's folder so that route overrides (package.module:function) import
    # as the user expects; a folder named like the plugin package there would shadow the installed
    # plugin in vLLM's spawned processes, so that is refused.
    if (Path.cwd() / "qgate_kernels").is_dir():
        raise EngineError(
            f"{Path.cwd() / 'qgate_kernels'} would shadow the installed route plugin in vLLM's "
            "processes: run qgate from another folder"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=log_path.parent, delete=False) as fh:
        json.dump(spec, fh)
        spec_path = fh.name
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "qgate.engine.child", spec_path, str(write_fd)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,  # its own process group: one kill reaches vLLM's children too
            )
            os.close(write_fd)
            try:
                with os.fdopen(read_fd, "r", encoding="utf-8") as events:
                    for line in events:
                        record = json.loads(line)
                        if record.get("event") == "error":
                            error = record.get("message")
                        on_event(record)
                returncode = proc.wait()
                _kill_group(proc)  # an engine process left behind would hold memory and cores
            except BaseException:
                _kill_group(proc)
                raise
    finally:
        Path(spec_path).unlink(missing_ok=True)
    if returncode != 0 and error is None:
        error = f"engine child exited with code {returncode}"
    return ChildOutcome(returncode, error, str(log_path), tuple(dropped))
