"""`qgate gates`: every gate by name (qgate.gate_reference). Wiring only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import EXIT_FAIL, exit_with, fail, say
from qgate.gate_reference import PAGE, generate, listing
from qgate.results import atomic_write_text

OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out", "-o", help=f"write the markdown reference here (the committed one: {PAGE})", dir_okay=False
    ),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="exit 1 when --out differs from the code")]


def gates(out: OutOpt = None, check: CheckOpt = False) -> None:
    """List every gate a verdict or an ablation records: name, module, what its failure means, doc;
    --out writes the markdown reference, --check compares it instead."""
    if check:
        if out is None:
            fail(f"--check needs --out FILE (the committed reference: {PAGE})")
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != generate():
            say(f"{out}: differs from the code; run: qgate gates --out {out}", err=True)
            exit_with(EXIT_FAIL)
        say(f"{out}: up to date")
        return
    if out is not None:
        atomic_write_text(out, generate())
        say(f"wrote {out}")
        return
    for row in listing():
        say(f"{row['name']}  [{row['severity']}]  {row['module']}  {row['doc']}")
        say(f"    {row['failure']}")
