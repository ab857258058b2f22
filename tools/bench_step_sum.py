"""What the op bench predicts for one decode step of the whole model: each GEMV role's decode-step us
(route, and the fastest competitor that ran: what vLLM runs there) times its calls a step, summed, and
split by the stream vLLM runs it on. The figure docs/evidence/kernels-in-engine.md ("The op bench on
the same card") puts beside the engine's measured effect of the GEMV route.

Calls a step: qgate.ops.shapes.calls_a_step on the model config (out_proj in every GDN layer, qkv_proj
and o_proj in every attention layer, the router and the shared expert's three GEMVs in every layer, one
lm_head). The shapes are qgate.ops.shapes.projections' at the
bench record's TP; a role whose shape the record lacks is an error, not a zero.

Streams: vLLM runs the MoE's shared expert on its aux stream beside the router and the routed experts
(vllm/model_executor/layers/fused_moe/runner/shared_experts.py), so its GEMVs' time is hidden behind
the main stream's in the engine unless the aux stream is the longer one; the bench times every call
alone between a producer and a consumer and cannot see that.

    R=docs/evidence/gpu-runs/2026-12-05-h100-s7/bench-gemv/bench-tp1
    python tools/bench_step_sum.py $R/bench.json --tp 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("harness", "route_env")]

from qgate.ops.shapes import GEMV_DEFAULT_ROLES, MODEL_CONFIG, calls_a_step, projections  # noqa: E402

AUX_ROLES = ("gate_up_proj", "down_proj", "shared_expert_gate")  # the shared expert's, on vLLM's aux stream


def step_sum(record: dict[str, Any], tp: int, dtype: str = "bf16") -> dict[str, Any]:
    """Per role and summed: calls, route us and competitor us a call and a step (decode-step condition)."""
    cases = {
        (c["shape"]["n"], c["shape"]["k"]): c
        for c in record["cases"]
        if c["route"] == "fp16_gemv" and c["shape"].get("dtype", "fp16") == dtype and "decode_step" in c
    }
    shapes = {p.role: (p.n, p.k) for p in projections(MODEL_CONFIG, tp)}
    rows = []
    calls = calls_a_step(MODEL_CONFIG)
    for role in GEMV_DEFAULT_ROLES:
        case = cases.get(shapes[role])
        if case is None:
            raise SystemExit(f"bench_step_sum: no {dtype} GEMV case of {shapes[role]} ({role}) in the record")
        step = case["decode_step"]
        route, other = step["route_us"], min(step["competitors_us"].values())
        rows.append(
            {
                "role": role,
                "shape": shapes[role],
                "calls": calls[role],
                "stream": "aux" if role in AUX_ROLES else "main",
                "route_us": route,
                "competitor_us": other,
                "saving_us_a_step": calls[role] * (other - route),
            }
        )
    total = {
        s: sum(r["saving_us_a_step"] for r in rows if s in ("all", r["stream"]))
        for s in ("all", "main", "aux")
    }
    return {
        "rows": rows,
        "route_us_a_step": sum(r["calls"] * r["route_us"] for r in rows),
        "competitor_us_a_step": sum(r["calls"] * r["competitor_us"] for r in rows),
        "saving_us_a_step": total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", type=Path, help="prod_bench.py's bench.json")
    ap.add_argument("--tp", type=int, default=1, help="the TP the bench ran at (prod_bench.py --tp)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args()
    try:
        record = json.loads(args.bench_json.read_text())
        s = step_sum(record, args.tp, args.dtype)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # one line, no traceback
        raise SystemExit(f"bench_step_sum: {args.bench_json}: not a prod_bench.py record ({exc!r})") from None
    print("| role | shape | calls a step | stream | route us | competitor us | saving us a step |")
    print("|---|---|---|---|---|---|---|")
    for r in s["rows"]:
        n, k = r["shape"]
        print(
            f"| {r['role']} | {n} x {k} | {r['calls']} | {r['stream']} | {r['route_us']:.2f} | "
            f"{r['competitor_us']:.2f} | {r['saving_us_a_step']:.1f} |"
        )
    t = s["saving_us_a_step"]
    print(
        f"\nA step: route {s['route_us_a_step']:.1f} us, competitor {s['competitor_us_a_step']:.1f} us; "
        f"saving {t['all']:.1f} us, of it {t['main']:.1f} on the main stream and {t['aux']:.1f} on vLLM's "
        "aux stream."
    )


if __name__ == "__main__":
    main()
