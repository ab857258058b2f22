"""How far a valid implementation of the HC math lands from the reference, at the screen's measure.

The unfused torch sequence (qgate.ops.cases.unfused_hc: the same operations and roundings, float32
sums in F.linear's order) against the reference (qgate_kernels.reference), on the screen's random
inputs at the production shape, by the screen's ULP measure (qgate.ops.screen.ulp_distance). The
HC tolerance in qgate/contract/ops.py is set from this spread: a bound that this sequence crosses is a
bound that vLLM's own path of the same math can fail.

Usage: python kernels_ext/tools/hc_ulp_spread.py [--draws 1500] [--dtype fp16 --dtype bf16]
Prints one line per dtype and op: median, 99th and 99.9th percentile, max, counts over 32/64/128.
"""

from __future__ import annotations

import argparse

import torch

from qgate.ops.cases import hc_case
from qgate.ops.screen import ulp_distance


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=1500)
    parser.add_argument("--dtype", action="append", choices=["fp16", "bf16"])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for dtype in args.dtype or ["fp16", "bf16"]:
        for op in ("mix", "combine_and_mix", "final"):
            case = hc_case(4, 2048, 320, dtype, op)
            gen = torch.Generator()
            gen.manual_seed(args.seed)
            worst = []
            for _ in range(args.draws):
                inputs = case.make(gen, torch.device("cpu"))
                ref, seq = case.reference(*inputs), case.baseline(*inputs)
                worst.append(max(ulp_distance(s.to(r.dtype), r) for s, r in zip(seq, ref, strict=True)))
            w, n = sorted(worst), len(worst)
            over = {b: sum(x > b for x in w) for b in (32, 64, 128)}
            print(
                f"{dtype} {op:16} draws {n}: median {w[n // 2]:g}, p99 {w[int(n * 0.99)]:g}, "
                f"p99.9 {w[int(n * 0.999)]:g}, max {w[-1]:g}; "
                f"over 32/64/128: {over[32]}/{over[64]}/{over[128]}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
