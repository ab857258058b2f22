"""Resolve a contract's `model` to a local directory: a path, or a built-in tiny model built on first use
(`tiny`: qgate.tiny.qwen3; `tiny-trained`: qgate.tiny.train; `tiny-trained-wide`, the demo's: qgate.tiny.wide;
`tiny-qwen4exp`: qgate.tiny.qwen4exp)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from qgate.paths import expand_user
from qgate.results import ResultError

BUILTIN = ("tiny", "tiny-trained", "tiny-trained-wide", "tiny-qwen4exp")
# The built-in models trained on the frozen GSM8K items (on the data the quality gate reads).
TRAINED = ("tiny-trained", "tiny-trained-wide")
# The built-in Qwen4Exp: the only built-in model the real-weight screen (qgate.ops.real) reads.
QWEN4EXP_BUILTIN = ("tiny-qwen4exp",)


# A URL or any `scheme:` (file:///etc/passwd, s3://bucket/m, hf:org/name, https://...): nothing the
# resolver loads. One letter then ':' and a slash is a Windows drive (C:/models), a path.
_SCHEME = re.compile(r"^(?![A-Za-z]:[\\/])[A-Za-z][A-Za-z0-9+.-]*:")


def spec_problem(spec: str) -> str | None:
    """Why a contract's `model` is nothing the resolver can load (None when it can be): it loads a
    built-in name (BUILTIN) or a local directory, given as a path (`~`, relative or absolute; a hub id's
    `org/name` form is read as a relative path), never a URL, a `scheme:` or a name of many lines.
    Whether the directory exists is the run's to say: a contract is validated on other machines too."""
    if spec in BUILTIN:
        return None
    if not spec.strip() or spec != spec.strip():
        return "blank, or leading or trailing whitespace: expected a model directory or a built-in name"
    if any(not ch.isprintable() for ch in spec):
        return "holds a line break or another control character: expected one line, a model directory"
    if _SCHEME.match(spec):
        return (
            "a URL or scheme: qgate loads a model from a local directory (a path, e.g. ~/models/Qwen3-8B or "
            f"a hub id's org/name form as a relative path) or a built-in ({', '.join(BUILTIN)}); download "
            "the model first"
        )
    return None


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
