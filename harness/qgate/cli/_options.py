"""Option types shared by the CLI modules, and the one place user errors become exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3

ContractOpt = Annotated[Path, typer.Option("--contract", "-c", help="contract YAML", dir_okay=False)]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="output directory", file_okay=False)]


class ArmChoice(str, Enum):
    control = "control"
    candidate = "candidate"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one line to stderr and exit: user errors never show a traceback."""
    typer.echo(f"qgate: error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(*error_types: type[BaseException], code: int = EXIT_USAGE) -> Iterator[None]:
    """Map the core's user-facing exceptions to one line and an exit code.

    With no types given, contract and result-file errors (exit 2 by default) are mapped.
    """
    from qgate.contract import ContractError
    from qgate.results import ResultError

    types = error_types or (ContractError, ResultError)
    try:
        yield
    except types as exc:
        fail(str(exc), code)
    except KeyboardInterrupt:
        typer.echo("qgate: interrupted; completed records are on disk (use --resume)", err=True)
        sys.exit(130)


def exit_with(code: int) -> NoReturn:
    raise typer.Exit(code)


Callback = Callable[..., None]
