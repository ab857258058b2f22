"""Inline SVG plots for the published history (qgate.report.site): no script, no external file, so a
page opens from the file system with no network. Every string drawn is escaped here (`esc`).

The x axis is the calendar day (day 0: a series' first night), so a night with no record leaves a gap;
a None value breaks a line or a band. Classes name what a reader must see (band, margin, flag-fail,
flag-error, flag-drift, marker-<verdict>): the browser test finds them by class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from qgate.report.escape import html_text

# Verdict -> marker shape and colour; FAIL and ERROR are drawn large and with a stripe.
MARKERS = {
    "PASS": ("circle", "#2e7d32"),
    "FAIL": ("triangle", "#c62828"),
    "INCONCLUSIVE": ("square", "#ef8f00"),
    "ERROR": ("diamond", "#212121"),
}


def esc(value: object) -> str:
    """Text or an attribute value, escaped for HTML and SVG (quotes too; report.escape.html_text)."""
    return html_text(value)


def _num(v: float) -> str:
    return f"{v:.1f}"


def _points(xy: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{_num(x)},{_num(y)}" for x, y in xy)


class Plot:
    """One plot of values over calendar days; parts are SVG strings, `svg()` the element."""

    LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 44

    def __init__(
        self,
        n_days: int,
        y_range: tuple[float, float],
        title: str,
        y_label: str,
        width: int = 900,
        height: int = 250,
    ) -> None:
        self.n_days, self.width, self.height = max(n_days, 1), width, height
        lo, hi = y_range
        if not hi > lo:
            lo, hi = lo - 1.0, hi + 1.0
        pad = 0.08 * (hi - lo)
        self.lo, self.hi = lo - pad, hi + pad
        self.title, self.y_label = title, y_label
        self.parts: list[str] = []

    def x(self, day: float) -> float:
        span = self.width - self.LEFT - self.RIGHT
        return self.LEFT + (span * (day + 0.5) / self.n_days)

    def y(self, value: float) -> float:
        span = self.height - self.TOP - self.BOTTOM
        return self.TOP + span * (self.hi - value) / (self.hi - self.lo)

    def axes(self, ticks: Sequence[tuple[int, str]], y_ticks: Sequence[float]) -> None:
        bottom, right = self.height - self.BOTTOM, self.width - self.RIGHT
        out = [
            f'<rect class="frame" x="{self.LEFT}" y="{self.TOP}" width="{right - self.LEFT}" '
            f'height="{bottom - self.TOP}" fill="none" stroke="#999"/>'
        ]
        for v in y_ticks:
            y = _num(self.y(v))
            out.append(f'<line x1="{self.LEFT}" x2="{right}" y1="{y}" y2="{y}" stroke="#eee"/>')
            out.append(
                f'<text x="{self.LEFT - 6}" y="{y}" text-anchor="end" dy="4" font-size="11">'
                f"{esc(format(v, 'g'))}</text>"
            )
        for day, label in ticks:
            x = _num(self.x(day))
            out.append(f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" stroke="#999"/>')
            out.append(
                f'<text x="{x}" y="{bottom + 16}" text-anchor="middle" font-size="11">{esc(label)}</text>'
            )
        out.append(f'<text x="{self.LEFT}" y="16" font-size="13" font-weight="bold">{esc(self.title)}</text>')
        out.append(
            f'<text x="14" y="{(self.TOP + bottom) / 2:.0f}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 14 {(self.TOP + bottom) / 2:.0f})">{esc(self.y_label)}</text>'
        )
        self.parts[:0] = out

    def stripe(self, day: int, cls: str, color: str, label: str, tip: str) -> None:
        """A vertical stripe over a night (a flagged night), labelled inside the top of the plot; labels
        of neighbouring nights are staggered so that they do not overlap."""
        w = max((self.width - self.LEFT - self.RIGHT) / self.n_days, 6.0)
        x = self.x(day) - w / 2
        self._labels = getattr(self, "_labels", [])
        row = sum(1 for d in self._labels if abs(d - day) <= 2) % 3
        self._labels.append(day)
        self.parts.append(
            f'<g class="{esc(cls)}"><title>{esc(tip)}</title><rect x="{_num(x)}" y="{self.TOP}" '
            f'width="{_num(w)}" height="{self.height - self.TOP - self.BOTTOM}" fill="{color}" '
            f'fill-opacity="0.14"/><text x="{_num(self.x(day))}" y="{self.TOP + 11 + 11 * row}" '
            f'text-anchor="middle" font-size="10" font-weight="bold" fill="{color}">{esc(label)}</text></g>'
        )

    def legend(self, items: Sequence[tuple[str, str, str]]) -> None:
        """(label, colour, dash) of each line, in a row above the plot, right-aligned."""
        x = self.width - self.RIGHT
        out = []
        for label, color, dash in reversed(items):
            width = 7 * len(label) + 30
            x -= width
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(
                f'<line x1="{x}" x2="{x + 20}" y1="12" y2="12" stroke="{color}" stroke-width="2"{dashed}/>'
                f'<text x="{x + 24}" y="16" font-size="11">{esc(label)}</text>'
            )
        self.parts.append(f'<g class="legend">{"".join(out)}</g>')

    def hline(self, value: float, cls: str, color: str, label: str, dash: str = "") -> None:
        y = _num(self.y(value))
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<g class="{esc(cls)}"><line x1="{self.LEFT}" x2="{self.width - self.RIGHT}" y1="{y}" y2="{y}" '
            f'stroke="{color}"{dashed}/><text x="{self.width - self.RIGHT - 4}" y="{y}" dy="-3" '
            f'text-anchor="end" font-size="10" fill="{color}">{esc(label)}</text></g>'
        )

    def steps(self, points: Sequence[tuple[int, float | None]], cls: str, color: str, dash: str = "") -> None:
        """A value per night drawn as a step over that night (a gate that may change between nights)."""
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        half = (self.width - self.LEFT - self.RIGHT) / self.n_days / 2
        segs = [
            f'<line x1="{_num(self.x(d) - half)}" x2="{_num(self.x(d) + half)}" y1="{_num(self.y(v))}" '
            f'y2="{_num(self.y(v))}" stroke="{color}" stroke-width="1.5"{dashed}/>'
            for d, v in points
            if v is not None
        ]
        if segs:
            self.parts.append(f'<g class="{esc(cls)}">{"".join(segs)}</g>')

    def _runs(self, points: Sequence[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
        """Consecutive days with a value: a missing day or value breaks the run."""
        runs: list[list[tuple[int, Any]]] = []
        for day, v in points:
            if v is None:
                runs.append([])
                continue
            if not runs or not runs[-1] or runs[-1][-1][0] != day - 1:
                runs.append([])
            runs[-1].append((day, v))
        return [r for r in runs if r]

    def line(self, points: Sequence[tuple[int, float | None]], cls: str, color: str, dash: str = "") -> None:
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        for run in self._runs(points):
            if len(run) == 1:  # a night alone (no neighbour to join): a dot
                d, v = run[0]
                self.parts.append(
                    f'<circle class="{esc(cls)}" cx="{_num(self.x(d))}" cy="{_num(self.y(v))}" r="3" '
                    f'fill="{color}"/>'
                )
                continue
            pts = " ".join(f"{_num(self.x(d))},{_num(self.y(v))}" for d, v in run)
            self.parts.append(
                f'<polyline class="{esc(cls)}" points="{pts}" fill="none" stroke="{color}" '
                f'stroke-width="1.5"{dashed}/>'
            )

    def band(self, points: Sequence[tuple[int, tuple[float, float] | None]], cls: str, color: str) -> None:
        """A filled interval over consecutive nights (a lone night: a bar of the plot's day width)."""
        half = (self.width - self.LEFT - self.RIGHT) / self.n_days / 2
        for run in self._runs(points):
            if len(run) == 1:
                d, (lo, hi) = run[0]
                xs = [(self.x(d) - half, lo, hi), (self.x(d) + half, lo, hi)]
            else:
                xs = [(self.x(d), lo, hi) for d, (lo, hi) in run]
            upper = [f"{_num(x)},{_num(self.y(hi))}" for x, _, hi in xs]
            lower = [f"{_num(x)},{_num(self.y(lo))}" for x, lo, _ in reversed(xs)]
            self.parts.append(
                f'<polygon class="{esc(cls)}" points="{" ".join(upper + lower)}" fill="{color}" '
                f'fill-opacity="0.25" stroke="{color}" stroke-opacity="0.5"/>'
            )

    def marker(self, day: int, value: float, verdict: str | None, href: str, tip: str) -> None:
        """A night's verdict marker, a link to its line in the night table, its record in the tooltip."""
        shape, color = MARKERS.get(str(verdict), ("circle", "#757575"))
        x, y = self.x(day), self.y(value)
        r = 6.5 if verdict in ("FAIL", "ERROR") else 4.5
        if shape == "circle":
            mark = f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{r}"/>'
        elif shape == "square":
            mark = f'<rect x="{_num(x - r)}" y="{_num(y - r)}" width="{2 * r}" height="{2 * r}"/>'
        elif shape == "triangle":
            pts = _points([(x, y - r * 1.3), (x - r * 1.2, y + r), (x + r * 1.2, y + r)])
            mark = f'<polygon points="{pts}"/>'
        else:
            pts = _points([(x, y - r), (x + r, y), (x, y + r), (x - r, y)])
            mark = f'<polygon points="{pts}"/>'
        cls = f"marker marker-{str(verdict).lower()}"
        self.parts.append(
            f'<a href="{esc(href)}" class="{esc(cls)}"><title>{esc(tip)}</title>'
            f'<g fill="{color}" stroke="#fff" stroke-width="1">{mark}</g></a>'
        )

    def text(self, message: str) -> None:
        self.parts.append(
            f'<text x="{self.width / 2:.0f}" y="{self.height / 2:.0f}" text-anchor="middle" '
            f'font-size="13" fill="#666">{esc(message)}</text>'
        )

    def svg(self, aria: str) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(aria)}" '
            f'viewBox="0 0 {self.width} {self.height}" width="{self.width}" height="{self.height}">'
            + "".join(self.parts)
            + "</svg>"
        )


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round values between lo and hi (1, 2, 2.5 or 5 times a power of ten)."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    out, v = [], first
    while v <= hi + 1e-12:
        out.append(round(v, 10))
        v += step
    return out
