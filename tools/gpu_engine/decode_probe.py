"""decode_probe.py OUTDIR VARIANT... [--reps 3] [--tokens 256] [--input 2048]

Where a decode step's time goes without a profiler, for several arm variants in one device call: one
engine start per variant, each in a child interpreter with the arm's env exactly as qgate builds it
(preflight.arm_process_env of the contract's arm env) plus the variant's extra env, the engine core
in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and an attestation folder as qgate's launcher gives
one (QGATE_ATTEST_DIR; `-QGATE_ATTEST_DIR` in a variant's env leaves it out).

VARIANT is NAME=CONTRACT:ARM[:KEY=VALUE;KEY=VALUE;...], or @FILE (variants one a line, # comments).
CONTRACT is a path or a name under contracts/; KEY=VALUE overrides the arm's env, -KEY removes KEY (`;`
separates them: values may hold JSON). E.g. `gemv=qwen38-prodshape-bf16:control:
VLLM_SM70_QWEN38_FP16_GEMV=1` is the control with the GEMV route alone (tools/gpu_engine/probes/).

Per variant the child (1) warms up on two prompts of its own, (2) times --reps generates of --tokens
greedy tokens, each on a fresh prompt after a prefix-cache reset, with qgate's formula (decode tok/s
= (n - 1) / (last_token_ts - first_token_ts), from the engine's timestamps; TTFT), the same prompts in
every variant (token hashes comparable), (3) runs one more generate instrumented: CUDA events around
every CUDAGraph.replay (the decode graph's GPU time, no CUPTI) and around LogitsProcessor.forward
(the lm_head and what follows it, outside the graph), host time of each engine step and of each
replay call, and PyTorch's synchronizing-operation detector (torch.cuda.set_sync_debug_mode) with
the Python frames that made each sync. So a slower variant says whether its decode graph is slower on
the GPU or its host side is (a sync, a longer step), which the profiler's timeline (profile_decode.py,
which makes both arms host-bound) cannot.

With --profile-tokens N (64 in the call scripts) each variant also runs profile_decode.py's timeline of N
decode steps in its own engine: OUTDIR/timeline/<variant>.json (what `qgate ablate --timeline` reads).

Writes OUTDIR/<variant>.json and .log, appends one line per variant to OUTDIR/summary.txt as soon
as it is done (a call stopped at its limit keeps what finished; run again into the same OUTDIR, it
goes on: a variant whose <variant>.json is there is not started again). Not a gate: figures for the
report (docs/gpu.md); a verdict is `qgate run speed` / `qgate ablate`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _variant(spec: str) -> tuple[str, Path, str, dict[str, str | None]]:
    name, _, rest = spec.partition("=")
    parts = rest.split(":", 2)
    if not name or len(parts) < 2:
        raise SystemExit(f"decode_probe: variant {spec!r}: expected NAME=CONTRACT:ARM[:K=V;...]")
    contract = Path(parts[0])
    if not contract.exists():
        contract = ROOT / "contracts" / f"{parts[0]}.yaml"
    extra: dict[str, str | None] = {}
    for kv in parts[2].split(";") if len(parts) == 3 and parts[2] else []:
        if kv.startswith("-"):
            extra[kv[1:]] = None
        else:
            k, sep, v = kv.partition("=")
            if not sep:
                raise SystemExit(f"decode_probe: variant {name}: {kv!r} is not KEY=VALUE or -KEY")
            extra[k] = v
    return name, contract, parts[1], extra


def _setup(contract: Path, arm: str, extra: dict[str, str | None], attest: Path) -> tuple[dict, dict]:
    """The arm's env and engine args as profile_decode.py builds them, with the attestation folder and
    the variant's env changes."""
    from qgate_route_env import ATTEST_DIR_ENV

    env, engine, _ = _profile_decode()._arm_setup(contract, arm, None)
    env[ATTEST_DIR_ENV] = str(attest)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env, engine


