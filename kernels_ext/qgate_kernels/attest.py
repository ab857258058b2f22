"""Per-process route counters (hits, fallbacks with reasons, wired sites) and their writer.

Each vLLM process (front end, engine core, workers) that loads the route plugin counts, per route, the
calls that ran the route (hits, per layer role) and the calls that kept vLLM's own path (fallbacks, per
reason), and writes them to `$QGATE_ATTEST_DIR/<process>-<pid>.json` (the plugin passes the folder;
the variable's name is qgate_route_env.ATTEST_DIR_ENV): atomically (temp file + rename),
at most every `FLUSH_INTERVAL_S` while counting, and at exit, so that counts survive an engine shutdown
that ends a worker without running its exit handlers (at most the last interval is lost then).
qgate (harness/qgate/routes.py) merges the files of one engine start.

Under CUDA graphs a routed call runs in Python once, at capture, and its kernel runs at every replay:
so a call made while a graph is being captured (`CAPTURE`, set by qgate_kernels.graphs around
torch.cuda.CUDAGraph.capture_begin / capture_end) is noted per graph, and each replay of that graph adds
its noted calls (`Recorder.replayed`). The counts written are executions: `hits` and `roles` = eager
calls + captured calls x replays of their graph (a captured call itself runs no kernel), `captures`
the calls noted at capture per role; fallbacks likewise (`captured_fallbacks`). Without graphs (the CPU)
executions are the calls. One capture at a time per process (vLLM captures in its model thread).
A routed layer's hits are counted on its own `Tally` (one integer increment per call, no dict, lock or
clock on the hot path: issue 28); the tallies are summed into the per-role counts whenever the counts
are written, so the written counts are as exact as the per-call ones were.
A process that loaded a model (a worker: one per tensor parallel rank) writes its rank and the group's
size (`tp_rank`, `tp_size`; None in a process that loaded none), so that qgate can ask every rank for
its own hits: at TP 4 the summed counts of three ranks would hide a fourth that ran nothing.
No torch or vLLM import here (the rank is read from the modules vLLM has already loaded).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A graph's replay plan: ((kind, route, name), calls noted at its capture), ...
Plan = tuple[tuple[tuple[str, str, str], int], ...]
# 2: hits / roles / fallbacks are executions; captures, captured_fallbacks, replayed; 3: tp_rank, tp_size
SCHEMA_VERSION = 3
HIT, FALLBACK = "hit", "fallback"
# The calls counted while a CUDA graph is being captured in this process: (HIT, route, role) or
# (FALLBACK, route, reason) -> n; None when no capture is in progress (the per-call check is one read).
CAPTURE: dict[tuple[str, str, str], int] | None = None


def note_capture(kind: str, route: str, name: str, n: int = 1) -> None:
    """Note a counted call made while a graph is captured (call only when CAPTURE is not None)."""
    if CAPTURE is not None:
        key = (kind, route, name)
        CAPTURE[key] = CAPTURE.get(key, 0) + n


FLUSH_INTERVAL_S = 0.5


class Tally:
    """The hits of one routed site (route, role): the site adds 1 per call that ran the route.

    `cell`, when a site attaches one, is a one-element int64 buffer that C++ adds to (the GEMV site's
    fast entry, csrc/gemv_site.h); `n` is the Python-side count plus the cell's, so readers and resets
    see one number either way.
    """

    __slots__ = ("route", "role", "_n", "cell")

    def __init__(self, route: str, role: str) -> None:
        self.route = route
        self.role = role
        self._n = 0
        self.cell: Any = None  # indexable: cell[0] is an integer count (a torch int64 [1] tensor)

    @property
    def n(self) -> int:
        return self._n if self.cell is None else self._n + int(self.cell[0])

    @n.setter
    def n(self, value: int) -> None:
        self._n = value if self.cell is None else value - int(self.cell[0])


class Counters:
    """Counts of one process. Not thread-safe for exactness across threads; vLLM runs a model in one."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.roles: dict[str, dict[str, int]] = {}
        self.fallbacks: dict[str, dict[str, int]] = {}
        self.sites: dict[str, dict[str, int]] = {}
        self.models_loaded = 0
        self.tallies: list[Tally] = []  # per-site hits, summed into hits/roles when read
        # (kind, route, name) -> calls noted at graph captures / executions added by graph replays.
        # A key is created at capture end, so a replay only changes values (the flusher may be reading).
        self.captured: dict[tuple[str, str, str], int] = {}
        self.replayed: dict[tuple[str, str, str], int] = {}

    def hit(self, route: str, role: str) -> None:
        self.hits[route] = self.hits.get(route, 0) + 1
        per_role = self.roles.setdefault(route, {})
        per_role[role] = per_role.get(role, 0) + 1
        if CAPTURE is not None:
            note_capture(HIT, route, role)

    def fallback(self, route: str, reason: str, n: int = 1) -> None:
        per_reason = self.fallbacks.setdefault(route, {})
        per_reason[reason] = per_reason.get(reason, 0) + n
        if CAPTURE is not None:
            note_capture(FALLBACK, route, reason, n)

    def end_capture(self, noted: Mapping[tuple[str, str, str], int]) -> Plan:
        """The calls noted while one graph was captured: added to `captured`, returned as the graph's
        replay plan ((key, n), ...)."""
        for key, n in noted.items():
            self.captured[key] = self.captured.get(key, 0) + n
            self.replayed.setdefault(key, 0)
        return tuple((key, n) for key, n in noted.items() if n)

    def replay(self, plan: Plan) -> None:
        """One replay of a graph: each call noted at its capture executed once more."""
        replayed = self.replayed
        for key, n in plan:
            replayed[key] = replayed.get(key, 0) + n

    def site(self, route: str, role: str) -> None:
        per_role = self.sites.setdefault(route, {})
        per_role[role] = per_role.get(role, 0) + 1

    def tally_total(self) -> int:
        return sum(t.n for t in self.tallies)

    def routes(self, names: list[str]) -> dict[str, dict]:
        """{route: {hits, fallbacks, roles, sites, captures, captured_fallbacks, replayed}} for the given
        routes (zeros included). hits / roles / fallbacks are executions: the calls counted one by one
        plus those of the tallies, less the calls made at graph captures (no kernel ran), plus what
        the replays of those graphs ran; `replayed` is that last part per role."""
        hits = dict(self.hits)
        roles = {r: dict(per_role) for r, per_role in self.roles.items()}
        fallbacks = {r: dict(per_reason) for r, per_reason in self.fallbacks.items()}
        for t in list(self.tallies):
            n = t.n
            if n:
                hits[t.route] = hits.get(t.route, 0) + n
                per_role = roles.setdefault(t.route, {})
                per_role[t.role] = per_role.get(t.role, 0) + n
        captures: dict[str, dict[str, int]] = {}
        captured_fallbacks: dict[str, dict[str, int]] = {}
        replayed_hits: dict[str, dict[str, int]] = {}
        for (kind, route, name), n in list(self.captured.items()):
            ran = self.replayed.get((kind, route, name), 0) - n
            if kind == HIT:
                captures.setdefault(route, {})[name] = n
                replayed_hits.setdefault(route, {})[name] = ran + n
                hits[route] = hits.get(route, 0) + ran
                per_role = roles.setdefault(route, {})
                per_role[name] = per_role.get(name, 0) + ran
            else:
                captured_fallbacks.setdefault(route, {})[name] = n
                per_reason = fallbacks.setdefault(route, {})
                per_reason[name] = per_reason.get(name, 0) + ran
        return {
            r: {
                "hits": hits.get(r, 0),
                "fallbacks": {k: v for k, v in fallbacks.get(r, {}).items() if v},
                "roles": {k: v for k, v in roles.get(r, {}).items() if v},
                "sites": dict(self.sites.get(r, {})),
                "captures": captures.get(r, {}),
                "captured_fallbacks": captured_fallbacks.get(r, {}),
                "replayed": replayed_hits.get(r, {}),
            }
            for r in names
        }


