"""A decode-step timeline per arm: which kernels the candidate adds, removes or slows.

The timelines come from tools/gpu_engine/profile_decode.py, run on a GPU: one `<arm>.json` per arm
in a folder (beside it `<arm>.args.json`, the profiler's own input, and text files, which are not read
here). Each holds the per-step summary of one profiled generate() (GPU busy time, the kernels' wall
span, the host gaps between them, graph and eager launches), every kernel's calls and GPU us per
decode step, the runtime-API calls and the qgate ops seen on the host.

`read_timeline(folder)` checks every file before believing it (as results are checked: a regular
file within a size bound, a UTF-8 JSON object, finite non-negative figures, kernel names that are
non-empty strings; bad input is a TimelineError, one line naming the file, the key and the value) and
returns an immutable record (kind `timeline`): per arm the summary, and for each arm against the
control the kernels it adds, removes or changes most, with the totals over every kernel of the files.

Where a profile holds one decode graph replay's kernels in order (`graph_step`, profile_decode.py
since timeline schema 2), each arm's replay is aligned with the control's (difflib over the kernel
names): the stretches that differ are where the routes replaced vLLM's kernels, and each stretch's time
counts the gaps between its kernels, which a fused kernel saves and a sum of kernel times cannot show.
A stretch is named by the routes of the kernels_ext kernels in it (qgate_route_env.kernel_route).
Per kernel name the replay's early starts (timeline schema 4) say how much of a kernel's time it spent
started before an earlier kernel ended: under PDL a wait the profiler counts as the kernel's own.

`match_arms` ties the profiles to the arms of what embeds the record: `qgate ablate --timeline` (the
ablation record's `timeline`) or `qgate compare --timeline` (the verdict record's).

Not a gate: under torch.profiler every launch is recorded on the host, so both arms become host-bound
and its microseconds are not the speed gate's figures; the arms are compared with each other only.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from qgate.errors import cut
from qgate.results import ResultError, current_schema, read_object
from qgate_route_env import SHIMS_ENV, SM70_PREFIX, kernel_route

TIMELINE_SCHEMA_VERSION = current_schema("timeline")
TOP_N = 12  # kernel and runtime-API rows kept per arm: the changes that make up most of the delta
MAX_PROFILE_BYTES = 16 * 1024 * 1024  # a profile of a few thousand kernels is well under 1 MiB
MAX_ARMS = 64  # more than a full factorial of 5 factors (32 arms)
MAX_NAMES = 100_000  # kernels (or API calls, ops) in one file
MAX_NAME_CHARS = 8192  # a C++ template kernel name can run to a few thousand characters
# kernels of one decode graph replay (graph_step): the 12-layer production shapes run ~700 and all 48
# layers would run ~3,000; the alignment (difflib) grows with the square of it in the worst case
MAX_REPLAY_KERNELS = 10_000
VLLM_ONLY = "vLLM's kernels"  # a differing stretch without a kernels_ext kernel on either side
_ARM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
# The per-step summary every profile holds; the rest (runtime_api, qgate_ops, device, ...) is optional:
# the H200 profile of 2026-12-04 came back as its diff only (tests/fixtures/timeline/README.md).
SUMMARY = (
    "gpu_busy_us_per_step",
    "kernel_span_us_per_step",
    "host_gap_us_per_step",
    "graph_launches_per_step",
    "eager_kernel_launches_per_step",
)
TABLES = ("kernels", "runtime_api", "qgate_ops")  # name -> {per_step, us_per_step}
OPTIONAL_NUMBERS = ("engine_start_s", "wall_s_under_profiler")
OPTIONAL_STRINGS = ("device", "torch_version")
# The arm env the profiler's child ran with, as profile_decode.py records it (arm_env_routes): the
# variables of these prefixes only.
ENV_PREFIXES = (SM70_PREFIX, SHIMS_ENV)
# The profiler rounds nothing, the H200 diff rounded to 0.01 us: the host gap is the span less the
# busy time up to that rounding (a file whose three figures disagree was edited or mislabelled).
GAP_TOLERANCE_US = 0.05
# What match_arms ties the profiles to: `qgate ablate`'s arms, `qgate compare`'s two (`<of>_arms`)
MATCHED_BY = ("ablation", "comparison")


class TimelineError(ResultError):
    """A profile folder or file that cannot be used; str() is one line naming the file, key and value."""


def _freeze(value: Any) -> Any:
    """A read-only view of plain data (dicts become mappingproxies, lists tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain JSON data again from a frozen record (for json.dumps, or a record to embed)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def _number(path: Path, key: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise TimelineError(f"{path}: {key} = {cut(repr(value))}: expected a finite number >= 0")
    return float(value)


def _printable(name: Any) -> bool:
    """A kernel (or API call, op) name a report can show: a non-empty printable string of bounded size."""
    return isinstance(name, str) and bool(name.strip()) and len(name) <= MAX_NAME_CHARS and name.isprintable()


def _table(path: Path, key: str, value: Any) -> dict[str, dict[str, float]]:
    if not isinstance(value, dict):
        raise TimelineError(f"{path}: {key} = {cut(repr(value))}: expected an object of name -> figures")
    if len(value) > MAX_NAMES:
        raise TimelineError(f"{path}: {key} has {len(value)} names, more than a profile can ({MAX_NAMES})")
    out = {}
    for name, row in value.items():
        if not _printable(name):
            raise TimelineError(f"{path}: {key} name {cut(repr(name))}: expected a printable kernel name")
        where = f"{key}.{cut(name, 60)}"
        if not isinstance(row, dict) or set(row) < {"per_step", "us_per_step"}:
            raise TimelineError(f"{path}: {where} = {cut(repr(row))}: expected {{per_step, us_per_step}}")
        out[name] = {k: _number(path, f"{where}.{k}", row[k]) for k in ("per_step", "us_per_step")}
    return out


def _graph_step(path: Path, value: Any) -> dict[str, Any]:
    """profile_decode.py's graph_step checked: {names, seq: (name index, start us, duration us), ...}."""
    if not isinstance(value, dict) or not isinstance(value.get("names"), list):
        raise TimelineError(f"{path}: graph_step = {cut(repr(value))}: expected {{names, seq}}")
    names, seq = value["names"], value.get("seq")
    if len(names) > MAX_NAMES or not isinstance(seq, list) or not seq or len(seq) > MAX_REPLAY_KERNELS:
        raise TimelineError(
            f"{path}: graph_step.seq = {cut(repr(seq))}: expected 1 to {MAX_REPLAY_KERNELS} kernels"
        )
    for name in names:
        if not _printable(name):
            raise TimelineError(
                f"{path}: graph_step.names {cut(repr(name))}: expected a printable kernel name"
            )
    rows = []
    for i, row in enumerate(seq):
        ok = isinstance(row, list) and len(row) == 3 and type(row[0]) is int and 0 <= row[0] < len(names)
        if not ok:
            raise TimelineError(
                f"{path}: graph_step.seq[{i}] = {cut(repr(row))}: expected [name index, start, duration]"
            )
        rows.append((row[0], _number(path, f"graph_step.seq[{i}][1]", row[1]),
                     _number(path, f"graph_step.seq[{i}][2]", row[2])))  # fmt: skip
    return {"names": tuple(names), "seq": tuple(sorted(rows, key=lambda r: r[1]))}


def check_profile(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """One arm's profile as plain data, every figure checked; TimelineError names the key otherwise."""
    for key in (*SUMMARY, "tokens", "kernels"):
        if key not in data:
            raise TimelineError(f"{path}: no {key!r}: not a profile_decode.py record")
    tokens = data["tokens"]
    if type(tokens) is not int or tokens < 1:
        raise TimelineError(f"{path}: tokens = {cut(repr(tokens))}: expected a whole number >= 1")
    out: dict[str, Any] = {"tokens": tokens}
    out.update({k: _number(path, k, data[k]) for k in SUMMARY})
    for key in OPTIONAL_NUMBERS:
        out[key] = None if data.get(key) is None else _number(path, key, data[key])
    for key in OPTIONAL_STRINGS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise TimelineError(f"{path}: {key} = {cut(repr(value))}: expected a string")
        out[key] = value
    for key in TABLES:
        out[key] = _table(path, key, data[key]) if data.get(key) is not None else None
    env = data.get("arm_env_routes")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(v, str) for v in env.values()) and len(env) <= MAX_NAMES
    ):
        raise TimelineError(
            f"{path}: arm_env_routes = {cut(repr(env))}: expected an object of name -> string"
        )
    out["arm_env_routes"] = env
    out["graph_step"] = None if data.get("graph_step") is None else _graph_step(path, data["graph_step"])
    gap = out["kernel_span_us_per_step"] - out["gpu_busy_us_per_step"]
    if abs(gap - out["host_gap_us_per_step"]) > GAP_TOLERANCE_US + 1e-6 * out["kernel_span_us_per_step"]:
        raise TimelineError(
            f"{path}: host_gap_us_per_step = {out['host_gap_us_per_step']!r} is not kernel_span_us_per_step"
            f" - gpu_busy_us_per_step ({gap:.2f}): not a profile_decode.py record"
        )
    return out


def profile_files(folder: Path) -> dict[str, Path]:
    """arm -> its profile file: every `<arm>.json` in the folder but the profiler's `<arm>.args.json`
    inputs and hidden files (a temp file mid-write)."""
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        raise TimelineError(f"{folder}: no such timeline folder") from None
    except NotADirectoryError:
        raise TimelineError(
            f"{folder}: not a folder: --timeline names profile_decode.py's output folder"
        ) from None
    except OSError as exc:
        raise TimelineError(f"{folder}: cannot be read ({exc.strerror or exc})") from None
    files = {}
    for p in entries:
        if p.suffix != ".json" or p.name.startswith(".") or p.name.endswith(".args.json"):
            continue
        if not _ARM.match(p.stem):
            raise TimelineError(f"{p}: {cut(repr(p.stem))} cannot be an arm's name")
        files[p.stem] = p
    if "control" not in files:
        raise TimelineError(f"{folder}: no control.json: the timeline compares every arm with the control")
    if len(files) < 2:
        raise TimelineError(f"{folder}: control.json only: no arm to compare with it")
    if len(files) > MAX_ARMS:
        raise TimelineError(
            f"{folder}: {len(files)} profile files, more than an ablation has arms ({MAX_ARMS})"
        )
    return files


def _row(name: str, ref: Mapping[str, float] | None, arm: Mapping[str, float] | None) -> dict[str, Any]:
    zero = {"per_step": 0.0, "us_per_step": 0.0}
    a, b = ref or zero, arm or zero
    change = "added" if ref is None else "removed" if arm is None else "changed"
    return {
        "name": name,
        "change": change,
        "control": None if ref is None else dict(ref),
        "arm": None if arm is None else dict(arm),
        "delta_calls_per_step": b["per_step"] - a["per_step"],
        "delta_us_per_step": b["us_per_step"] - a["us_per_step"],
    }


def table_changes(ref: Mapping[str, Any], arm: Mapping[str, Any], top: int) -> dict[str, Any]:
    """The rows of one table (kernels, runtime API) that differ, largest |delta us per step| first, top
    `top` kept, with the totals over all of them by kind of change (added, removed, changed)."""
    rows = [
        _row(n, ref.get(n), arm.get(n))
        for n in sorted(set(ref) | set(arm))
        if ref.get(n) != arm.get(n)  # equal calls and time in both arms: not a change
    ]
    rows.sort(key=lambda r: (-abs(r["delta_us_per_step"]), r["name"]))
    totals = {}
    for change in ("added", "removed", "changed"):
        these = [r for r in rows if r["change"] == change]
        totals[change] = {
            "count": len(these),
            "delta_us_per_step": sum((r["delta_us_per_step"] for r in these), 0.0),
            "delta_calls_per_step": sum((r["delta_calls_per_step"] for r in these), 0.0),
        }
    return {"rows": rows[:top], "shown": min(top, len(rows)), "differing": len(rows), "totals": totals}


def summary(p: Mapping[str, Any]) -> dict[str, Any]:
    """An arm's per-step figures, for the report's summary table."""
    keys = (
        "tokens",
        *SUMMARY,
        "device",
        "torch_version",
        "engine_start_s",
        "wall_s_under_profiler",
        "arm_env_routes",
    )
    out = {k: p[k] for k in keys}
    out["kernels_named"] = None if p["kernels"] is None else len(p["kernels"])
    g = p.get("graph_step")
    out["graph_kernels"] = None if g is None else len(g["seq"])
    out["graph_span_us"] = None if g is None else _side(g["seq"], 0, len(g["seq"]))["span_us"]
    return out


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The time some interval (start, end) covers, overlaps counted once: the GPU's busy time from its
    kernels (profile_decode.py's per-step figure, and a stretch's here)."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy


def _side(seq: Sequence[tuple[int, float, float]], i: int, j: int) -> dict[str, Any]:
    """Kernels i..j-1 of a replay: how many, their wall span (gaps between them included) and the
    time some kernel of them ran (their busy time)."""
    if j <= i:
        return {"kernels": 0, "span_us": 0.0, "busy_us": 0.0}
    part = [(a, a + d) for _, a, d in seq[i:j]]
    return {"kernels": j - i, "span_us": max(b for _, b in part) - part[0][0], "busy_us": busy_us(part)}


def _label(names: Sequence[str]) -> str:
    """A differing stretch by the routes of its kernels_ext kernels (arm side first, then control)."""
    routes = sorted({r for r in map(kernel_route, names) if r is not None})
    return "+".join(routes) if routes else VLLM_ONLY


def stretches(ref: Mapping[str, Any], arm: Mapping[str, Any]) -> dict[str, Any]:
    """One decode graph replay of an arm aligned with the control's (difflib over the kernel names):
    per stretch where they differ, each side's kernels, wall span (gaps between its kernels included)
    and busy time, named by the routes of the arm's kernels there (else of the control's); totals per
    name; and both replays whole."""
    a_seq, b_seq = ref["seq"], arm["seq"]
    a = [ref["names"][k[0]] for k in a_seq]
    b = [arm["names"][k[0]] for k in b_seq]
    by: dict[str, dict[str, Any]] = {}
    equal = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            equal += i2 - i1
            continue
        label = _label(b[j1:j2])
        label = _label(a[i1:i2]) if label == VLLM_ONLY else label
        c, t = _side(a_seq, i1, i2), _side(b_seq, j1, j2)
        zero = {"kernels": 0, "span_us": 0.0, "busy_us": 0.0}
        row = by.setdefault(label, {"stretches": 0, "control": dict(zero), "arm": dict(zero)})
        row["stretches"] += 1
        for side, fig in (("control", c), ("arm", t)):
            for key in ("kernels", "span_us", "busy_us"):
                row[side][key] += fig[key]
    for row in by.values():
        row["delta_span_us"] = row["arm"]["span_us"] - row["control"]["span_us"]
    return {
        "control": _side(a_seq, 0, len(a_seq)),
        "arm": _side(b_seq, 0, len(b_seq)),
        "aligned_kernels": equal,
        "by_route": dict(sorted(by.items(), key=lambda kv: kv[1]["delta_span_us"])),
    }


def early_starts(g: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per kernel name of one replay: the calls that start before an earlier kernel of the replay has
    ended, and the us from their start to that end, summed. Under programmatic dependent launch (PDL)
    a kernel launched with it starts when its predecessor allows (griddepcontrol.launch_dependents)
    and waits in griddepcontrol.wait; the profiler counts that wait as the kernel's own time, so a
    kernel behind a predecessor that allows early (the kernels_ext GEMV) looks slower by the overlap
    without doing more work. A kernel on another stream (vLLM's aux stream) overlaps the same way."""
    out: dict[str, dict[str, float]] = {}
    end = float("-inf")
    for k, start, dur in g["seq"]:  # sorted by start (_graph_step)
        row = out.setdefault(g["names"][k], {"calls": 0.0, "early": 0.0, "early_us": 0.0})
        row["calls"] += 1
        if end > start:
            row["early"] += 1
            row["early_us"] += min(end, start + dur) - start
        end = max(end, start + dur)
    return out


def early_changes(ref: Mapping[str, Any], arm: Mapping[str, Any], top: int) -> dict[str, Any]:
    """early_starts of an arm's replay against the control's: the kernels whose early-start us differ,
    largest |change| first, top `top` kept, and the totals of both replays."""
    a, b = early_starts(ref), early_starts(arm)
    zero = {"calls": 0.0, "early": 0.0, "early_us": 0.0}
    rows: list[dict[str, Any]] = [
        {
            "name": n,
            "control": a.get(n, zero),
            "arm": b.get(n, zero),
            "delta_early_us": b.get(n, zero)["early_us"] - a.get(n, zero)["early_us"],
        }
        for n in sorted(set(a) | set(b))
        if a.get(n, zero)["early_us"] != b.get(n, zero)["early_us"]
    ]
    rows.sort(key=lambda r: (-abs(r["delta_early_us"]), r["name"]))
    total = {side: sum(r["early_us"] for r in t.values()) for side, t in (("control", a), ("arm", b))}
    return {"rows": rows[:top], "shown": min(top, len(rows)), "differing": len(rows), "early_us": total}


def against(ref: Mapping[str, Any], arm: Mapping[str, Any], top: int) -> dict[str, Any]:
    """One arm against the control: the summary's deltas, the kernel and runtime-API changes, the arm's
    qgate ops on the host (none when CUDA graphs replay them)."""
    busy = ref["gpu_busy_us_per_step"]
    out: dict[str, Any] = {f"delta_{k}": arm[k] - ref[k] for k in SUMMARY}
    out["gpu_busy_change_pct"] = None if busy == 0 else 100.0 * (arm["gpu_busy_us_per_step"] / busy - 1.0)
    out["kernels"] = table_changes(ref["kernels"], arm["kernels"], top)
    api = ref["runtime_api"] is not None and arm["runtime_api"] is not None
    out["runtime_api"] = table_changes(ref["runtime_api"], arm["runtime_api"], top) if api else None
    ops = arm["qgate_ops"]
    out["qgate_ops"] = None if ops is None else [{"name": n, **v} for n, v in sorted(ops.items())]
    both = ref.get("graph_step") is not None and arm.get("graph_step") is not None
    out["graph_stretches"] = stretches(ref["graph_step"], arm["graph_step"]) if both else None
    out["graph_early_starts"] = early_changes(ref["graph_step"], arm["graph_step"], top) if both else None
    return out


def build_timeline(
    folder: str,
    profiles: Mapping[str, Mapping[str, Any]],
    files: Mapping[str, Mapping[str, str]],
    top: int = TOP_N,
) -> Mapping[str, Any]:
    """The timeline record from checked profiles (check_profile); pure: no file access. Arms in order:
    control first, then the others by name."""
    order = ["control", *sorted(a for a in profiles if a != "control")]
    ref = profiles["control"]
    record = {
        "kind": "timeline",
        "schema_version": TIMELINE_SCHEMA_VERSION,
        "source": {"folder": folder, "files": {a: dict(files[a]) for a in order}},
        "top_n": top,
        "arms": {a: summary(profiles[a]) for a in order},
        "against_control": {a: against(ref, profiles[a], top) for a in order if a != "control"},
        # match_arms: the one filled where an ablation or a comparison embeds the timeline
        **{f"{of}_arms": None for of in MATCHED_BY},
    }
    return _freeze(record)


def read_timeline(folder: str | Path, top: int = TOP_N) -> Mapping[str, Any]:
    """Read and check a profile folder (profile_files, check_profile) and build its record; each file's
    name and the sha256 of the bytes read are in the record's `source`."""
    base = Path(folder)
    profiles, files = {}, {}
    for arm, path in profile_files(base).items():
        try:
            read = read_object(path, MAX_PROFILE_BYTES)
        except ResultError as exc:  # read_object's one line, as the timeline's own error
            raise TimelineError(str(exc)) from None
        profiles[arm] = check_profile(path, read.data)
        files[arm] = {"file": path.name, "sha256": read.sha256}
    return build_timeline(str(base), profiles, files, top)


def match_arms(
    record: Mapping[str, Any], arm_envs: Mapping[str, Mapping[str, str]], of: str = "ablation"
) -> Mapping[str, Any]:
    """The record with `<of>_arms` (`ablation_arms`: the ablation's design; `comparison_arms`: `qgate
    compare`'s control and candidate): per profile whether `of` has an arm of that name (`in_<of>`) and,
    where the profile recorded its route env (arm_env_routes), the variables in which it differs from
    that arm's env. Said in the report, not refused: a probe's folder (decode_probe.py --profile-tokens)
    holds variants that are no arm of the ablation or the comparison (cand-nopdl, only-fp16_gemv,
    control-2), and the timeline is no gate."""
    if of not in MATCHED_BY:
        raise ValueError(f"of = {of!r}: expected one of {', '.join(MATCHED_BY)}")
    out = {}
    for arm, s in record["arms"].items():
        got, want = s["arm_env_routes"], arm_envs.get(arm)
        differs = None
        if got is not None and want is not None:
            want = {k: v for k, v in want.items() if k.startswith(ENV_PREFIXES)}
            got = {k: v for k, v in got.items() if k.startswith(ENV_PREFIXES)}
            differs = {
                var: {"profile": got.get(var), "arm": want.get(var)}
                for var in sorted(set(want) | set(got))
                if want.get(var) != got.get(var)
            }
        out[arm] = {f"in_{of}": want is not None, "env_differs": differs}
    return _freeze({**thaw(record), f"{of}_arms": out})