def _profile_decode() -> types.ModuleType:
    """The sibling tool profile_decode.py (arm setup, the profiled generate)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import profile_decode

    return profile_decode


def _gpu_state() -> str:
    try:
        q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "n/a"


# --- the child: one engine, timed reps, one instrumented rep ------------------------------------------


def child(args_path: Path, out_json: Path) -> None:
    a = json.loads(args_path.read_text())
    import torch

    gpu = torch.cuda.is_available()
    probe = _Hooks(torch, gpu)
    probe.install()  # before the engine captures its graphs: vLLM binds CUDAGraph.replay at capture

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from qgate.results import atomic_write_text  # whole or not at all: a killed variant leaves no half file
    from qgate.speed.workload import synthetic_prompt

    t0 = time.time()
    llm = LLM(disable_log_stats=False, **a["engine"])
    start_s = time.time() - t0
    probe.install_step(type(llm.llm_engine))
    vocab = llm.llm_engine.model_config.get_vocab_size()
    special = sorted(int(i) for i in getattr(llm.get_tokenizer(), "all_special_ids", []))

    def generate(key: str, n_out: int) -> dict:
        prompt = synthetic_prompt(vocab, a["input_tokens"], f"qgate-probe:{key}", special)
        if not llm.reset_prefix_cache():
            raise RuntimeError("reset_prefix_cache() returned False")
        sp = SamplingParams(
            temperature=0.0, max_tokens=n_out, min_tokens=n_out, ignore_eos=True, detokenize=False
        )
        t = time.perf_counter()
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
        wall = time.perf_counter() - t
        m = out.metrics
        ids = [int(x) for x in out.outputs[0].token_ids]
        n = int(m.num_generation_tokens)
        return {
            "decode_tok_s": (n - 1) / (m.last_token_ts - m.first_token_ts),
            "ttft_ms": m.first_token_latency * 1000.0,
            "wall_s": wall,
            "tokens": n,
            "token_ids_head": ids[:16],
            "token_ids_hash": hash(tuple(ids)) & 0xFFFFFFFF,
        }

    for w in range(2):
        generate(f"warm:{w}", 32)
    reps = [generate(f"rep:{r}", a["tokens"]) for r in range(a["reps"])]
    gpu_state = _gpu_state() if gpu else "cpu"
    before = _threads()
    t_wall, t_cpu = time.perf_counter(), os.times()
    probe.start("timeline")
    inst = generate(f"rep:{a['reps']}", a["tokens"])
    timeline = probe.summary()
    host = _host_use(before, _threads(), time.perf_counter() - t_wall, os.times(), t_cpu)
    probe.start("syncs")
    generate(f"rep:{a['reps'] + 1}", 64)
    syncs = probe.summary()
    if a.get("profile_tokens"):  # profile_decode.py's timeline, in this engine (no start of its own)
        profiled_generate = _profile_decode().profiled_generate
        n = a["profile_tokens"]
        prompt = synthetic_prompt(vocab, a["input_tokens"], "qgate-probe:profile", special)
        sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
        prof, table = profiled_generate(llm, TokensPrompt(prompt_token_ids=prompt), sp)
        where = out_json.parent / "timeline" / out_json.name
        where.parent.mkdir(exist_ok=True)
        atomic_write_text(
            where, json.dumps({**prof, "engine_args": a["engine"], "engine_start_s": round(start_s, 1)})
        )
        where.with_suffix(".txt").write_text(table)
    rec = {
        "variant": a.get("variant"),
        "engine_start_s": round(start_s, 1),
        "engine_args": a["engine"],
        "env_routes": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_SM70_", "QGATE_"))},
        "reps": reps,
        "decode_tok_s_mean": statistics.fmean(r["decode_tok_s"] for r in reps),
        "ttft_ms_mean": statistics.fmean(r["ttft_ms"] for r in reps),
        "instrumented": {**inst, **timeline, **{k: syncs[k] for k in ("syncs_by_site", "sync_count")}},
        "gpu_state_before_instrumented": gpu_state,
        "host": host,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
    }
    atomic_write_text(out_json, json.dumps(rec, indent=1))
    print("PROBE " + _line(out_json.stem, rec), flush=True)
    os._exit(0)  # vLLM's in-process engine: skip the interpreter's teardown


def _threads() -> dict[str, tuple[str, int]]:
    """This process's threads: tid -> (name, CPU clock ticks used so far: utime + stime)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            out[tid] = (name, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def _host_use(before: dict, after: dict, wall: float, t1: os.times_result, t0: os.times_result) -> dict:
    """Where the host's CPU went during one timed generate: the process's CPU seconds against the wall
    (above 1: threads besides the engine's were busy), the threads that used CPU, by name, the CPUs the
    process may run on, the machine's load, and the OpenMP runtimes loaded (two in one process can
    spin against each other)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = []
    for tid, (name, ticks) in after.items():
        d = ticks - before.get(tid, (name, 0))[1]
        if d:
            used.append((name, tid, round(d / tick, 3)))
    used.sort(key=lambda x: -x[2])
    try:
        maps = Path("/proc/self/maps").read_text()
        libs = {ln.split()[-1] for ln in maps.splitlines() if ln.split()}
        omp = sorted(p for p in libs if Path(p).name.startswith(("libgomp", "libiomp", "libomp")))
    except (OSError, IndexError):
        omp = []
    return {
        "wall_s": round(wall, 3),
        "process_cpu_s": round((t1.user - t0.user) + (t1.system - t0.system), 3),
        "threads": len(after),
        "busy_threads": used[:8],
        "affinity": len(os.sched_getaffinity(0)),
        "busiest_on": _placement(used[0][1]) if used else None,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "openmp_libs": omp,
    }


def _placement(tid: str, root: Path = Path("/")) -> dict | None:
    """Where a thread ran last: its CPU, that CPU's NUMA node and clock (MHz, None where the machine does
    not say). Decode at 12 layers on the H200 followed the engine's host thread, whose speed moved by up to
    48 % between engine starts of one arm (2026-12-05): this is what can tell a start's placement."""
    try:
        stat = (root / f"proc/self/task/{tid}/stat").read_text()
        cpu = int(stat[stat.rindex(")") + 2 :].split()[36])  # field 39, "processor"
    except (OSError, ValueError, IndexError):
        return None
    base = root / f"sys/devices/system/cpu/cpu{cpu}"
    nodes = sorted(p.name for p in base.glob("node[0-9]*")) if base.is_dir() else []
    mhz = None
    try:
        mhz = round(int((base / "cpufreq" / "scaling_cur_freq").read_text()) / 1000)
    except (OSError, ValueError):
        try:  # a VM without cpufreq: /proc/cpuinfo's figure for that processor
            for block in (root / "proc/cpuinfo").read_text().split("\n\n"):
                pairs = (ln.split(":", 1) for ln in block.splitlines() if ":" in ln)
                fields = {k.strip(): v.strip() for k, v in pairs}
                if fields.get("processor") == str(cpu):
                    mhz = round(float(fields["cpu MHz"]))
        except (OSError, ValueError, KeyError):
            mhz = None
    return {"cpu": cpu, "node": int(nodes[0][4:]) if nodes else None, "mhz": mhz}


