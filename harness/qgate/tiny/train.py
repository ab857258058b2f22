"""The tiny model trained on the frozen GSM8K items, so that the quality gate can PASS for real on a CPU.

`build_tiny_trained(path)` starts from the random tiny model of the same seed and trains it with AdamW
(full batch of the 16 frozen items, `STEPS` steps, fp32, one CPU thread so that the bytes do not depend on
the machine's core count) to answer each item in the chat format the quality contract uses:

    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n      (prompt, no loss)
    <think>\\nThe answer is {gold}.\\n</think>\\n\\n#### {gold}<|im_end|>  (completion, loss)

Under the contract's sampling (T 1.0, top-p 0.95, top-k 20) an answer survives only when every
completion token has probability > 0.95, so training runs until the loss is far below that (the smallest
teacher-forced token probability is recorded in the manifest). The prompt format here must match the
CPU contract (contracts/quality-cpu.yaml): same user template, no system prompt, default template kwargs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from qgate.gsm8k import FROZEN_SHA256, Item, build_messages, frozen_indices, load_items
from qgate.tiny.qwen3 import (
    DEFAULT_SEED,
    IM_END,
    TINY_VERSION,
    build_tiny,
    default_cache_root,
    ensure_built,
    save_weights,
    write_manifest,
)

TRAIN_VERSION = 1
STEPS = 200
LR = 3e-3
WARMUP_STEPS = 20
USER_TEMPLATE = "{question}"


def completion_text(item: Item) -> str:
    """What the model learns to write after `<|im_start|>assistant\\n` (EOS appended as a token)."""
    return f"<think>\nThe answer is {item.gold}.\n</think>\n\n#### {item.gold}"


def _examples(tok: Any, items: list[Item], user_template: str) -> list[tuple[list[int], list[int]]]:
    eos = tok.convert_tokens_to_ids(IM_END)
    out = []
    for item in items:
        messages = build_messages({"user_template": user_template}, item.question)
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt, dict) or hasattr(prompt, "keys"):  # transformers 5 returns a BatchEncoding
            prompt = prompt["input_ids"]
        completion = tok.encode(completion_text(item), add_special_tokens=False) + [eos]
        out.append(([int(t) for t in prompt], completion))
    return out


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(examples), width), -100, dtype=torch.long)  # [B, T], -100 = no loss
    mask = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    for row, (prompt, completion) in enumerate(examples):
        seq = prompt + completion
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, len(prompt) : len(seq)] = torch.tensor(completion)
        mask[row, : len(seq)] = 1
    return ids, labels, mask


def _min_target_prob(model: Any, ids: Any, labels: Any, mask: Any) -> float:
    import torch

    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # [B, T, V]
    probs = torch.softmax(logits[:, :-1], dim=-1)  # position t predicts token t+1
    target = labels[:, 1:]
    keep = target != -100
    picked = probs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    return float(picked[keep].min())


def train(path: Path, items: list[Item], seed: int, steps: int, user_template: str) -> dict[str, Any]:
    """Train the model in `path` in place; returns figures of the run (loss, min prob, seconds)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        tok = AutoTokenizer.from_pretrained(str(path))
        ids, labels, mask = _batch(_examples(tok, items, user_template), tok.pad_token_id)
        model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
        t0 = time.perf_counter()
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        seconds = time.perf_counter() - t0
        model.eval()
        model = model.half()
        min_prob = _min_target_prob(model.float(), ids, labels, mask)  # fp16-rounded weights
        save_weights(path, model.half().state_dict())
    finally:
        torch.set_num_threads(threads)
    return {
        "final_loss": round(float(loss.detach()), 6),
        "min_token_prob": round(min_prob, 6),
        "train_s": seconds,
    }


def build_tiny_trained(
    path: Path,
    seed: int = DEFAULT_SEED,
    data: Path | None = None,
    steps: int = STEPS,
    user_template: str = USER_TEMPLATE,
) -> Path:
    """Write the tiny model trained on the frozen items into `path`; the same inputs give the same bytes."""
    items, _source = load_items(frozen_indices(), FROZEN_SHA256, cli_data=data)
    path = Path(path)
    build_tiny(path, seed)
    figures = train(path, items, seed, steps, user_template)
    (path / "manifest.json").unlink()
    info = {
        "kind": "tiny-trained",
        "version": TINY_VERSION,
        "train_version": TRAIN_VERSION,
        "seed": seed,
        "steps": steps,
        "items_sha256": FROZEN_SHA256,
        "user_template": user_template,
        "final_loss": figures["final_loss"],
        "min_token_prob": figures["min_token_prob"],
    }
    write_manifest(path, info)
    # Timings vary from run to run: kept beside the model, outside the manifest.
    (path / "train_log.json").write_text(json.dumps(figures, sort_keys=True) + "\n", encoding="utf-8")
    return path


def ensure_trained(cache_dir: Path | None = None, seed: int = DEFAULT_SEED, data: Path | None = None) -> Path:
    """The trained tiny model in the cache (trained on first use, ~1 min)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    name = f"tiny-trained-v{TINY_VERSION}.{TRAIN_VERSION}-seed{seed}-{FROZEN_SHA256[:12]}"
    return ensure_built(root / name, lambda p: build_tiny_trained(p, seed, data))
