"""The GPU contracts (run by tools/gpu_engine on H100s and H200s, docs/gpu.md): they load, and they
keep the engine-side requirements a GPU run needs, the same in both arms, so that a CPU-only CI still
catches a contract edit that would die on the device or measure something else. Fast: no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from qgate.contract import load_contract
from qgate.ops.shapes import MODEL_CONFIG
from qgate.ops.synthetic import ENGINE_EXPERTS, engine_config

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
GPU = [
    CONTRACTS / name
    for name in (
        "qwen4exp-fp16-gpu.yaml",
        "qwen4exp-bf16-gpu.yaml",
        "qwen38-prodshape-fp16.yaml",
        "qwen38-prodshape-bf16.yaml",
        "demo-gpu.yaml",
    )
]
QWEN4EXP = [p for p in GPU if p.name.startswith(("qwen4exp-", "qwen38-prodshape-"))]
SWITCH = "VLLM_SM70_QWEN38_"


def test_the_gpu_set_is_there() -> None:
    assert all(p.is_file() for p in GPU), [p.name for p in GPU if not p.is_file()]


@pytest.mark.parametrize("path", GPU, ids=lambda p: p.name)
def test_gpu_engine_runs_graphs_and_the_arms_differ_only_by_route_switches(path: Path) -> None:
    c = load_contract(path).contract
    assert c.engine.enforce_eager is False  # the routes under CUDA graphs, as users run them
    assert c.engine_for("control") == c.engine_for("candidate")
    ctrl, cand = c.env_for("control"), c.env_for("candidate")
    assert set(ctrl) == set(cand)
    differ = {k for k in ctrl if ctrl[k] != cand[k]}
    assert differ and all(k.startswith(SWITCH) for k in differ), differ
    assert all(ctrl[k] == "0" and cand[k] == "1" for k in differ)


@pytest.mark.parametrize("path", QWEN4EXP, ids=lambda p: p.name)
def test_qwen4exp_on_a_gpu_has_its_engine_shims(path: Path) -> None:
    c = load_contract(path).contract
    fp16 = c.engine.dtype == "float16"
    assert fp16 == ("-fp16" in path.name)
    # stock Qwen4Exp keeps HC in bf16: fp16 dies in both arms without the shim (bf16 needs none)
    assert ("qwen4exp_hc_params_fp16" in c.shims) == fp16
    # on SM90 vLLM's 'auto' picks FlashInfer, which the staged engine lacks
    assert c.engine.gdn_prefill_backend == "triton"


def test_prodshape_contracts_name_their_checkpoints_at_the_published_shapes() -> None:
    fp16, bf16 = (load_contract(CONTRACTS / f"qwen38-prodshape-{d}.yaml").contract for d in ("fp16", "bf16"))
    # vLLM 0.32 runs QSA in bf16 only: fp16 runs the checkpoint without the indexer, QSA route off
    assert fp16.model != bf16.model and fp16.model.endswith("-noqsa")
    assert "VLLM_SM70_QWEN38_QSA_TOPK" not in fp16.env_for("candidate")
    # bf16 runs the QSA layers, but the top-k route is off in both arms: it was slower than vLLM's
    # kernel in the op bench and in the engine's decode step (the contract's comment); the probe keeps
    # the candidate with it, so what it did to the engine is still measured
    assert {bf16.env_for(a)["VLLM_SM70_QWEN38_QSA_TOPK"] for a in ("control", "candidate")} == {"0"}
    probe = (Path(__file__).resolve().parents[1] / "tools/gpu_engine/probes/prod-bf16.txt").read_text()
    assert "qwen38-prodshape-bf16:candidate:VLLM_SM70_QWEN38_QSA_TOPK=1" in probe
    cfg = engine_config(12)
    for key in ("hidden_size", "vocab_size", "hc_count", "hc_lowrank", "linear_num_value_heads", "head_dim"):
        assert cfg[key] == MODEL_CONFIG[key]
    assert cfg["num_experts"] == ENGINE_EXPERTS >= MODEL_CONFIG["num_experts_per_tok"]
    assert cfg["layer_types"].count("indexed_attention") == 3  # every 4th, the model's own pattern
    assert engine_config(2)["layer_types"] == ["linear_attention", "indexed_attention"]
