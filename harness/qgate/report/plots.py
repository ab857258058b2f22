"""speed.png: per-rep decode tok/s of both arms, their means and the contract's gate line.

Uses matplotlib's object API with the Agg canvas (no pyplot global state, no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from qgate.report.escape import plot_text

_COLORS = {"control": "#4c72b0", "candidate": "#dd8452"}


def _launch_breaks(launch_ids: list[Any]) -> list[float]:
    """x positions between reps of different launches (reps are numbered from 1)."""
    return [i + 0.5 for i in range(1, len(launch_ids)) if launch_ids[i] != launch_ids[i - 1]]


def speed_png(record: dict[str, Any], path: str | Path) -> None:
    """Write the plot of a verdict record that holds speed figures to path (PNG)."""
    figs = record["figures"]
    fig = Figure(figsize=(8.0, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name in ("control", "candidate"):
        values = figs[name]["decode_tok_s"]
        xs = [i + 1 for i, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.plot(xs, ys, "o-", color=_COLORS[name], label=f"{name} (per rep)", alpha=0.9)
        mean = figs[name]["decode_tok_s_mean"]
        if mean is not None:
            ax.axhline(mean, color=_COLORS[name], linestyle=":", linewidth=1, label=f"{name} mean {mean:.2f}")
    for x in _launch_breaks(figs["control"].get("launch_ids") or []):
        ax.axvline(x, color="#999999", linewidth=0.8, linestyle="-.")
    gate = figs.get("min_decode_tok_s")
    if gate is not None:
        ax.axhline(gate, color="#c44e52", linestyle="--", linewidth=1.5, label=f"gate: every rep >= {gate:g}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("rep" + (" (dash-dot lines: new engine launch)" if figs.get("unit") == "launch" else ""))
    ax.set_ylabel("decode tok/s")
    contract = record.get("contract", {})
    ax.set_title(plot_text(f"{contract.get('name', '?')}: {record.get('verdict', '?')}"))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
