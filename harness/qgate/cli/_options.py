"""Option types shared by the CLI modules, and the one place user errors become exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from qgate.errors import QgateError

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INCONCLUSIVE = 4

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
    """Print qgate's user-facing errors as one line and exit with their code (2 bad input, 1 run failed).

    `error_types` adds other exception types (e.g. OSError), which exit with `code`.
    """
    try:
        yield
    except QgateError as exc:
        fail(str(exc), exc.exit_code)
    except error_types as exc:
        fail(str(exc), code)
    except KeyboardInterrupt:
        typer.echo("qgate: interrupted; completed records are on disk (use --resume)", err=True)
        sys.exit(130)


def exit_with(code: int) -> NoReturn:
    raise typer.Exit(code)


Callback = Callable[..., None]
