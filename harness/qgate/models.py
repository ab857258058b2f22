"""Resolve a contract's `model` to a local directory: a path, or a built-in tiny model built on first use
(`tiny`, `tiny-trained`: Qwen3; `tiny-qwen4exp`: Qwen4Exp, see qgate.tiny_qwen4exp)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from qgate.results import ResultError

BUILTIN = ("tiny", "tiny-trained", "tiny-qwen4exp")


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
    elif spec == "tiny-qwen4exp":
        from qgate.tiny_qwen4exp import ensure_tiny_qwen4exp

        path = Path(ensure_tiny_qwen4exp())
    else:
        path = Path(spec).expanduser()
        if not path.is_dir():
            raise ResultError(f"model = {spec!r}: no such model directory on this machine")
        if not (path / "config.json").exists():
            raise ResultError(f"model = {spec!r}: no config.json in that directory")
    path = path.resolve()
    return str(path), {"spec": spec, "path": str(path), "config_sha256": _config_sha(path)}
