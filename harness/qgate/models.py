"""Resolve a contract's `model` to a local directory: a path, or a built-in tiny model built on first use
(`tiny`: qgate.tiny.qwen3; `tiny-trained`: qgate.tiny.train; `tiny-trained-wide`, the demo's: qgate.tiny.wide;
`tiny-qwen4exp`: qgate.tiny.qwen4exp)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from qgate.paths import expand_user
from qgate.results import ResultError

BUILTIN = ("tiny", "tiny-trained", "tiny-trained-wide", "tiny-qwen4exp")
# The built-in models trained on the frozen GSM8K items (on the data the quality gate reads).
TRAINED = ("tiny-trained", "tiny-trained-wide")


def _config_sha(path: Path) -> str | None:
    cfg = path / "config.json"
    return hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.exists() else None


def model_dir(spec: str, data: Path | None = None) -> Path:
    """A built-in model's directory (built on first use; `tiny-trained` is trained on `data`, default
    env QGATE_GSM8K_PATH), or the path as given, unchecked."""
    if spec == "tiny":
        from qgate.tiny.qwen3 import ensure_tiny

        return Path(ensure_tiny())
    if spec == "tiny-trained":
        from qgate.tiny.train import ensure_trained

        return Path(ensure_trained(data=data))
    if spec == "tiny-trained-wide":
        from qgate.tiny.wide import ensure_wide

        return Path(ensure_wide(data=data))
    if spec == "tiny-qwen4exp":
        from qgate.tiny.qwen4exp import ensure_tiny_qwen4exp

        return Path(ensure_tiny_qwen4exp())
    return expand_user(spec, "model")


def resolve_model(spec: str, data: Path | None = None) -> tuple[str, dict]:
    """(absolute model directory, record for the result file); a missing path is a one-line error.

    `data`: the GSM8K file a `tiny-trained` model is trained on when it is not in the cache yet."""
    path = model_dir(spec, data)
    if spec not in BUILTIN:
        if not path.is_dir():
            raise ResultError(f"model = {spec!r}: no such model directory on this machine")
        if not (path / "config.json").exists():
            raise ResultError(f"model = {spec!r}: no config.json in that directory")
    path = path.resolve()
    return str(path), {"spec": spec, "path": str(path), "config_sha256": _config_sha(path)}
