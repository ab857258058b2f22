"""The pipe table every markdown report is written with: a leaf below the report modules (markdown.py
renders the verdict's timeline section from timeline.py, and timeline.py writes its tables with this).
Every cell is data, escaped (report/escape.md), unless a renderer made it markdown on purpose (Md)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from qgate.report.escape import Md, md_cell


def table(df: pd.DataFrame) -> str:
    """A GitHub pipe table; cells are str() of the values escaped (md_cell: pipes, newlines, links,
    HTML), an Md cell as it is with its pipes escaped (its data was escaped when it was made)."""

    def cell(value: Any) -> str:
        if isinstance(value, Md):
            return value.replace("|", "\\|").replace("\n", " ")
        return md_cell(value)

    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])
