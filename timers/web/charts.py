"""The dashboard's charts: a pure function from points to inline SVG markup.

One chart has one time axis, one value axis and one scale shared by every series on it
(p50 and p99 are drawn against the same milliseconds), the unit named on the axis, and
ticks at round values. Nothing runs in the browser: the page's strict CSP allows no
script but its own, and inline SVG needs none. Colours come from CSS classes
(``series-<kind>``) in the page's stylesheet, never from ``style`` attributes (the CSP
refuses those). Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 28, 24, 28
"""Margins (px) around the plot area: the value axis' labels on the left, time below."""
TIME_STEPS_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Spacings of the time ticks, the first that gives at most :data:`MAX_TIME_TICKS`."""
MAX_TIME_TICKS = 7


@dataclass(frozen=True)
class Series:
    """One series: ``values[i]`` is the value at ``start + i * step`` (None: no data)."""

    label: str
    kind: str
    """Its CSS class suffix, e.g. ``runs``, ``failures``, ``p50``, ``p99``."""
    values: Sequence[float | None]


@dataclass(frozen=True)
class Chart:
    """What to draw: the series on one scale, over ``count`` steps of ``step_s`` seconds
    from ``start_s`` (epoch seconds)."""

    id: str
    title: str
    unit: str
    """What the values count, e.g. ``runs / min`` or ``ms``."""
    start_s: float
    step_s: float
    series: Sequence[Series]
    bars: bool = False
    """Draw bars (counts per step) rather than lines (a measure at each step)."""
    note: str = ""
    """A line under the title: where the figures come from."""

    @property
    def count(self) -> int:
        return max((len(s.values) for s in self.series), default=0)


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``: 0, 1, 2, 5 or 10 times a power of ten
    apart, at most ``most`` + 1 of them. ``top`` <= 0 gives ``[0, 1]``."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def number_text(value: float) -> str:
    """A tick label: ``1,200``, ``2.5``, ``0.05``."""
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def time_ticks(start_s: float, end_s: float) -> list[float]:
    """Round times (UTC) between ``start_s`` and ``end_s``, at most
    :data:`MAX_TIME_TICKS` of them."""
    span = max(end_s - start_s, 1.0)
    step = next((s for s in TIME_STEPS_S if span / s <= MAX_TIME_TICKS), TIME_STEPS_S[-1])
    first = math.ceil(start_s / step) * step
    return [float(t) for t in range(int(first), int(end_s) + 1, step)]


def time_text(at_s: float, span_s: float) -> str:
    """``14:05`` (a day or less shown), else ``11-26 14:05``, UTC."""
    when = datetime.fromtimestamp(at_s, tz=UTC)
    return when.strftime("%H:%M" if span_s <= 86_400 else "%m-%d %H:%M")


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive known values (a gap breaks a line)."""
    out: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None or not math.isfinite(v):
            if current:
                out.append(current)
            current = []
        else:
            current.append((i, v))
    if current:
        out.append(current)
    return out


def render(chart: Chart, width: int = WIDTH, height: int = HEIGHT) -> Markup:
    """The chart as an ``<svg>`` element (markup safe to put in a page as is)."""
    known = [v for s in chart.series for v in s.values if v is not None and math.isfinite(v)]
    frame = _Frame(chart, width, height, nice_ticks(max(known, default=0.0)))
    parts = [f'<svg id="{escape(chart.id)}" class="chart" role="img" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(chart.title)} ({escape(chart.unit)})</title>",
             f'<text class="unit" x="4" y="14">{escape(chart.unit)}</text>',
             *frame.value_axis(), *frame.time_axis(), frame.axes()]
    for s in chart.series:
        parts += frame.marks(s)
    parts += frame.legend()
    if not known:
        parts.append(f'<text class="empty" x="{LEFT + frame.plot_w / 2:.1f}" '
                     f'y="{TOP + frame.plot_h / 2:.1f}" text-anchor="middle">no data yet</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


class _Frame:
    """Where a chart's values go in its plot area, and the SVG of each of its parts."""

    def __init__(self, chart: Chart, width: int, height: int, ticks: list[float]) -> None:
        self.chart, self.width, self.height, self.ticks = chart, width, height, ticks
        self.plot_w, self.plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
        self.slots = max(chart.count, 1)
        self.span_s = self.slots * chart.step_s

    def x_of(self, i: float) -> float:
        """The x of step ``i``: a bar's middle, or a line's point (first and last at the
        plot's edges)."""
        bars = self.chart.bars
        return LEFT + self.plot_w * (i + (0.5 if bars else 0)) / (
            self.slots if bars else max(self.slots - 1, 1))

    def y_of(self, v: float) -> float:
        """The y of value ``v`` on the one scale, from 0 to the top tick."""
        top = self.ticks[-1]
        return TOP + self.plot_h * (1 - min(max(v, 0.0), top) / top)

    def value_axis(self) -> list[str]:
        """A grid line and a label per tick."""
        out = []
        for t in self.ticks:
            y = self.y_of(t)
            out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{self.width - RIGHT}" '
                       f'y2="{y:.1f}"/><text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" '
                       f'text-anchor="end">{escape(number_text(t))}</text>')
        return out

    def time_axis(self) -> list[str]:
        """A mark and a label per round time."""
        start_s, bottom = self.chart.start_s, self.height - BOTTOM
        out = []
        for at in time_ticks(start_s, start_s + self.span_s):
            x = LEFT + self.plot_w * (at - start_s) / self.span_s
            out.append(f'<line class="axis" x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" '
                       f'y2="{bottom + 4}"/><text class="tick" x="{x:.1f}" '
                       f'y="{bottom + 16}" text-anchor="middle">'
                       f"{escape(time_text(at, self.span_s))}</text>")
        return out

    def axes(self) -> str:
        """The two axis lines."""
        bottom = self.height - BOTTOM
        return (f'<line class="axis" x1="{LEFT}" y1="{bottom}" '
                f'x2="{self.width - RIGHT}" y2="{bottom}"/>'
                f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
                f'y2="{bottom}"/>')

    def marks(self, s: Series) -> list[str]:
        """One series: bars, or a line per stretch of known values (a dot for one)."""
        kind, out = escape(s.kind), []
        bar_w = max(self.plot_w / self.slots - 1, 1)
        for stretch in _runs(s.values):
            if self.chart.bars:
                out += [f'<rect class="bar series-{kind}" x="{self.x_of(i) - bar_w / 2:.1f}" '
                        f'y="{self.y_of(v):.1f}" width="{bar_w:.1f}" '
                        f'height="{self.height - BOTTOM - self.y_of(v):.1f}"/>'
                        for i, v in stretch if v > 0]
            elif len(stretch) == 1:
                i, v = stretch[0]
                out.append(f'<circle class="series-{kind}" cx="{self.x_of(i):.1f}" '
                           f'cy="{self.y_of(v):.1f}" r="2"/>')
            else:
                points = " ".join(f"{self.x_of(i):.1f},{self.y_of(v):.1f}" for i, v in stretch)
                out.append(f'<polyline class="series-{kind}" fill="none" '
                           f'points="{points}"/>')
        return out

    def legend(self) -> list[str]:
        """A swatch and a label per series, along the top, after the unit."""
        x, out = max(LEFT + 8, 4 + 7 * len(self.chart.unit) + 16), []
        for s in self.chart.series:
            out.append(f'<rect class="key series-{escape(s.kind)}" x="{x}" y="6" width="10" '
                       f'height="10"/><text class="legend" x="{x + 14}" y="15">'
                       f"{escape(s.label)}</text>")
            x += 24 + 7 * len(s.label)
        return out
