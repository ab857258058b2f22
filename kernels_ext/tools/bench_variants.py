"""Time the tuning variants of the routes in this process's environment (the QGATE_GEMV_* and
QGATE_TOPK_* switches are read once per process): one JSON line per case.

Usage: QGATE_GEMV_BLOCKS_PER_SM=1 python kernels_ext/tools/bench_variants.py --routes fp16_gemv >> v.jsonl
Needs a CUDA GPU; uses qgate.ops (harness/ on PYTHONPATH) for the cases and the timer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from qgate.ops.bench import bench_case, copy_bandwidth
from qgate.ops.cases import DEFAULT_SHAPES, build_cases


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--routes", nargs="+", default=list(DEFAULT_SHAPES))
    parser.add_argument("--tag", default="")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(int.from_bytes(os.urandom(6), "little"))
    copy = copy_bandwidth(dev)["best"]
    cfg = {"warmup": 3, "reps": args.reps, "rotate_bytes": 256 * 2**20, "max_sets": 512}
    env = {k: v for k, v in os.environ.items() if k.startswith("QGATE_")}
    for case in build_cases(args.routes, {}, True):
        r = bench_case(case, gen, dev, cfg, copy)
        r.pop("raw_us")
        print(json.dumps({"tag": args.tag, "env": env, "copy_gb_s": copy, **r}))
        t = r["route_timing"]
        plain = r.get("plain_timing", {}).get("median_us", float("nan"))
        after = r.get("after_producer", {}).get("route_us", float("nan"))
        print(
            f"{args.tag:24} {case.route:22} {case.label:20} {t['median_us']:8.2f} us "
            f"{t['gb_s'] / 1000:5.2f} TB/s x{r['speedup']:.2f} vs {r['baseline_timing']['median_us']:.2f} us"
            f" | plain {plain:.2f} | after producer {after:.2f}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