QGATE_FRAME = "qgate_kernels/"  # how a frame of the route plugin is shown in syncs_by_site


def _where(filename: str) -> str:
    """A frame's file as the sync report shows it: qgate_kernels/<path> for the plugin's, else its name."""
    head, sep, tail = filename.rpartition("/" + QGATE_FRAME)
    return QGATE_FRAME + tail if sep else Path(filename).name


class _Hooks:
    """Instrumentation of one generate, by mode: "timeline" records a CUDA event with the host clock at
    each engine step's start and end, around every CUDAGraph.replay and LogitsProcessor.forward, and the
    host time spent blocked in CUDA synchronisations; "syncs" turns PyTorch's synchronising-operation
    detector on and keeps the Python frames of each sync. Off (None): one attribute read a call."""

    def __init__(self, torch_mod, gpu: bool) -> None:
        self.t = torch_mod
        self.gpu = gpu
        self.mode: str | None = None
        self.marks: list = []  # (label, host s, event)
        self.waits: list = []  # (step index, host s blocked in a synchronize)
        self.steps: list[float] = []  # host s of each engine step
        self.syncs: dict[str, int] = {}
        self.anchor: tuple[float, object] | None = None

    def mark(self, label: str) -> None:
        if self.mode == "timeline" and self.gpu:
            e = self.t.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((label, time.perf_counter(), e))

    def start(self, mode: str) -> None:
        """The host clock of the GPU's: an event that has completed, read right after it did."""
        if self.gpu:
            self.t.cuda.synchronize()
            e = self.t.cuda.Event(enable_timing=True)
            e.record()
            e.synchronize()
            self.anchor = (time.perf_counter(), e)
        self.mode = mode

    def _timed(self, fn):
        hooks = self

        def wrapper(*args, **kwargs):
            if hooks.mode != "timeline":
                return fn(*args, **kwargs)
            h = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                hooks.waits.append((len(hooks.steps), time.perf_counter() - h))

        return wrapper

    def install(self) -> None:
        t, hooks = self.t, self
        if self.gpu:
            graph = t.cuda.CUDAGraph
            orig_replay = graph.replay

            def replay(g):
                hooks.mark("replay0")
                out = orig_replay(g)
                hooks.mark("replay1")
                return out

            graph.replay = replay
            # Where the host blocks on the GPU (vLLM's async output copy waits on an event).
            t.cuda.Event.synchronize = self._timed(t.cuda.Event.synchronize)
            t.cuda.Stream.synchronize = self._timed(t.cuda.Stream.synchronize)
        from vllm.model_executor.layers.logits_processor import LogitsProcessor

        orig_fwd = LogitsProcessor.forward

        def forward(lp, *args, **kwargs):
            hooks.mark("logits0")
            out = orig_fwd(lp, *args, **kwargs)
            hooks.mark("logits1")
            return out

        LogitsProcessor.forward = forward

    def install_step(self, engine_cls) -> None:
        """Time each engine step (the in-process engine: LLM.generate calls step() once a step)."""
        t, hooks = self.t, self
        orig_step = engine_cls.step

        def step(engine, *args, **kwargs):
            if hooks.mode is None:
                return orig_step(engine, *args, **kwargs)
            if hooks.mode == "timeline":
                h = time.perf_counter()
                hooks.mark("step0")
                try:
                    return orig_step(engine, *args, **kwargs)
                finally:
                    hooks.mark("step1")
                    hooks.steps.append(time.perf_counter() - h)
            import warnings

            mode = t.cuda.get_sync_debug_mode() if hooks.gpu else None
            if hooks.gpu:
                t.cuda.set_sync_debug_mode(1)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                prev = warnings.showwarning
                warnings.showwarning = hooks._on_warning
                try:
                    return orig_step(engine, *args, **kwargs)
                finally:
                    warnings.showwarning = prev
                    if mode is not None:
                        t.cuda.set_sync_debug_mode(mode)

        engine_cls.step = step

    def _on_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = str(message)
        if "synchroniz" not in text.lower():
            return
        frames = [
            f"{_where(f.filename)}:{f.lineno}:{f.name}"
            for f in traceback.extract_stack()[:-2]
            if "/torch/" not in f.filename and "decode_probe" not in f.filename
        ]
        key = " < ".join(reversed(frames[-4:]))
        self.syncs[key] = self.syncs.get(key, 0) + 1

    def summary(self) -> dict:
        """Per decode step (medians over the steps after the first two): host time of the step, host
        time blocked in synchronisations, GPU time of the graph replay and of the logits, and the
        launch lag (GPU clock of the replay's start minus the host clock of its launch: large = the
        GPU still had queued work, the host runs ahead; ~0 = the GPU sat idle until the host
        launched: host-bound or serialised)."""
        self.mode = None
        out: dict = {"syncs_by_site": dict(sorted(self.syncs.items(), key=lambda kv: -kv[1]))}
        out["sync_count"] = sum(self.syncs.values())
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        if self.steps:
            out["steps"] = len(self.steps)
            out["step_host_us_median"] = 1e6 * med(self.steps[2:] or self.steps)
        per_step: dict[int, float] = {}
        for i, w in self.waits:
            per_step[i] = per_step.get(i, 0.0) + w
        out["sync_wait_us_median"] = 1e6 * (
            med([per_step.get(i, 0.0) for i in range(2, len(self.steps))]) or 0.0
        )
        if not (self.gpu and self.anchor):
            return out
        self.t.cuda.synchronize()
        h0, e0 = self.anchor
        rows: list[dict] = []
        replays: list[int] = []
        for label, h, e in self.marks:
            if label == "step0":
                rows.append({})
                replays.append(0)
            if rows:
                at = (h, h0 + e0.elapsed_time(e) / 1000.0)
                if label.endswith("1"):  # the last end: a step of several graph segments spans them all
                    rows[-1][label] = at
                else:
                    rows[-1].setdefault(label, at)
                replays[-1] += label == "replay0"
        us = lambda a, b: 1e6 * (b - a)  # noqa: E731
        keep = [r for r in rows[2:] if "replay0" in r and "replay1" in r]
        out["decode_steps_timed"] = len(keep)
        out["replays_per_step_max"] = max(replays[2:], default=0)  # 1: the FULL graph; more: segments
        if keep:
            out["replay_gpu_us_median"] = med([us(r["replay0"][1], r["replay1"][1]) for r in keep])
            out["launch_lag_us_median"] = med([us(r["replay0"][0], r["replay0"][1]) for r in keep])
            with_logits = [r for r in keep if "logits0" in r and "logits1" in r]
            if with_logits:
                out["logits_gpu_us_median"] = med([us(r["logits0"][1], r["logits1"][1]) for r in with_logits])
                # per step, for the reading's CI of a route's change (_gpu_work)
                out["gpu_work_us"] = [
                    round(us(r["replay0"][1], r["replay1"][1]) + us(r["logits0"][1], r["logits1"][1]), 1)
                    for r in with_logits
                ]
            starts = [r["step0"][1] for r in keep if "step0" in r]
            if len(starts) > 1:
                out["gpu_step_us_median"] = med([us(a, b) for a, b in itertools.pairwise(starts)])
            out["timeline_head"] = [
                {k: [round(us(h0, v[0])), round(us(h0, v[1]))] for k, v in r.items()} for r in rows[:12]
            ]
        return out


