"""The operator screen's default shapes are the production model's: derived from the published config,
tied to the installed vLLM's Qwen4Exp SM90 GEMM plan table (tuned on the H200 for this model at TP=4).

vLLM's sources are read as text (ast), not imported: importing vLLM takes a minute on a loaded CPU.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from qgate.ops import shapes
from qgate.ops.cases import DEFAULT_SHAPES, build_cases

CFG = shapes.MODEL_CONFIG


def _vllm_file(rel: str) -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    return Path(spec.origin).parent / rel


def _plan_keys(name: str) -> set[tuple[int, int]]:
    tree = ast.parse(_vllm_file("models/qwen4_exp/nvidia/low_latency_gemm.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            assert isinstance(node.value, ast.Dict)
            return {ast.literal_eval(k) for k in node.value.keys if k is not None}
    raise AssertionError(f"{name} not found in vLLM's low_latency_gemm.py")


def test_the_config_is_the_published_production_config() -> None:
    assert (CFG["hidden_size"], CFG["hc_count"], CFG["hc_lowrank"]) == (2560, 4, 320)
    assert (CFG["linear_num_key_heads"], CFG["linear_num_value_heads"]) == (16, 48)
    assert (CFG["num_attention_heads"], CFG["num_key_value_heads"], CFG["head_dim"]) == (24, 2, 256)
    assert (CFG["num_experts"], CFG["num_experts_per_tok"], CFG["vocab_size"]) == (512, 10, 248320)
    layers, every = CFG["num_hidden_layers"], CFG["full_attention_interval"]
    assert (layers - layers // every, layers // every) == (36, 12)


def test_tp4_projections_are_vllms_sm90_plan_table() -> None:
    """Every shape vLLM planned for this model at TP=4 is one of ours, with the role its comment names."""
    plans = _plan_keys("QWEN4_EXP_SM90_GEMM_PLANS")
    by_role = {p.role: (p.n, p.k) for p in shapes.projections(CFG, 4)}
    planned = {
        "in_proj_qkvz": (4096, 2560),  # "GDN fused QKVZ projection, TP=4"
        "in_proj_ba": (24, 2560),  # "GDN fused B/A projection"
        "out_proj": (2560, 1536),  # "GDN and QSA output projections"
        "o_proj": (2560, 1536),
        "qkv_proj": (4224, 2560),  # "QSA fused QKV/gate + replicated indexer Q/K"
        "gate_up_proj": (320, 2560),  # "Shared-expert fused gate/up projection"
        "lm_head": (62080, 2560),
        "input_mix_weight_down": (320, 10240),  # "Final HC down projection"
    }
    assert {r: by_role[r] for r in planned} == planned
    assert set(planned.values()) == plans
    # The HC down+inject GEMM of vLLM's hc_down_silu: "K=10240, N=324" (R + HC rows, before the pad).
    src = _vllm_file("models/qwen4_exp/nvidia/ops/cute_dsl/hc_down_silu.py").read_text()
    d, rows = CFG["hc_count"] * CFG["hidden_size"], CFG["hc_lowrank"] + CFG["hc_count"]
    assert f"K={d}, N={rows}" in src


def test_tp1_is_tp4_unsharded() -> None:
    one, four = ({p.role: p for p in shapes.projections(CFG, tp)} for tp in (1, 4))
    for role, p in one.items():
        q = four[role]
        if p.split == "column" and role != "qkv_proj":
            assert (p.n, p.k) == (4 * q.n, q.k), role
        elif p.split == "row":
            assert (p.n, p.k) == (q.n, 4 * q.k), role
        elif p.split == "replicated":
            assert (p.n, p.k) == (q.n, q.k), role
    # QKV: Q + gate split, the 2 KV heads replicated at TP=4 (one a GPU), the indexer replicated.
    assert one["qkv_proj"].n == 2 * 24 * 256 + 2 * 2 * 256 + 5 * 128 == 13952
    assert four["qkv_proj"].n == 2 * 6 * 256 + 2 * 1 * 256 + 5 * 128 == 4224


def test_default_shapes_are_the_production_shapes_at_tp4_then_tp1() -> None:
    gemv = [(s["n"], s["k"]) for s in DEFAULT_SHAPES["fp16_gemv"]]
    tp4 = {(p.n, p.k) for p in shapes.projections(CFG, 4) if p.role in shapes.GEMV_DEFAULT_ROLES}
    tp1 = {(p.n, p.k) for p in shapes.projections(CFG, 1) if p.role in shapes.GEMV_DEFAULT_ROLES}
    assert tp4 | tp1 | {(320, 10240)} == set(gemv) and gemv[0] == (2560, 1536)
    assert {(2560, 1536), (4224, 2560), (62080, 2560), (248320, 2560), (512, 2560), (1, 2560)} <= set(gemv)
    hc = {(s["hc_count"], s["hidden"], s["lora_rank"]) for s in DEFAULT_SHAPES["fused_hc_fp16"]}
    assert hc == {(4, 2560, 320)}
    gdn = {(s["num_k_heads"], s["num_v_heads"], s["hidden"]) for s in DEFAULT_SHAPES["fused_gdn_input_fp16"]}
    assert gdn == {(4, 12, 2560), (16, 48, 2560)}
    topk = DEFAULT_SHAPES["qsa_topk"]
    assert topk[0] == {"rows": 1, "length": 65536, "k": 512}  # budget 2048 / 4 over 262,144 / 4
    assert any(s["rows"] > 1 and s["length"] == 65536 for s in topk)  # partial visible_blocks rows


def test_topk_case_draws_indexer_scores_and_partial_rows() -> None:
    (case,) = build_cases(["qsa_topk"], {"qsa_topk": [{"rows": 3, "length": 4096, "k": 512}]}, False)
    gen = torch.Generator().manual_seed(0)
    kinds, partial = [], 0
    for _ in range(5):
        logits, visible, k = case.make(gen, torch.device("cpu"))
        kinds.append(case.meta["input_kind"](logits, visible, k))
        assert int(visible[0]) == 4096 and bool((visible[1:] >= 256).all()) and k == 512
        partial += int((visible[1:] < 4096).sum())
        assert torch.equal(case.kernel(logits, visible, k)[0], case.reference(logits, visible, k)[0])
    assert kinds == ["continuous", "ties", "relu_sum", "exp3", "integers"] and partial >= 8
    first = build_cases(["qsa_topk"], {"qsa_topk": [{"rows": 2, "length": 8192, "k": 512}]}, False)[0]
    gen = torch.Generator().manual_seed(1)
    scores = [first.make(gen, torch.device("cpu"))[0] for _ in range(3)][2]  # the third draw: the indexer's
    row = scores[0]
    # relu'd dot products summed over 4 heads: non-negative, exact zeros where all 4 are cut, continuous top
    assert bool((row >= 0).all()) and int((row == 0).sum()) > 0 and row.unique().numel() > 7000
