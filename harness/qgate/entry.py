"""The `qgate` command's entry point (and `python -m qgate`'s): SIGINT and SIGTERM end it in one line,
exit 130 / 143, from its first instruction.

A command's own stop handling (qgate.cli._options.user_errors: what a run kept, the engine's process
group ended) takes over while it runs; before it (the seconds of imports of qgate.cli, scipy and
pydantic, or a command's lazy imports) and after it, this one answers. It raises SystemExit, not
KeyboardInterrupt: click turns an escaped KeyboardInterrupt into "Aborted!" and exit 1. Only the
standard library is imported here, so that it is in place before anything slow loads.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any


class Stop(SystemExit):
    """The SystemExit of a stop (exit 128 + signum), told apart from a command's own."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def stop_line(signum: int, frame: FrameType | None = None) -> None:
    """The handler: one line, then SystemExit(128 + signum), unwinding as an exception does."""
    sys.stderr.write(f"qgate: stopped by {signal.Signals(signum).name}\n")
    raise Stop(128 + signum)


def _stop_even_when_ignored(previous: Any) -> Any:
    """A signal that lands while Python runs a callback (a weakref's, importlib's module-lock cleanup
    during the imports, a __del__) raises the stop where no exception can leave: Python reports it as
    "Exception ignored" and goes on, and the command ran to its end (seen: SIGTERM during `qgate
    compare`'s imports, exit 2 instead of 143). There the stop ends the process at once: nothing of a
    command has begun (the imports) or everything has (after it), so nothing is left half-written."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, Stop):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(unraisable.exc_value.exit_code)
        previous(unraisable)

    return hook


def install() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_line)
    sys.unraisablehook = _stop_even_when_ignored(sys.unraisablehook)


def main() -> None:
    install()
    from qgate.cli import main as cli_main  # seconds of imports: a stop meanwhile is one line

    cli_main()
