"""vLLM 0.32's consumer of the QSA top-k on the route's output: `expand_qsa_block_indices` (a Triton
kernel in models/qwen4_exp/nvidia/ops/qsa_indexer.py, unmodified, from the stub tree of
tools/vllm_stub_tree.py) expands each row's first min(visible, k) block indices into token indices
and appends the causal tail and a count column. The route writes the top-k set in increasing index
order, the reference's qsa_topk_by_value the same set in the stable sort's order: vLLM's expansion
of both must give the same tokens as a set per row, and the same count. Also checks the route
against the reference (index order, bitwise). Rows drawn as the bench draws them (the five input
kinds of qgate.ops.cases.topk_case), at the bench's top-k shapes with 1 and 4 rows.

Usage (CUDA GPU; the stub tree, harness/ and route_env/ on PYTHONPATH):
    python kernels_ext/tools/vllm_expand_check.py      -> one JSON object; exit 1 on a mismatch
"""

from __future__ import annotations

import json
import sys

import torch

import qgate_kernels
from qgate.ops.cases import topk_case
from qgate.ops.shapes import MODEL_CONFIG
from qgate_kernels import reference

SHAPES = [(1, 65536, 512, None), (1, 4096, 512, None), (1, 65536, 512, 513), (1, 131072, 2048, None)]
SHAPES += [(4, 65536, 512, None), (4, 131072, 2048, None)]


def expand(
    qsa: object, idx: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, ratio: int
) -> torch.Tensor:
    k = idx.shape[1]
    out = torch.full(
        (idx.shape[0], k * ratio + ratio), -7, dtype=torch.int32, device=idx.device
    )  # [rows, width + 1]
    qsa.expand_qsa_block_indices(idx, positions, visible, ratio, k * ratio, out)  # type: ignore[attr-defined]
    return out


def main() -> int:
    import vllm.models.qwen4_exp.nvidia.ops.qsa_indexer as qsa

    ratio = int(MODEL_CONFIG["indexer_compress_ratio"])
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(int.from_bytes(__import__("os").urandom(6), "little"))
    rows_out = []
    bad = 0
    for rows, length, k, vis in SHAPES:
        case = topk_case(rows, length, k, visible=vis)
        for _ in range(10):  # two draws of each of the five kinds
            s, visible, kk = case.make(gen, dev)
            kind = case.meta["input_kind"](s, visible, kk)
            got = qgate_kernels.qsa_topk(s, visible, kk)  # [rows, k]
            want = reference.qsa_topk(s.cpu(), visible.cpu(), kk)
            by_value = reference.qsa_topk_by_value(s.cpu(), visible.cpu(), kk).to(dev)
            # a decode position in the last compressed block's group or the open one after it
            positions = visible.to(torch.int64) * ratio + torch.randint(
                0, ratio, (rows,), generator=gen, device=dev
            )
            a = expand(qsa, got, positions, visible, ratio)
            b = expand(qsa, by_value, positions, visible, ratio)
            torch.cuda.synchronize()
            same_count = torch.equal(a[:, -1], b[:, -1])
            same_sets = torch.equal(torch.sort(a[:, :-1], dim=1).values, torch.sort(b[:, :-1], dim=1).values)
            exact = torch.equal(got.cpu(), want)
            ok = same_count and same_sets and exact
            bad += not ok
            rows_out.append(
                {
                    "shape": f"{rows}x{length}x{k}" + (f"x{vis}" if vis else ""),
                    "kind": kind,
                    "route_equals_reference": exact,
                }
                | {"expanded_sets_equal": same_sets, "counts_equal": same_count}
            )
    summary = {
        "checked": len(rows_out),
        "mismatches": bad,
        "vllm_file": qsa.__file__,
        "failures": [r for r in rows_out if not all(v for v in r.values() if isinstance(v, bool))],
    }
    print(json.dumps(summary, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
