"""Hunt for ordering bugs of the static-weight (PDL) GEMV launch: chains where each GEMV's x is
written by the kernel just before it, eager and under CUDA-graph replay, many times, each result
compared bit for bit with the same chain of plain launches. Prints mismatch counts per scenario.

Usage (CUDA GPU): python kernels_ext/tools/pdl_race_check.py [--iters 200]
"""

from __future__ import annotations

import argparse
import sys

import torch

import qgate_kernels


def chain(ws: list[torch.Tensor], x0: torch.Tensor, static: bool, lead: bool) -> torch.Tensor:
    y = x0 * 1.0 if lead else x0  # lead: a plain kernel first, so no graph root is a PDL launch
    for i, w in enumerate(ws):
        y = qgate_kernels.gemv(w, y, static_weight=static)
        if i % 2:
            y = torch.tanh(y * 1.5)
    return y


def graph_of(fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    bad = 0
    for k in (2048, 4096):
        ws = [(torch.randn(k, k, generator=gen, device="cuda") * k**-0.5).half() for _ in range(6)]
        x0 = torch.randn(k, generator=gen, device="cuda").half()
        counts = {}
        for lead in (False, True):
            eager = 0
            for _ in range(args.iters // 4):
                x0.copy_(torch.randn(k, generator=gen, device="cuda").half())
                eager += not torch.equal(chain(ws, x0, True, lead), chain(ws, x0, False, lead))
            graph, out = graph_of(lambda ws=ws, x0=x0, lead=lead: chain(ws, x0, True, lead))
            replay = 0
            for _ in range(args.iters):
                x0.copy_(torch.randn(k, generator=gen, device="cuda").half())
                graph.replay()
                torch.cuda.synchronize()
                replay += not torch.equal(out, chain(ws, x0, False, lead))
            counts[f"lead={lead}"] = (eager, args.iters // 4, replay, args.iters)
            bad += eager + replay
        for key, (e, en, r, rn) in counts.items():
            print(f"{k}x{k} {key}: eager mismatches {e}/{en}, graph replay mismatches {r}/{rn}")
    print("PDL race check:", "FAIL" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