RECOVERED = 0.97  # a variant at >= 97 % of the controls' decode tok/s "brings the candidate back"
APART = 0.95  # a pair whose candidate decodes at < 95 % of its control's: the gap is there
# A DERIVE is proposed only for a gap one engine start per variant is unlikely to fake: the candidate
# below 85 % of the control and the variant at RECOVERED (engine starts of one arm were seen up to 20 %
# apart on the H200, in the host-bound tiny model: 342.4 and 275.6 tok/s, docs/gpu.md).
PROPOSE_BELOW = 0.85
HOST_BOUND = 1.2  # host time a step >= 1.2x the GPU's work a step: decode waits on the host
CI_STEPS = 20  # the fewest timed steps a variant's GPU work needs for a CI of its change
CI_RESAMPLES, CI_SEED = 2000, 20261205
DERIVE_MARK = "DERIVE='"  # how the proposal is written: lib.sh's DERIVE=auto reads it back


def _mean(records: dict, names: tuple[str, ...], key: str) -> float | None:
    xs = [records[n][key] for n in names if n in records and records[n].get(key)]
    return sum(xs) / len(xs) if xs else None


def _inst(records: dict, names: tuple[str, ...], key: str) -> float | None:
    xs = [records[n]["instrumented"].get(key) for n in names if n in records]
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def derive_for(name: str, extra: dict) -> str | None:
    """The DERIVE of tools/gpu_engine/calls (lib.sh prod_contract) that turns a variant's env changes
    into a contract: route roles into the contract's routes section, anything else into the candidate;
    None for a removal."""
    from qgate_route_env import ROLES_ENV

    sets = []
    for key, value in extra.items():
        if value is None:
            return None  # `-KEY`: a contract cannot say "unset what the launcher sets"
        if key == ROLES_ENV:
            for route, roles in json.loads(value).items():
                sets.append(f"routes.{route}.roles={json.dumps(roles, separators=(',', ':'))}")
        else:
            sets.append(f"arms.candidate.env.{key}={json.dumps(value)}")
    tag = name.removeprefix("cand-") or name
    return f"{tag} " + " ".join(sets) if sets else None


