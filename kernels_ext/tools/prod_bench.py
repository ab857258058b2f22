"""`qgate bench ops` at the production model's per-GPU TP=4 shapes (Qwen4Exp, H200 decode), route
beside its baseline and what vLLM itself runs (harness/qgate/ops/competitors.py), one record: the
decode-step condition (the headline), back to back, and the GDN and attention layer chains
(harness/qgate/ops/chains.py).

Shapes (N x K): GEMV 4096x2560 (GDN qkvz), 4224x2560 (QSA qkv + indexer), 2560x1536 (GDN / QSA out),
24x2560 (GDN b/a), 320x2560 (shared-expert gate/up), 62080x2560 (lm_head), 320x10240 (final HC
down), fp16 and bf16; HC 4 streams of 2560, rank 320, mix / combine_and_mix / final, fp16 and bf16;
GDN input (4096 + 24) x 2560 (4 key, 12 value heads of 128); top-k k 512 over 65,536 and 4,096
blocks and over 513 visible of 65,536, and 1 x 131072, k 2048 (the case's input kinds: continuous,
steps of 0.25, integers, ReLU-sum indexer scores, exp(3 N(0,1))).

`--tp 1`: the same at one GPU's shapes, as the H200 engine runs the production-shape checkpoint
(qgate.ops.shapes.projections at TP 1: GEMV 16384x2560 is the GDN qkvz (its GDN-input case: 16 key, 48
value heads), 13952x2560 QSA qkv + indexer, 2560x6144 GDN / QSA out, 1280x2560 and 2560x640 the
shared expert, 512x2560 the router, 248320x2560 the lm_head; HC and top-k as at TP 4): the op bench
beside the engine's decode step (kernels_ext/BENCH.md, "In the engine") without the TP difference.

Usage (CUDA GPU, repository root, harness/ and route_env/ on PYTHONPATH):
    python kernels_ext/tools/prod_bench.py OUT_DIR [ROUTE,ROUTE...] [--tp 1]   (default: every route, TP 4)
Writes OUT_DIR/bench.json and OUT_DIR/bench.md and prints the markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qgate.contract.ops import Bench
from qgate.ops.bench import run_bench
from qgate.ops.cases import build_cases
from qgate.ops.shapes import GEMV_DEFAULT_ROLES, MODEL_CONFIG, projections
from qgate.report.ops import bench_markdown
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK

GEMV = [(4096, 2560), (4224, 2560), (2560, 1536), (24, 2560), (320, 2560), (62080, 2560), (320, 10240)]
SHAPES = {
    ROUTE_GEMV: [{"n": n, "k": k, "dtype": dt} for dt in ("bf16", "fp16") for n, k in GEMV],
    ROUTE_HC: [
        {"hc_count": 4, "hidden": 2560, "lora_rank": 320, "dtype": dt, "op": op}
        for dt in ("bf16", "fp16")
        for op in ("mix", "combine_and_mix", "final")
    ],
    ROUTE_GDN: [
        {
            "hidden": 2560,
            "num_k_heads": 4,
            "num_v_heads": 12,
            "head_k_dim": 128,
            "head_v_dim": 128,
            "dtype": dt,
        }
        for dt in ("bf16", "fp16")
    ],
    ROUTE_TOPK: [
        {"rows": 1, "length": 65536, "k": 512},
        {"rows": 1, "length": 4096, "k": 512},
        {"rows": 1, "length": 65536, "k": 512, "visible": 513},
        {"rows": 1, "length": 131072, "k": 2048},
    ],
}


def shapes_at_tp(tp: int) -> dict[str, list[dict]]:
    """SHAPES with the GEMV and GDN-input shapes of tensor parallel size tp (qgate.ops.shapes): every
    GEMV role of the default set and the final HC down projection, the GDN heads split by tp."""
    if tp == 4:
        return SHAPES
    gemv = [
        (p.n, p.k)
        for p in projections(MODEL_CONFIG, tp)
        if p.role in GEMV_DEFAULT_ROLES or p.role == "input_mix_weight_down"
    ]
    nk, nv = MODEL_CONFIG["linear_num_key_heads"], MODEL_CONFIG["linear_num_value_heads"]
    gdn = [{**s, "num_k_heads": nk // tp, "num_v_heads": nv // tp} for s in SHAPES[ROUTE_GDN]]
    return {
        **SHAPES,
        ROUTE_GEMV: [
            {"n": n, "k": k, "dtype": dt} for dt in ("bf16", "fp16") for n, k in dict.fromkeys(gemv)
        ],
        ROUTE_GDN: gdn,
    }


def main() -> None:
    args = sys.argv[1:]
    tp = 4
    if "--tp" in args:
        i = args.index("--tp")
        tp = int(args[i + 1])
        del args[i : i + 2]
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    shapes = shapes_at_tp(tp)
    routes = args[1].split(",") if len(args) > 1 else list(shapes)
    unknown = [r for r in routes if r not in shapes]
    if unknown:
        print(f"prod_bench: unknown route {unknown[0]!r} (known: {', '.join(shapes)})", file=sys.stderr)
        raise SystemExit(2)
    cases = build_cases(routes, shapes, default_shapes=False)
    record = run_bench(cases, Bench().model_dump(), "cuda")
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    md = bench_markdown(record)
    (out / "bench.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
