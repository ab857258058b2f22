"""The pipe table every markdown report is written with: a leaf below the report modules (markdown.py
renders the verdict's timeline section from timeline.py, and timeline.py writes its tables with this)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def table(df: pd.DataFrame) -> str:
    """A GitHub pipe table; cells are str() of the values with pipes escaped and newlines flattened."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])