def reading(records: dict) -> list[str]:
    """docs/gpu.md's table applied to the variants' records (a reading aid for the next call, not a
    gate): does the gap follow the arm or the engine start, does a variant bring the candidate back
    (and the DERIVE that makes it a contract), is the decode graph or the host slower, any sync."""
    ctrl, cand = ("control", "control-2"), ("candidate", "candidate-2")
    c_tok, t_tok = _mean(records, ctrl, "decode_tok_s_mean"), _mean(records, cand, "decode_tok_s_mean")
    out = ["reading (docs/gpu.md, 'Next'; not a gate):"]
    if not (c_tok and t_tok):
        return out + ["  no control or candidate record: nothing to read"]
    pairs = []
    for c, t in zip(ctrl, cand, strict=True):
        if c in records and t in records:
            pairs.append(records[t]["decode_tok_s_mean"] / records[c]["decode_tok_s_mean"])
    shown = ", ".join(f"{r:.3f}" for r in pairs)
    if len(pairs) == 2 and all(r < APART for r in pairs):
        out.append(f"  candidate/control by pair {shown}: the gap follows the arm")
    elif len(pairs) == 2 and any(r < APART for r in pairs):
        out.append(f"  candidate/control by pair {shown}: one pair only: the engine start, not the arm")
    elif pairs and pairs[0] < APART:
        out.append(
            f"  candidate/control {shown}: one engine start each (the ablation's launches tell the two apart)"
        )
    else:
        out.append(f"  candidate/control by pair {shown}: no slowdown of 5 % or more")
    for key, what in (
        ("replay_gpu_us_median", "decode graph GPU us"),
        ("step_host_us_median", "host us a step"),
        ("launch_lag_us_median", "launch lag us"),
        ("sync_wait_us_median", "host blocked us a step"),
    ):
        a, b = _inst(records, ctrl, key), _inst(records, cand, key)
        if a is not None and b is not None:
            out.append(f"  {what}: control {a:.0f}, candidate {b:.0f} ({b - a:+.0f})")
    out += _host_bound(records, ctrl + cand)
    out.append(
        f"  TTFT ms: control {_mean(records, ctrl, 'ttft_ms_mean'):.1f}, candidate "
        f"{_mean(records, cand, 'ttft_ms_mean'):.1f}"
    )
    for name, rec in records.items():
        if name in ctrl + cand:
            continue
        tok = rec["decode_tok_s_mean"]
        line = f"  {name}: decode {tok / c_tok:.3f} of the control, {tok / t_tok:.3f} of the candidate"
        extra = (rec.get("variant") or {}).get("extra") or {}
        # a DERIVE changes the candidate: proposed from the candidate's own variants only (one built on
        # the control, e.g. only-* or control-serial, is not the candidate plus its env changes)
        own = (rec.get("variant") or {}).get("arm", "candidate") == "candidate"
        if tok >= RECOVERED * c_tok and tok >= t_tok / APART:
            derive = derive_for(name, extra) if own and t_tok < PROPOSE_BELOW * c_tok else None
            line += ": brings the candidate back"
            line += f"; call 5: {DERIVE_MARK}{derive}'" if derive else ""
        out.append(line)
    out += _gpu_work(records, ctrl, cand)
    for name, rec in records.items():
        for site, n in (rec["instrumented"].get("syncs_by_site") or {}).items():
            if QGATE_FRAME in site:
                out.append(f"  sync in {name} with a qgate frame ({n}x): {site}")
    return out


