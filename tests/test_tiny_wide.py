"""The demo's wide model (qgate.tiny.wide): zero padding of the MLP keeps the model's function.

Its 16/16 on the frozen items under the contract's sampling is what `qgate demo` checks on real vLLM;
here: the padded model's logits equal the narrow model's, and the built directory is what vLLM loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgate.tiny.qwen3 import build_tiny
from qgate.tiny.wide import build_wide, widen_state_dict


def test_padding_keeps_every_logit(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import Qwen3ForCausalLM

    narrow_dir = build_tiny(tmp_path / "narrow", seed=0)
    wide_dir = build_wide(tmp_path / "wide", narrow_dir, intermediate=1024)
    config = json.loads((wide_dir / "config.json").read_text())
    manifest = json.loads((wide_dir / "manifest.json").read_text())
    assert config["intermediate_size"] == 1024 and manifest["kind"] == "tiny-trained-wide"
    assert manifest["intermediate_size"] == 1024 and "model.safetensors" in manifest["files"]
    ids = torch.tensor([[5, 17, 300, 42, 1999, 7, 7, 100]])  # [1, T]
    logits = []
    for d in (narrow_dir, wide_dir):
        model = Qwen3ForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits)  # [1, T, V]
    gate = model.model.layers[0].mlp.gate_proj.weight
    assert tuple(gate.shape) == (1024, 128) and bool((gate[384:] == 0).all())
    # Zero terms add exact zeros; only BLAS's order over the wider K may move the last bits.
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(logits[1].argmax(-1), logits[0].argmax(-1))


def test_widen_pads_only_the_mlp() -> None:
    torch = pytest.importorskip("torch")
    sd = {
        "model.layers.0.mlp.gate_proj.weight": torch.ones(3, 2),
        "model.layers.0.mlp.up_proj.weight": torch.ones(3, 2),
        "model.layers.0.mlp.down_proj.weight": torch.ones(2, 3),
        "model.layers.0.self_attn.o_proj.weight": torch.ones(2, 2),
    }
    wide = widen_state_dict(sd, 5)
    assert tuple(wide["model.layers.0.mlp.gate_proj.weight"].shape) == (5, 2)
    assert tuple(wide["model.layers.0.mlp.down_proj.weight"].shape) == (2, 5)
    assert float(wide["model.layers.0.mlp.up_proj.weight"].sum()) == 6.0  # the padding is zero
    assert wide["model.layers.0.self_attn.o_proj.weight"] is sd["model.layers.0.self_attn.o_proj.weight"]
