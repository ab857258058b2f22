"""The built-in tiny model: deterministic build, tokenizer round trip, cache reuse. CPU only, no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qgate.models import model_dir as resolve_model_spec
from qgate.tiny.qwen3 import CONFIG, build_tiny, ensure_tiny, verify_manifest


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_same_seed_gives_identical_files(tiny_dir: Path, tmp_path: Path) -> None:
    again = build_tiny(tmp_path / "again", seed=0)
    files = _manifest(tiny_dir)["files"]
    assert set(files) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    for name in files:
        assert (tiny_dir / name).read_bytes() == (again / name).read_bytes(), name
    assert verify_manifest(again)


def test_other_seed_changes_only_weights(tiny_dir: Path, tmp_path: Path) -> None:
    other = _manifest(build_tiny(tmp_path / "s1", seed=1))["files"]
    base = _manifest(tiny_dir)["files"]
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_weights_have_qwen3_shapes_and_fp16(tiny_dir: Path) -> None:
    from safetensors.torch import load_file

    sd = load_file(str(tiny_dir / "model.safetensors"))
    assert {t.dtype for t in sd.values()} == {__import__("torch").float16}
    assert sd["model.embed_tokens.weight"].shape == (2048, 128)
    assert sd["lm_head.weight"].shape == (2048, 128)
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (64, 128)
    assert sd["model.layers.0.mlp.down_proj.weight"].shape == (128, CONFIG["intermediate_size"])
    assert not (sd["lm_head.weight"] == sd["model.embed_tokens.weight"]).all()
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["max_position_embeddings"] >= 16384 and config["torch_dtype"] == "float16"


def test_tokenizer_round_trips_and_keeps_think_tokens(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert len(tok) == 2048
    text = "Janet’s ducks lay 16 eggs. She sells 1,000 at $2.50 each: -3.5 😀 \\boxed{13}\n#### 13"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    # Digits are split one by one; common words are single tokens.
    assert len(tok.encode("12345")) == 5
    assert len(tok.encode(" eggs")) == 1
    out = "<think>\nwork\n</think>\n\n#### 7<|im_end|>"
    ids = tok.encode(out)
    assert tok.convert_tokens_to_ids("</think>") in ids
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nwork\n</think>\n\n#### 7"
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"


def test_chat_template_generation_prompt_and_thinking_switch(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert on == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off == on + "<think>\n\n</think>\n\n"
    bare = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert not bare.endswith("assistant\n")


def test_ensure_tiny_builds_once_and_repairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_tiny(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny(tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temp dir left behind
    (first / "config.json").write_text("{}")  # a damaged cache entry is rebuilt
    assert verify_manifest(ensure_tiny(tmp_path))
    monkeypatch.setenv("QGATE_CACHE", str(tmp_path))
    assert resolve_model_spec("tiny") == first
    assert resolve_model_spec("/some/model") == Path("/some/model")


def test_cli_model_tiny(tmp_path: Path) -> None:
    from qgate.cli import app

    result = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "m"), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert _manifest(tmp_path / "m")["seed"] == 3
