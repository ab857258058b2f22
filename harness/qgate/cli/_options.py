"""Option types shared by the CLI modules, and the one place user errors become exit codes."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from qgate.engine.procs import Stopped, stop_signals
from qgate.errors import QgateError, RunFailure
from qgate.report.escape import term, term_lines

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INCONCLUSIVE = 4

ContractOpt = Annotated[Path, typer.Option("--contract", "-c", help="contract YAML", dir_okay=False)]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="output directory", file_okay=False)]
KillLeftoversOpt = Annotated[
    bool,
    typer.Option(
        "--kill-leftovers",
        help="end live processes of an earlier run in --out (default: refuse to start while they live)",
    ),
]


class ArmChoice(str, Enum):
    control = "control"
    candidate = "candidate"


class DeviceChoice(str, Enum):
    """Where the routes' ops run: auto is CUDA when torch sees a GPU (qgate.ops.run.resolve_device)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DtypeChoice(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"


# click's ClickException: Typer 0.29 vendors click and names it nowhere public, older Typers re-export
# click's; BadParameter (public in both) derives from it (BadParameter -> UsageError -> ClickException).
_CLICK_EXCEPTION: Any = typer.BadParameter.__mro__[2]


class OneLineUsageErrors(TyperGroup):
    """The top-level group: a bad value (one not among an option's choices, a missing option, a number
    that is none) is one line and exit 2, as every other bad input is (user_errors), not a usage box.
    Everything else is Typer's standalone run, done here: click's run without standalone mode raises
    the error instead of printing it."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        from typer import rich_utils

        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.BadParameter as exc:
            ctx = getattr(exc, "ctx", None)
            where = f" (`{ctx.command_path} --help`)" if ctx is not None else ""
            message = exc.format_message().replace("Value error, ", "", 1)  # pydantic's prefix (Typer 0.29)
            typer.echo(f"qgate: error: {term(message)}{where}", err=True)
            sys.exit(exc.exit_code)
        except _CLICK_EXCEPTION as exc:  # an unknown option or command, the bare command: as Typer shows it
            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except typer.Abort:
            rich_utils.rich_abort_error()
            sys.exit(1)
        # An exit code (typer.Exit) comes back as an int; a command's own return value is not one.
        sys.exit(code if type(code) is int else 0)


def say(message: object = "", err: bool = False, nl: bool = True) -> None:
    """Print one line to stdout (or stderr): every CLI line goes through here (or say_text), so a
    contract's or a record's string never sends a terminal control byte (BEL, ESC/OSC, CR, a newline
    that splits the line: report.escape.term) raw."""
    typer.echo(term(message), err=err, nl=nl)


def say_text(message: object, err: bool = False, nl: bool = True) -> None:
    """say() for a text of many lines qgate made (a rendered table, JSON): its line breaks kept."""
    typer.echo(term_lines(message), err=err, nl=nl)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one line to stderr and exit: user errors never show a traceback."""
    typer.echo(f"qgate: error: {term(message)}", err=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(
    *error_types: type[BaseException], code: int = EXIT_USAGE, kept: Callable[[], str] | None = None
) -> Iterator[None]:
    """Print qgate's user-facing errors as one line and exit with their code (2 bad input, 1 run failed).

    `error_types` adds other exception types, which exit with `code`; an OSError (an unwritable --out,
    a full disk) is one line naming the path, exit 2. SIGINT and SIGTERM
    stop the command (the launcher ends its engine processes on the way out): one line says what was
    kept (`kept()`, e.g. the reps on disk) and the exit code is 130 / 143.
    """
    try:
        with stop_signals():
            yield
    except RunFailure as exc:  # a run that failed keeps what it measured: say so, and the way on
        line = str(exc)
        if kept is not None:
            line += f"; kept {_kept(kept)}; to continue, fix the cause and run the same command with --resume"
        fail(line, exc.exit_code)
    except QgateError as exc:
        fail(str(exc), exc.exit_code)
    except error_types as exc:
        fail(str(exc), code)
    except OSError as exc:  # an unwritable --out, a full disk, a folder where a file should be
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}", EXIT_USAGE)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        line = f"qgate: stopped by {signal.Signals(signum).name}"
        if kept is not None:  # a run: what it saved stays, --resume continues from it
            line += f"; kept {_kept(kept)}; to continue, run the same command with --resume"
        say(line, err=True)
        sys.exit(128 + signum)


def _kept(kept: Callable[[], str]) -> str:
    try:
        return kept()
    except Exception:  # an unreadable result must not turn the message into a traceback
        return "the completed records on disk"


def exit_with(code: int) -> NoReturn:
    raise typer.Exit(code)


Callback = Callable[..., None]


UntilDecidedOpt = Annotated[
    bool,
    typer.Option(
        "--until-decided",
        help="add one launch of every arm at a time (interleaved), looking at control against candidate "
        "after each (group-sequential, O'Brien-Fleming spending), until PASS or FAIL is shown or "
        "--max-launches is reached",
    ),
]
# The design's boundaries take seconds to plan per ten looks (measured: 18 s for 100, 165 s for 1,000),
# and no night runs a hundred engine starts per arm: a larger N (a 401-digit one) is a typo, said at once.
MAX_LAUNCHES_CAP = 100
MaxLaunchesOpt = Annotated[
    int,
    typer.Option(
        "--max-launches",
        min=2,
        max=MAX_LAUNCHES_CAP,
        help="with --until-decided: launches per arm at the last look",
    ),
]
# `ablate` and `compare`: tools/gpu_engine/profile_decode.py's folder, read by qgate.timeline.read_timeline
TimelineOpt = Annotated[
    Path | None,
    typer.Option(
        "--timeline",
        help="profile_decode.py's output folder (<arm>.json per arm): a decode-step timeline in the report",
    ),
]
