"""Rendering of verdict records: markdown tables and plots. Only this package renders."""

from qgate.report.markdown import render_markdown
from qgate.report.plots import speed_png

__all__ = ["render_markdown", "speed_png"]
