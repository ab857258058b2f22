"""The error rates of `qgate bench ops --device cpu`'s timed-output audit (docs/integrity.md).

Times the demo model's seven GEMV shapes as the benchmark does (15 reps) with the real kernels and
with each gamed GEMV of tests/fixtures/async_routes.py in the `route` rows, and prints, per shape,
the timed samples checked and those whose output was not the probe input's result when the timer
stopped, the Python threads the audit named, and the route's and the op's medians. Real kernels: every
refused sample is a false refusal; gamed ones: every sample that passed is a miss.

    PYTHONPATH=harness:kernels_ext python tools/bench_audit_rates.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    sys.path.insert(0, str(FIXTURES))
    import async_routes

    from qgate.ops import bench_cpu
    from qgate.ops.screen import _replaced_ops

    cfg = {"reps": args.reps, "warmup": 3, "min_sample_us": 2000.0}
    gen = torch.Generator().manual_seed(44)
    impls = {"real": None, "background": async_routes.background_gemv,
             "pipelined": async_routes.pipelined_gemv, "lazy": async_routes.lazy_gemv}  # fmt: skip
    rows = []
    for label, impl in impls.items():
        for s in bench_cpu.TINY_GEMV_SHAPES + bench_cpu.WIDE_GEMV_SHAPES:
            with _replaced_ops({"gemv": impl} if impl else {}):
                case = bench_cpu.bench_gemv(s["n"], s["k"], gen, cfg, tiny=False)
            audit = case["audit"]
            row = {
                "route_impl": label,
                "shape": case["label"],
                "checked": sum(a["checked"] for a in audit["implementations"].values()),
                "wrong": {n: a["wrong"] for n, a in audit["implementations"].items() if a["wrong"]},
                "threads": audit["threads_started"],
                "refused": bool(case["audit_failures"]),
                "route_us": case["timing"]["route"]["median_us"],
                "op_us": case["timing"]["op"]["median_us"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