def parallel_rank() -> tuple[int, int] | None:
    """(rank, size) of this process's tensor parallel group: vLLM's once it set its groups up, else
    torch.distributed's; None when neither is initialized. Reads only modules already imported."""
    ps = sys.modules.get("vllm.distributed.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        return int(ps.get_tensor_model_parallel_rank()), int(ps.get_tensor_model_parallel_world_size())
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def process_label() -> str:
    """A file-name-safe label of this process: its multiprocessing name (e.g. EngineCore_DP0) and pid."""
    name = multiprocessing.current_process().name or "process"
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{os.getpid()}"


class Recorder:
    """Counters plus a throttled atomic writer to one file of the attestation directory."""

    def __init__(self, directory: str | None, routes_on: list[str], overrides: dict[str, str]) -> None:
        self.counters = Counters()
        self.routes_on = sorted(routes_on)
        self.overrides = dict(overrides)
        self.errors: list[str] = []
        self.shims: dict[str, str] = {}  # platform shim -> what it did (qgate_kernels.shims)
        self.shim_calls: dict[str, int] = {}
        self.rank: tuple[int, int] | None = None  # (tp rank, tp size), set when this process loads a model
        self._dir = Path(directory) if directory else None
        self._path: Path | None = None
        self._dirty = True
        self._last = 0.0
        self._tallied = 0  # the tallies' total at the last write
        self._lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        atexit.register(self.flush, True)
        # A forked child (vLLM may fork its engine core) counts its own calls from zero in its own file.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        tallies = self.counters.tallies
        for t in tallies:  # the sites wired before the fork count the child's calls from zero too
            t.n = 0
        self.counters = Counters()
        self.counters.tallies = tallies
        self._tallied = 0
        self.errors = []
        self.shim_calls = {}
        self.rank = None  # the child's own, set when it loads its model
        self._lock = threading.Lock()
        self._flusher = None  # threads do not survive a fork
        self._path = None
        self._dirty = True
        self._last = 0.0
        if tallies:  # their calls touch nothing: the flusher writes them
            self._start_flusher()

    def hit(self, route: str, role: str) -> None:
        self.counters.hit(route, role)
        self._touch()

    def fallback(self, route: str, reason: str, n: int = 1) -> None:
        self.counters.fallback(route, reason, n)
        self._touch()

    def site(self, route: str, role: str) -> None:
        self.counters.site(route, role)
        self._touch()

    def tally(self, route: str, role: str) -> Tally:
        """A new per-site hit counter; the flusher thread (started here) writes its changes."""
        t = Tally(route, role)
        self.counters.tallies.append(t)
        self._touch()
        return t

    def end_capture(self, noted: Mapping[tuple[str, str, str], int]) -> Plan:
        plan = self.counters.end_capture(noted)
        self._touch()
        return plan

    def replayed(self, plan: Plan) -> None:
        """One replay of a graph whose capture noted `plan`; the flusher thread writes it."""
        self.counters.replay(plan)
        self._dirty = True

    def shim_call(self, name: str) -> None:
        """A call of a platform shim's code: counted apart from every route."""
        self.shim_calls[name] = self.shim_calls.get(name, 0) + 1
        self._touch()

    def error(self, message: str) -> None:
        self.errors.append(message)
        self.flush(True)

    def _touch(self) -> None:
        self._dirty = True
        if self._flusher is None:
            self._start_flusher()
        if time.monotonic() - self._last >= FLUSH_INTERVAL_S:
            self.flush()

    def _start_flusher(self) -> None:
        """A daemon thread writes pending counts every interval, so the last calls before a shutdown
        that kills the process (no exit handlers) are on disk too, not only those before the last count
        that happened to trigger a write."""
        if self._dir is None:
            return

        def loop() -> None:
            while True:
                time.sleep(FLUSH_INTERVAL_S)
                self.flush()

        self._flusher = threading.Thread(target=loop, name="qgate-attest", daemon=True)
        self._flusher.start()

    def snapshot(self) -> dict:
        return {
            "kind": "route_attestation",
            "schema_version": SCHEMA_VERSION,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "process": multiprocessing.current_process().name,
            "routes_on": self.routes_on,
            "overrides": self.overrides,
            "models_loaded": self.counters.models_loaded,
            "tp_rank": None if self.rank is None else self.rank[0],
            "tp_size": None if self.rank is None else self.rank[1],
            "errors": list(self.errors),
            "routes": self.counters.routes(self.routes_on),
            "shims": {
                name: {"applied": what, "calls": self.shim_calls.get(name, 0)}
                for name, what in self.shims.items()
            },
            "written_at": time.time(),
        }

    def flush(self, force: bool = False) -> None:
        """Write the counters if anything changed (always when force); never raises into the model."""
        if self._dir is None:
            return
        tallied = self.counters.tally_total()
        if not (self._dirty or force or tallied != self._tallied):
            return
        if not self._lock.acquire(blocking=force):
            return
        try:
            if self._path is None:
                self._path = self._dir / f"{process_label()}.json"
            self._dirty = False
            self._tallied = tallied
            self._last = time.monotonic()
            tmp = self._path.with_name(f".{self._path.name}.tmp")
            tmp.write_text(json.dumps(self.snapshot(), sort_keys=True), encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError:
            self._dirty = True  # retried at the next count or at exit; a full disk must not stop decode
        finally:
            self._lock.release()
