"""Paths from a user's text or from the home directory, as one-line errors when they cannot be made.

`Path.expanduser()` and `Path.home()` raise RuntimeError ("Could not determine home directory") for
`~nosuchuser/m` or where HOME is unset and the user has no passwd entry (a container): a traceback for
what is bad input (issue 45). Every `~` in a contract's path and every default under the home
directory goes through here.
"""

from __future__ import annotations

import os
from pathlib import Path

from qgate.errors import QgateError, cut


class PathError(QgateError):
    """A path that cannot be made on this machine; str() is one line naming where it came from."""


def expand_user(text: str | os.PathLike[str], what: str) -> Path:
    """Path(text) with a leading `~` or `~user` expanded; PathError naming `what` (e.g. `model`) when that
    user's home directory cannot be found."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        head = str(text).split(os.sep, 1)[0]
        raise PathError(
            f"{what} = {cut(repr(str(text)))}: the home directory of {cut(head)} cannot be found on this "
            "machine; write the path out"
        ) from None


def cache_root() -> Path:
    """qgate's cache: QGATE_CACHE, else ~/.cache/qgate; PathError when neither can be found."""
    env = os.environ.get("QGATE_CACHE")
    if env:
        return Path(env)
    try:
        return Path.home() / ".cache" / "qgate"
    except RuntimeError:
        raise PathError(
            "the home directory cannot be found (HOME unset, no passwd entry): set QGATE_CACHE"
        ) from None
