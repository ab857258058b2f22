"""`qgate contract doc`: the contract reference generated from the schema. Wiring only.

Mounted under the contract group (qgate.cli): `contract.app.command("doc")(contract_doc.doc)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qgate.cli._options import EXIT_FAIL, exit_with, fail, say, say_text
from qgate.contract.reference import PAGE, generate
from qgate.results import atomic_write_text

app = typer.Typer(help="The contract reference, generated from the schema.")
DocOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out", "-o", help=f"write here (the committed one: {PAGE}; default: print)", dir_okay=False
    ),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="exit 1 when --out differs from the schema")]


@app.command("doc")
def doc(out: DocOutOpt = None, check: CheckOpt = False) -> None:
    """Print the contract reference (markdown), or write it to --out; --check compares instead."""
    text = generate()
    if check:
        if out is None:
            fail(f"--check needs --out FILE (the committed reference: {PAGE})")
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            say(f"{out}: differs from the schema; run: qgate contract doc --out {out}", err=True)
            exit_with(EXIT_FAIL)
        say(f"{out}: up to date")
        return
    if out is None:
        say_text(text, nl=False)
        return
    atomic_write_text(out, text)
    say(f"wrote {out}")
