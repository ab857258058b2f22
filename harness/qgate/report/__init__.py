"""Rendering of verdict records: markdown tables and plots. Only this package renders.

The names below load on first use (PEP 562): the CLI imports report.escape (its terminal escaping) in
every command, and markdown's imports reach the statistics (scipy: seconds on 2 cores), which a plain
command must not pay for (tests/test_cli_imports.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_markdown", "speed_png"]


def __getattr__(name: str) -> Any:
    if name == "render_markdown":
        from qgate.report.markdown import render_markdown

        return render_markdown
    if name == "speed_png":
        from qgate.report.plots import speed_png

        return speed_png
    raise AttributeError(f"module 'qgate.report' has no attribute {name!r}")
