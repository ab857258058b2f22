"""`qgate records schema`: the JSON Schema of every record kind, generated from qgate.records. Wiring only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import EXIT_FAIL, exit_with, say
from qgate.records import schema_files
from qgate.results import atomic_write_text

app = typer.Typer(help="The typed record kinds qgate writes.", no_args_is_help=True)
OutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="folder of <kind>.schema.json files", file_okay=False)
]
CheckOpt = Annotated[bool, typer.Option("--check", help="exit 1 when --out differs from the models")]


@app.command("schema")
def schema(out: OutOpt = Path("schemas"), check: CheckOpt = False) -> None:
    """Write the JSON Schema of every record kind into --out (default schemas/); --check compares."""
    files = schema_files()
    if check:
        have = {p.name for p in out.glob("*.schema.json")} if out.is_dir() else set()
        stale = sorted(
            name for name, text in files.items()
            if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
        ) + sorted(have - set(files))  # fmt: skip
        if stale:
            listed = ", ".join(stale)
            say(f"{out}: {listed} differ from the models; run: qgate records schema --out {out}", err=True)
            exit_with(EXIT_FAIL)
        say(f"{out}: up to date ({len(files)} schemas)")
        return
    for name, text in files.items():
        atomic_write_text(out / name, text)
    say(f"wrote {len(files)} schemas into {out}")