def _gpu_work(records: dict, ctrl: tuple[str, ...], cand: tuple[str, ...]) -> list[str]:
    """Each variant's GPU work a step (decode graph replay + eager logits, CUDA events) against the
    control's: a route's effect on the GPU that the host's speed between engine starts does not move
    (one-at-a-time variants, tools/gpu_engine/probes/prod-bf16-routes.txt), and the sum of the
    variants' changes beside the candidate's (the routes' effects add up, or they interact)."""
    keys = ("replay_gpu_us_median", "logits_gpu_us_median")
    base = [_inst(records, ctrl, k) for k in keys]
    if base[0] is None:
        return []
    out, deltas = ["  GPU work a step against the control's (decode graph + logits us):"], {}
    for name, rec in records.items():
        if name in ctrl:
            continue
        got = [rec["instrumented"].get(k) for k in keys]
        if got[0] is None:
            out.append(f"  - {name}: no decode graph time")
            continue
        d = [g - b for g, b in zip(got, base, strict=True) if g is not None and b is not None]
        deltas[name] = sum(d)
        out.append(
            f"  - {name}: {got[0]:.0f} ({got[0] - base[0]:+.0f})"
            + (f" + {got[1]:.0f} ({got[1] - base[1]:+.0f})" if got[1] is not None and base[1] else "")
            + f" = {sum(d):+.0f} us ({sum(d) / (base[0] + (base[1] or 0.0)) * 100:+.1f} %)"
            + _median_change_ci(records, ctrl, rec)
        )
    alone = {n: d for n, d in deltas.items() if n.startswith("only-")}
    total = next((deltas[n] for n in cand if n in deltas), None)
    if alone and total is not None:
        out.append(
            f"  - the {len(alone)} only-* variants' changes add to {sum(alone.values()):+.0f} us, "
            f"the candidate's is {total:+.0f} us"
        )
    return out


