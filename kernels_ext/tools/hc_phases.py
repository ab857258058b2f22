"""Where the HC route's time goes on a GPU: one JSON line for this process's QGATE_HC_IMPL,
QGATE_HC_PDL and QGATE_HC_PHASE_STOP (read once per process; with a stop the one-launch kernel returns
after that phase and its outputs are meaningless).

Stops: QGATE_HC_IMPL=tma (fused_hc_tma.cuh): 5 the weights' bulk copies alone (issue, wait, return),
1 inputs, combine and norm (then the weights awaited), 2 down rows, 3 grid barrier. Other impls (the
register-loading one-launch kernel of fused_hc_persistent.cuh): 1 inputs and norm, 2 down, 3 barrier.
QGATE_HC_CLOCKS=1 (tma3, tma4): the kernel also records clock64() cycles since each block's entry at
8 points (0 griddepcontrol.wait returned, 1 inputs arrived, 2 norm done, 3 down rows arrived, 4 down
rows done, 5 barrier passed, 6 partials + xn loaded and silu, 7 up dots done), max and min over blocks,
printed as "HCCLK" lines after the calls on slots 0, 8, 16, ... (a one-thread kernel; its line is one
call's figures; a slot's first line has min 0).
Kernel times (CUPTI) are the kernel's own only without PDL (QGATE_HC_PDL=0): under PDL a kernel
starts while the previous one runs, and its span includes that wait.

Production shape (HC 4, hidden 2048, rank 320), combine_and_mix, bf16, 8 weight sets rotated (87 MB,
more than the 60 MiB L2: the weights come from HBM). Reports the CUDA-graph replay time per call
(8 calls a graph, median of 30 replays) and the kernels' own durations (torch profiler, CUPTI).
Usage: QGATE_HC_IMPL=tma QGATE_HC_PDL=0 QGATE_HC_PHASE_STOP=2 python kernels_ext/tools/hc_phases.py
"""

from __future__ import annotations

import json
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import qgate_kernels


def main() -> None:
    dev, dt, hc, hs, rank, sets = torch.device("cuda"), torch.bfloat16, 4, 2048, 320, 8
    d = hc * hs
    args = []
    for _ in range(sets):
        args.append(
            (
                torch.randn(1, d, device=dev, dtype=dt),
                torch.randn(1, hs, device=dev, dtype=dt),
                torch.randn(1, hc, device=dev, dtype=dt),
                torch.randn(d, device=dev, dtype=dt) * 0.1,
                torch.randn(rank + 16, d, device=dev, dtype=dt) * d**-0.5,
                torch.randn(d, rank, device=dev, dtype=dt) * rank**-0.5,
            )
        )
    kw = {"hc_count": hc, "lora_rank": rank, "eps": 1e-6}

    def step() -> None:
        for a in args:
            qgate_kernels.hc_combine_and_mix(*a, **kw)

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step()
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / sets)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            graph.replay()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per_kernel.setdefault(e.name.split("(")[0][-50:], []).append(e.device_time_total)
    print(
        json.dumps(
            {
                "impl": os.environ.get("QGATE_HC_IMPL", "split"),
                "stop": int(os.environ.get("QGATE_HC_PHASE_STOP", "0")),
                "pdl": os.environ.get("QGATE_HC_PDL", "1"),
                "graph_us_per_call": round(statistics.median(times), 2),
                "kernel_us": {k: round(statistics.median(v), 2) for k, v in per_kernel.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
