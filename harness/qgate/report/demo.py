"""The demo's summary (qgate.demo record) as markdown and as a rich table: rendering only."""

from __future__ import annotations

from typing import Any

# qgate.demo.claims, in words: each from the gate that measured it (the screen only when it ran all of
# the candidate's code)
_CLAIMS = (
    ("within_bound", "within the operator screen's error bound"),
    ("exact", "exact (every screened output bitwise equal)"),
    ("answers_like_control", "answers like the control (quality PASS)"),
    ("not_slower", "not slower (speed PASS)"),
    ("faster", "faster (speed PASS, improved)"),
)
_STYLE = {"PASS": "bold green", "FAIL": "bold red", "ERROR": "bold magenta", "INCONCLUSIVE": "bold yellow"}


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
    return f"model {m['spec']}: {how}"


def summary_markdown(record: dict[str, Any]) -> str:
    title = f"qgate demo (faulty candidate: {_kind(record)})" if record["faulty"] else "qgate demo"
    lines = [
        f"# {title}: {record['verdict']}",
        "",
        f"Contract {record['contract']['path']} ({record['contract']['name']}); {_model_line(record)}; "
        f"gates {record['gates_seconds']:.0f} s, total {record['total_seconds']:.0f} s.",
        "",
        "| gate | figure | verdict | report | seconds |",
        "|---|---|---|---|---|",
    ]
    for g in record["gates"]:
        lines.append(f"| {g['gate']} | {g['figure']} | {g['verdict']} | {g['report']} | {g['seconds']:.0f} |")
    for g in record["gates"]:
        for reason in g["reasons"]:
            lines.append(f"- {g['gate']}: {reason}")
    if record.get("claims"):  # schema 3: what the gates of this run measured on the code that ran
        said = ", ".join(f"{text}: {'yes' if record['claims'].get(key) else 'no'}" for key, text in _CLAIMS)
        lines += ["", f"Measured in this run on the candidate's code: {said}."]
    lines += ["", record["next_step"]]
    return "\n".join(lines) + "\n"


def summary_table(record: dict[str, Any]) -> Any:
    """A rich Table of the gates (imported lazily: rich is only needed to print it)."""
    from rich.table import Table

    title = "qgate demo" + (f" (faulty candidate: {_kind(record)})" if record["faulty"] else "")
    table = Table(title=f"{title}: {record['verdict']}", title_style=_STYLE.get(record["verdict"], "bold"))
    for name in ("gate", "figure", "verdict", "report", "s"):
        table.add_column(name, overflow="fold")
    for g in record["gates"]:
        style = _STYLE.get(g["verdict"], "")
        table.add_row(
            g["gate"], g["figure"], f"[{style}]{g['verdict']}[/]" if style else g["verdict"], g["report"],
            f"{g['seconds']:.0f}",
        )  # fmt: skip
    table.caption = (
        f"{_model_line(record)}; gates {record['gates_seconds']:.0f} s, total {record['total_seconds']:.0f} s"
    )
    return table