def _median_change_ci(records: dict, ctrl: tuple[str, ...], rec: dict) -> str:
    """The 95 % percentile-bootstrap CI of the change of the median GPU work a step (decode graph +
    logits), the variant's steps and the control's resampled apart (seeded); empty when either has fewer
    than CI_STEPS timed steps. Steps of one engine start each: what moves between starts is not in it
    (the decode graph's replay moved by 0.3 % between three starts at 12 layers: 1,511-1,515 us)."""
    import numpy as np

    base = next((records[n]["instrumented"].get("gpu_work_us") for n in ctrl if n in records), None)
    steps = rec["instrumented"].get("gpu_work_us")
    if not (base and steps) or min(len(base), len(steps)) < CI_STEPS:
        return ""
    rng = np.random.default_rng(CI_SEED)
    a, b = np.asarray(base, dtype=float), np.asarray(steps, dtype=float)
    pick = lambda x: np.median(x[rng.integers(0, x.size, (CI_RESAMPLES, x.size))], axis=1)  # noqa: E731
    lo, hi = np.quantile(pick(b) - pick(a), [0.025, 0.975])
    return f", median change CI [{lo:+.0f}, {hi:+.0f}] us over {a.size}/{b.size} steps of one start each"


def _host_bound(records: dict, names: tuple[str, ...]) -> list[str]:
    """A line when the host's time a step exceeds the GPU's work a step (decode graph + eager logits) by
    HOST_BOUND in every control/candidate record: then decode tok/s follows the host (which moved by up to
    48 % between engine starts of one arm on the H200, 2026-12-05), not the kernels, and no route's GPU
    time can show in it. Nothing when a figure is missing."""
    ratios = []
    for name in names:
        i = records[name]["instrumented"] if name in records else None
        if i is None:
            continue
        host, graph, logits = (i.get(k) for k in ("step_host_us_median", "replay_gpu_us_median",
                                                  "logits_gpu_us_median"))  # fmt: skip
        if not (host and graph):
            return []
        ratios.append(host / (graph + (logits or 0.0)))
    if not ratios or min(ratios) < HOST_BOUND:
        return []
    return [
        f"  host-bound: the host's time a step is {min(ratios):.2f}-{max(ratios):.2f}x the GPU's work "
        "(decode graph + logits): decode tok/s follows the host, not the routes' kernels; more layers "
        "(the GPU's step above the host's) before a speed verdict means anything about the kernels"
    ]


