"""The routes' kernels and vLLM's for the same ops, at the production shapes (TP=4, bf16), each call
after a producer of another kind as in a decode step, eager: the target program for Nsight Compute
(where the decode-step time goes), and on its own (--table) a torch.profiler table of device time per
kernel. Weights rotate over 5 sets only: Nsight Compute flushes the caches before each profiled
kernel, so there every call reads its weights from device memory. Needs a CUDA GPU; vLLM's paths
where the stub tree and the CUTLASS DSL are on PYTHONPATH (else the routes alone).

    ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \\
        --section MemoryWorkloadAnalysis -k regex:'...' python3 kernels_ext/tools/profile_kernels.py
    python3 kernels_ext/tools/profile_kernels.py --table
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from qgate.ops import competitors
from qgate.ops.cases import gemv_case, hc_case, topk_case


def _calls() -> list[tuple[str, Callable[..., Any], list[tuple[Any, ...]], int]]:
    """(name, fn, sets, index of the produced argument)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    out = []
    for n, k in ((24, 2560), (320, 10240), (62080, 2560), (4096, 2560)):
        case = gemv_case(n, k, "bf16")
        sets = [case.make(gen, dev) for _ in range(5)]  # ncu flushes the caches before each kernel
        out.append((f"route gemv {n}x{k}", case.kernel, sets, 1))
        cute = competitors.vllm_linear(n, k, torch.bfloat16)
        if not isinstance(cute, str):
            out.append((f"vLLM CuTe {n}x{k}", cute, sets, 1))
    hc = hc_case(4, 2560, 320, "bf16", "combine_and_mix")
    sets = [hc.make(gen, dev) for _ in range(8)]
    out.append(("route hc combine_and_mix", hc.kernel, sets, 1))
    for name, fn in competitors.hc_competitors(hc.shape, sets[0]).items():
        if not isinstance(fn, str):
            out.append((name, fn, sets, 1))
    for length, k in ((65536, 512), (131072, 2048), (4096, 512)):
        case = topk_case(1, length, k)
        sets = [case.make(gen, dev) for _ in range(5)]  # the five input kinds
        out.append((f"route topk 1x{length} k{k}", case.kernel, sets, 0))
        for name, fn in competitors.topk_competitors(*sets[0]).items():
            if not isinstance(fn, str):
                out.append((f"{name} 1x{length} k{k}", fn, sets, 0))
    return out


def main() -> None:
    calls = _calls()
    for _, fn, sets, _ in calls:  # warm-up: module load, JIT, plans
        fn(*sets[0])
    torch.cuda.synchronize()

    def once() -> None:
        for _, fn, sets, arg in calls:
            for a in sets[:5]:
                a[arg].mul_(1)  # the producer: another kind of kernel writes the input
                fn(*a)

    if "--table" not in sys.argv:
        once()
        torch.cuda.synchronize()
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            once()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
