"""The errors a user can cause or meet: the CLI prints them as one line and exits with `exit_code`.

Anything else that escapes is a bug in qgate and keeps its traceback.
"""

from __future__ import annotations

MAX_VALUE_CHARS = 120  # a value shown in a one-line message


def cut(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """text, or its first `limit` characters and how many more there were (a value in a one-line
    message: a user's value can be any length, the line cannot)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class QgateError(Exception):
    """Bad input (a contract, a result file, data, an env): exit 2."""

    exit_code = 2


class RunFailure(QgateError):
    """A run that could not finish honestly (engine died, a rep could not be measured): exit 1."""

    exit_code = 1


class RouteError(QgateError, ValueError):
    """An arm's route env cannot work, or its route attestation cannot be read; str() is one line
    naming the variable and its value (or the file)."""
