"""The `qgate` command's entry point (and `python -m qgate`'s): SIGINT and SIGTERM end it in one line,
exit 130 / 143, from its first instruction.

A command's own stop handling (qgate.cli._options.user_errors: what a run kept, the engine's process
group ended) takes over while it runs; before it (the seconds of imports of qgate.cli, scipy and
pydantic, or a command's lazy imports) and after it, this one answers. It raises SystemExit, not
KeyboardInterrupt: click turns an escaped KeyboardInterrupt into "Aborted!" and exit 1. Only the
standard library is imported here, so that it is in place before anything slow loads.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def stop_line(signum: int, frame: FrameType | None = None) -> None:
    """The handler: one line, then SystemExit(128 + signum), unwinding as an exception does."""
    sys.stderr.write(f"qgate: stopped by {signal.Signals(signum).name}\n")
    raise SystemExit(128 + signum)


def install() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_line)


def main() -> None:
    install()
    from qgate.cli import main as cli_main  # seconds of imports: a stop meanwhile is one line

    cli_main()
