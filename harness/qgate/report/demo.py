"""The demo's summary (qgate.demo record) as markdown and as a rich table: rendering only."""

from __future__ import annotations

from typing import Any

from qgate.report.escape import md, md_cell, term

# qgate.demo.claims, in words: each from the gate that measured it (the screen only when it ran all of
# the candidate's code)
_CLAIMS = (
    ("within_bound", "within the operator screen's error bound"),
    ("exact", "exact (every screened output bitwise equal)"),
    ("answers_like_control", "answers like the control (quality PASS)"),
    ("not_slower", "not slower (speed PASS)"),
    ("faster", "faster (speed PASS, improved)"),
)
_STYLE = {
    "PASS": "bold green",
    "FAIL": "bold red",
    "ERROR": "bold magenta",
    "INCONCLUSIVE": "bold yellow",
    "NOT RUN": "dim",
}


def _kind(record: dict[str, Any]) -> str:
    """The faulty kind (schema 3), or "sign" for a schema-2 record's `faulty: true`."""
    return "sign" if record["faulty"] is True else str(record["faulty"])


def _model_line(record: dict[str, Any]) -> str:
    m = record["model"]
    how = (
        f"built now in {m['seconds']:.0f} s (first use; not counted in the gates)"
        if m["built_now"]
        else "cached"
    )
    return f"model {m['spec']}: {how}"  # the caller escapes it for where it goes


def summary_markdown(record: dict[str, Any]) -> str:
    title = f"qgate demo (faulty candidate: {_kind(record)})" if record["faulty"] else "qgate demo"
    lines = [
        f"# {md(title)}: {md(record['verdict'])}",
        "",
        f"Contract {md(record['contract']['path'])} ({md(record['contract']['name'])}); "
        f"{md(_model_line(record))}; "
        f"gates {record['gates_seconds']:.0f} s, total {record['total_seconds']:.0f} s.",
        "",
        "| gate | figure | verdict | report | seconds |",
        "|---|---|---|---|---|",
    ]
    for g in record["gates"]:
        cells = [g["gate"], g["figure"], g["verdict"], g["report"], f"{g['seconds']:.0f}"]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    for g in record["gates"]:
        for reason in g["reasons"]:
            lines.append(f"- {md(g['gate'])}: {md(reason)}")
    if record.get("claims"):  # schema 3: what the gates of this run measured on the code that ran
        said = ", ".join(f"{text}: {'yes' if record['claims'].get(key) else 'no'}" for key, text in _CLAIMS)
        lines += ["", f"Measured in this run on the candidate's code: {said}."]
    lines += ["", record["next_step"]]  # qgate's own markdown (code spans of commands), no record data
    return "\n".join(lines) + "\n"


def summary_table(record: dict[str, Any]) -> Any:
    """A rich Table of the gates (imported lazily: rich is only needed to print it)."""
    from rich.markup import escape
    from rich.table import Table

    def text(value: Any) -> str:  # data: no terminal control bytes, no rich markup
        return escape(term(value))

    title = "qgate demo" + (f" (faulty candidate: {_kind(record)})" if record["faulty"] else "")
    table = Table(
        title=text(f"{title}: {record['verdict']}"), title_style=_STYLE.get(record["verdict"], "bold")
    )
    for name in ("gate", "figure", "verdict", "report", "s"):
        table.add_column(name, overflow="fold")
    for g in record["gates"]:
        style = _STYLE.get(g["verdict"], "")
        table.add_row(
            text(g["gate"]), text(g["figure"]),
            f"[{style}]{g['verdict']}[/]" if style else text(g["verdict"]), text(g["report"]),
            f"{g['seconds']:.0f}",
        )  # fmt: skip
    seconds = f"gates {record['gates_seconds']:.0f} s, total {record['total_seconds']:.0f} s"
    table.caption = f"{text(_model_line(record))}; {seconds}"
    return table
