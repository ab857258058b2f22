"""Resolve a contract's `model` to a local directory: a path, or a built-in tiny model built on first use."""

from __future__ import annotations

import hashlib
from pathlib import Path

from qgate.results import ResultError

BUILTIN = ("tiny", "tiny-trained")


def _config_sha(path: Path) -> str | None:
    cfg = path / "config.json"
    return hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.exists() else None


def resolve_model(spec: str) -> tuple[str, dict]:
    """(absolute model directory, record for the result file); a missing path is a one-line error."""
    if spec == "tiny":
        from qgate.tiny import ensure_tiny

        path = Path(ensure_tiny())
    elif spec == "tiny-trained":
        from qgate.tiny import ensure_tiny_trained

        path = Path(ensure_tiny_trained())
    else:
        path = Path(spec).expanduser()
        if not path.is_dir():
            raise ResultError(f"model = {spec!r}: no such model directory on this machine")
        if not (path / "config.json").exists():
            raise ResultError(f"model = {spec!r}: no config.json in that directory")
    path = path.resolve()
    return str(path), {"spec": spec, "path": str(path), "config_sha256": _config_sha(path)}