def _line(name: str, rec: dict) -> str:
    i, h = rec["instrumented"], rec["host"]
    f = lambda k, fmt="{:.0f}": fmt.format(i[k]) if k in i else "-"  # noqa: E731
    reps = ", ".join(f"{r['decode_tok_s']:.1f}" for r in rec["reps"])
    return (
        f"{name:<22} start {rec['engine_start_s']:>5.1f} s | decode {rec['decode_tok_s_mean']:7.1f} tok/s "
        f"({reps}) | TTFT {rec['ttft_ms_mean']:6.1f} ms | "
        f"inst {i['decode_tok_s']:.1f} tok/s: step host {f('step_host_us_median')} us, GPU step "
        f"{f('gpu_step_us_median')} us, replay GPU {f('replay_gpu_us_median')} us, logits GPU "
        f"{f('logits_gpu_us_median')} us, launch lag {f('launch_lag_us_median')} us, sync wait "
        f"{f('sync_wait_us_median')} us, "
        f"syncs {i.get('sync_count', 0)} | host CPU/wall {h['process_cpu_s']}/{h['wall_s']} s, "
        f"busiest {h['busy_threads'][:2]} on {h.get('busiest_on')} | tokens {i['token_ids_head'][:4]}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("variants", nargs="*")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--input", type=int, default=2048)
    ap.add_argument("--variant-timeout", type=float, default=300.0)
    ap.add_argument("--profile-tokens", type=int, default=0, help="also a torch.profiler timeline (0: none)")
    ap.add_argument("--child", nargs=2, metavar=("ARGS_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(Path(a.child[0]), Path(a.child[1]))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    specs = []
    for v in a.variants:  # @FILE: variants one a line (# comments)
        lines = Path(v[1:]).read_text().splitlines() if v.startswith("@") else [v]
        specs += [x.strip() for x in lines if x.strip() and not x.lstrip().startswith("#")]
    running: list[subprocess.Popen] = []

    def write_reading() -> None:  # after every variant: a call cut by its limit keeps a reading too
        records = {}
        for spec in specs:
            path = a.out / f"{_variant(spec)[0]}.json"
            if path.is_file():
                records[path.stem] = json.loads(path.read_text())
        (a.out / "reading.txt").write_text("\n".join(reading(records)) + "\n")

    def stop(signum: int, _frame: object) -> None:
        # The call's `timeout` signals this process only: the variant's engine runs in a session of its
        # own and would hold the GPU into the next call. Kill it, keep what finished, exit as timeout does.
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        write_reading()
        print(f"decode_probe: stopped by signal {signum}; the variants done are kept", flush=True)
        os._exit(124)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for spec in specs:
        name, contract, arm, extra = _variant(spec)
        if (a.out / f"{name}.json").is_file():  # done by an earlier call on this machine: a cut probe goes on
            print(f"{name:<22} kept from an earlier call ({name}.json)", flush=True)
            continue
        attest = Path(tempfile.mkdtemp(prefix=f"probe-{name}-", dir=a.out))
        env, engine = _setup(contract, arm, extra, attest)
        args_path = a.out / f"{name}.args.json"
        args_path.write_text(
            json.dumps(
                {
                    "engine": engine,
                    "reps": a.reps,
                    "tokens": a.tokens,
                    "input_tokens": a.input,
                    "profile_tokens": a.profile_tokens,
                    "variant": {"contract": str(contract), "arm": arm, "extra": extra},
                },
                indent=1,
            )
        )
        t0 = time.time()
        cmd = [sys.executable, __file__, str(a.out), "--child", str(args_path), str(a.out / f"{name}.json")]
        with open(a.out / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            running[:] = [proc]
            try:
                rc = proc.wait(timeout=a.variant_timeout)
            except subprocess.TimeoutExpired:  # a hung engine must not take the rest of the call
                os.killpg(proc.pid, signal.SIGKILL)
                rc = f"timeout after {a.variant_timeout:.0f} s ({proc.wait()})"
            running.clear()
        tail = (a.out / f"{name}.log").read_text(errors="replace").splitlines()
        line = next((x[6:] for x in tail if x.startswith("PROBE ")), None)
        line = line or f"{name:<22} rc={rc}: " + " | ".join(tail[-4:])[-600:]
        line += f" | {time.time() - t0:.0f} s"
        with open(a.out / "summary.txt", "a") as fh:
            fh.write(line + "\n")
        print(line, flush=True)
        write_reading()
    write_reading()
    print((a.out / "reading.txt").read_text(), end="", flush=True)


if __name__ == "__main__":
    main()
