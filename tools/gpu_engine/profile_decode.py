"""profile_decode.py CONTRACT OUTDIR [--arms control,candidate] [--tokens 64] [--model DIR]

A per-kernel timeline of decode for each arm of a speed contract, on a GPU: one engine start per arm in
a child interpreter with the arm's env exactly as qgate builds it (Contract.env_for: the arm's env,
the shims, the listed roles; the caller's stray QGATE_* / VLLM_SM70_* dropped as the launcher does)
and the arm's engine args (Contract.engine_for), with vLLM's engine core in that process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so that torch.profiler sees its kernels. The child warms up
with the contract's prompt length, then profiles one generate() of --tokens greedy tokens on the same
prompt (the prefix cache then leaves one token of prefill, so the window is decode).

Per arm it writes OUTDIR/<arm>.json and OUTDIR/<arm>.txt:
- every kernel name with its count and GPU time, per decode step (count / tokens, time / tokens);
- the CPU-side launches per step: cudaGraphLaunch (replays of captured segments), cudaLaunchKernel
  and friends (kernels launched outside any graph), cudaMemcpy*, synchronisations;
- the GPU's busy time per step (the union of kernel intervals) against the wall span of the kernels:
  the rest is the GPU waiting for the host (host gaps);
- the qgate ops (qgate::*, qgate_routes::*) seen on the host, per step (none when a graph replays them);
- `graph_step`: one decode graph replay's kernels in order (name, start, duration), a typical one of the
  generate's replays, for qgate.timeline to align with the control's (each route's stretch of the
  step with the gaps between its kernels).
Then OUTDIR/diff.txt sets the arms side by side (kernels the candidate adds, removes or slows).
Not a gate: figures for the report (issue 47); timings under the profiler are inflated by its own
overhead, so compare arms with each other, not with the speed gate's tok/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")


def _arm_setup(contract: Path, arm: str, model: str | None) -> tuple[dict, dict, dict]:
    from qgate.contract import load_contract
    from qgate.engine.preflight import arm_process_env
    from qgate.models import resolve_model

    loaded = load_contract(contract)
    c = loaded.contract
    env, _ = arm_process_env(os.environ, c.env_for(arm))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    path, _ = resolve_model(model or c.model)
    args = {**c.engine_for(arm), "model": path}
    spec = {"input_tokens": c.speed.input_tokens, "prompt_seed": c.speed.prompt_seed}
    return env, args, spec


GRAPH_GAP_US = 20.0  # kernels of one graph replay follow each other within this; the host is slower


def graph_step(kernels: list[tuple[str, float, float]]) -> dict | None:
    """One typical decode graph replay from a generate's kernels (name, start us, end us), as
    {"kernels", "names", "seq": [[name index, start us from the first, duration us], ...]}: the runs
    of kernels each starting within GRAPH_GAP_US of the last one's end are the replays (the host
    launches the eager kernels slower than that under the profiler); the most frequent run length is
    the decode graph's, and the middle run of that length is kept. None without a run of 8 kernels."""
    runs: list[list[tuple[str, float, float]]] = []
    end = float("-inf")
    for k in sorted(kernels, key=lambda k: k[1]):
        if runs and k[1] - end <= GRAPH_GAP_US:
            runs[-1].append(k)
            end = max(end, k[2])
        else:
            runs.append([k])
            end = k[2]
    lengths = [len(r) for r in runs if len(r) >= 8]
    if not lengths:
        return None
    common = max(set(lengths), key=lambda n: (lengths.count(n), n))
    same = [r for r in runs if len(r) == common]
    run = same[len(same) // 2]
    names = sorted({k[0] for k in run})
    index = {n: i for i, n in enumerate(names)}
    t0 = run[0][1]
    seq = [[index[n], round(a - t0, 3), round(b - a, 3)] for n, a, b in run]
    return {"kernels": len(run), "replays_seen": len(same), "names": names, "seq": seq}


def child(args_path: Path, out_json: Path, tokens: int) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from qgate.speed.workload import synthetic_prompt

    a = json.loads(args_path.read_text())
    t0 = time.time()
    llm = LLM(**a["engine"])
    start_s = time.time() - t0
    cfg = llm.llm_engine.model_config
    prompt = synthetic_prompt(cfg.get_vocab_size(), a["spec"]["input_tokens"], a["spec"]["prompt_seed"], [])
    sp = SamplingParams(
        temperature=0.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, detokenize=False
    )
    tp = TokensPrompt(prompt_token_ids=prompt)
    llm.generate([tp], sp, use_tqdm=False)  # warm: prefill, then the decode graphs
    rec, table = profiled_generate(llm, tp, sp)
    rec = {**rec, "engine_args": a["engine"], "engine_start_s": round(start_s, 1)}
    out_json.write_text(json.dumps(rec, indent=1))
    out_json.with_suffix(".txt").write_text(table)
    print(
        f"PROFILE {out_json.stem}: start {start_s:.1f} s, {rec['tokens']} tokens, step span "
        f"{rec['kernel_span_us_per_step']:.1f} us, GPU busy {rec['gpu_busy_us_per_step']:.1f} us, graph "
        f"launches/step {rec['graph_launches_per_step']:.2f}, eager launches/step "
        f"{rec['eager_kernel_launches_per_step']:.2f}",
        flush=True,
    )
    os._exit(0)  # vLLM's in-process engine: skip the interpreter's teardown


def profiled_generate(llm: object, prompt: object, sp: object) -> tuple[dict, str]:
    """One warm generate of `prompt` (its prefix cached: the window is decode) under torch.profiler:
    the per-step record (kernels, runtime API, qgate ops, GPU busy vs span) and the profiler's table.
    The engine is warmed on the same prompt first; decode_probe.py calls this in its own engine."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from qgate.timeline import busy_us

    llm.generate([prompt], sp, use_tqdm=False)  # type: ignore[attr-defined]  # the prompt's blocks cached
    gpu = torch.cuda.is_available()  # without one (a CPU check of this script) the CPU side only
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        t1 = time.perf_counter()
        (res,) = llm.generate([prompt], sp, use_tqdm=False)  # type: ignore[attr-defined]
        sync()
        wall = time.perf_counter() - t1
    n = len(res.outputs[0].token_ids)
    kernels: dict[str, dict] = {}
    cpu_ops: dict[str, dict] = {}
    intervals = []
    timed = []  # (name, start us, end us) of every kernel
    for e in prof.events():
        dev = str(getattr(e, "device_type", "")).endswith("CUDA")
        if dev:
            k = kernels.setdefault(e.name, {"count": 0, "us": 0.0})
            k["count"] += 1
            k["us"] += e.time_range.elapsed_us()
            intervals.append((e.time_range.start, e.time_range.end))
            timed.append((e.name, float(e.time_range.start), float(e.time_range.end)))
        else:
            o = cpu_ops.setdefault(e.name, {"count": 0, "us": 0.0})
            o["count"] += 1
            o["us"] += e.time_range.elapsed_us()
    span = (max(b for _, b in intervals) - min(a for a, _ in intervals)) if intervals else 0.0
    busy = busy_us(intervals)
    per = lambda d: {k: {"per_step": v["count"] / n, "us_per_step": v["us"] / n} for k, v in d.items()}  # noqa: E731
    api = {
        k: v for k, v in per(cpu_ops).items() if k.startswith(("cuda", "cu")) and not k.startswith("cudnn")
    }
    rec = {
        "arm_env_routes": {
            k: v for k, v in os.environ.items() if k.startswith(("VLLM_SM70_", "QGATE_SHIMS"))
        },
        "tokens": n,
        "wall_s_under_profiler": wall,
        "kernel_span_us_per_step": span / n,
        "gpu_busy_us_per_step": busy / n,
        "host_gap_us_per_step": (span - busy) / n,
        "graph_launches_per_step": sum(api.get(k, {}).get("per_step", 0) for k in GRAPH_APIS),
        "eager_kernel_launches_per_step": sum(api.get(k, {}).get("per_step", 0) for k in LAUNCH_APIS),
        "kernels": dict(sorted(per(kernels).items(), key=lambda kv: -kv[1]["us_per_step"])),
        "runtime_api": dict(sorted(api.items(), key=lambda kv: -kv[1]["us_per_step"])),
        "qgate_ops": {k: v for k, v in per(cpu_ops).items() if k.startswith("qgate")},
        "graph_step": graph_step(timed),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
    }
    table = prof.key_averages().table(
        sort_by="device_time_total" if gpu else "cpu_time_total", row_limit=45, max_name_column_width=70
    )
    return rec, table


def diff(out: Path, arms: list[str]) -> str:
    recs = {
        arm: json.loads((out / f"{arm}.json").read_text()) for arm in arms if (out / f"{arm}.json").exists()
    }
    if len(recs) != 2:
        return f"diff: need two arm records, have {sorted(recs)}"
    (a, ra), (b, rb) = recs.items()
    lines = [f"per decode step, {a} -> {b} (under the profiler)"]
    for key in (
        "kernel_span_us_per_step",
        "gpu_busy_us_per_step",
        "host_gap_us_per_step",
        "graph_launches_per_step",
        "eager_kernel_launches_per_step",
    ):
        lines.append(f"  {key}: {ra[key]:.2f} -> {rb[key]:.2f}")
    names = set(ra["kernels"]) | set(rb["kernels"])
    z = {"per_step": 0.0, "us_per_step": 0.0}
    rows = sorted(
        names,
        key=lambda k: -abs(rb["kernels"].get(k, z)["us_per_step"] - ra["kernels"].get(k, z)["us_per_step"]),
    )
    lines.append("  kernels by |change| of GPU us per step (calls/step a -> b, us/step a -> b):")
    for k in rows[:40]:
        x, y = ra["kernels"].get(k, z), rb["kernels"].get(k, z)
        lines.append(
            f"    {y['us_per_step'] - x['us_per_step']:+9.2f} us  "
            f"{x['per_step']:6.2f} -> {y['per_step']:6.2f}  "
            f"{x['us_per_step']:8.2f} -> {y['us_per_step']:8.2f}  {k[:110]}"
        )
    lines.append("  runtime API per step (calls a -> b, us a -> b):")
    for k in sorted(set(ra["runtime_api"]) | set(rb["runtime_api"])):
        x, y = ra["runtime_api"].get(k, z), rb["runtime_api"].get(k, z)
        if max(x["per_step"], y["per_step"]) >= 0.5:
            lines.append(
                f"    {k}: {x['per_step']:.2f} -> {y['per_step']:.2f}, "
                f"{x['us_per_step']:.1f} -> {y['us_per_step']:.1f} us"
            )
    lines.append(
        f"  qgate ops per step in {b}: "
        + ", ".join(
            f"{k} {v['per_step']:.2f} ({v['us_per_step']:.1f} us CPU)" for k, v in rb["qgate_ops"].items()
        )
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("contract", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--arms", default="control,candidate")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default=None, help="model directory (default: the contract's model)")
    ap.add_argument("--child", nargs=2, metavar=("ARGS_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(Path(a.child[0]), Path(a.child[1]), a.tokens)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    arms = a.arms.split(",")
    for arm in arms:
        env, engine, spec = _arm_setup(a.contract, arm, a.model)
        args_path = a.out / f"{arm}.args.json"
        args_path.write_text(json.dumps({"engine": engine, "spec": spec}, indent=1))
        t0 = time.time()
        cmd = [
            sys.executable,
            __file__,
            str(a.contract),
            str(a.out),
            "--tokens",
            str(a.tokens),
            "--child",
            str(args_path),
            str(a.out / f"{arm}.json"),
        ]
        with open(a.out / f"{arm}.log", "w") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        tail = (a.out / f"{arm}.log").read_text(errors="replace").splitlines()
        print(
            f"{arm}: rc={rc} in {time.time() - t0:.0f} s; "
            + (next((x for x in tail if x.startswith("PROFILE")), "") or " | ".join(tail[-5:])),
            flush=True,
        )
    text = diff(a.out, arms)
    (a.out / "diff.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
