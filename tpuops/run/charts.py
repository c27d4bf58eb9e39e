"""The report page's charts, drawn by matplotlib as inline SVG (no script, nothing fetched, text kept as text).

Each chart is one SVG inside `<figure class="chart" id="chart-NAME">` whose data attributes say what matplotlib
drew: `data-ylim` (the y axis range), `data-yscale`, `data-series` (the legend's names) and `data-points`
(points per series). Each line is an SVG group `<g id="series-NAME">`, each tick label `<text>`: the headless
Chromium test reads them back from the rendered page. Imported only when a page is written: matplotlib
costs a second of start-up.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at use (a second of start-up): named here for the type checker
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
WARMUP_SHADE = "#bbbbbb"


@dataclass
class Series:
    name: str
    ys: list[float | None]


@dataclass
class Chart:
    """One chart: series over steps. `ylim` pins the axis (a bounded quantity's natural range: None = from the
    data); `log` puts it on a log axis; `warmup` shades the first steps and keeps them out of the scale."""

    id: str
    title: str
    xs: list[int]
    series: list[Series]
    ylim: tuple[float | None, float | None] = (None, None)
    log: bool = False
    warmup: int = 0  # the first `warmup` steps: shaded, not counted for the y range
    marks: list[int] = field(default_factory=list)  # recompiles: dashed red lines
    bars: bool = False  # a bar per step (compiles per step)
    ylabel: str = ""


def _matplotlib() -> tuple[type[Figure], tuple[type[FuncFormatter], type[LogLocator], type[MaxNLocator]]]:
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "svg.fonttype": "none",  # tick labels and legends stay text: readable, searchable, testable
            "svg.hashsalt": "tpuops",  # the same page for the same log
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.color": "#e6e6e6",
        }
    )
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

    return Figure, (FuncFormatter, LogLocator, MaxNLocator)


def _tick(v: float, _pos: object = None) -> str:
    """A round tick label: 0.1, 2.5, 1000, 1e-05 (never 0.30000000000000004 or 10^{-1} mathtext)."""
    return f"{v:.6g}"


def _range(values: list[float], log: bool) -> tuple[float, float]:
    """A y range with some air around the values (a flat series gets an axis around its value)."""
    lo, hi = min(values), max(values)
    if log:
        lo, hi = max(lo, 1e-6), max(hi, 1e-6)
        return lo / 1.5, hi * 1.5
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.08
    return lo - pad, hi + pad


def svg(chart: Chart, size: tuple[float, float] = (7.6, 2.5)) -> str:
    """The chart as a `<figure>` holding matplotlib's SVG, or a "no data" note when nothing can be drawn."""
    title, drawn = _finite(chart)
    head = f'<figure class="chart" id="chart-{chart.id}"'
    if not drawn or not chart.xs:
        return f'{head} data-series="[]"><figcaption>{html.escape(title)}</figcaption><p>no data</p></figure>'
    Figure, _tickers = _matplotlib()
    fig = Figure(figsize=size, dpi=100)
    ax = fig.add_subplot()
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlabel("step")
    if chart.ylabel:
        ax.set_ylabel(chart.ylabel)
    scaled, points = _plot(ax, chart, drawn)
    _y_axis(ax, chart, drawn, scaled)
    _x_axis(ax, chart, size)
    legend = _legend(fig, ax, size)
    ylim = [float(f"{v:.6g}") for v in ax.get_ylim()]
    attrs = {
        "data-ylim": json.dumps(ylim),
        "data-yscale": ax.get_yscale(),
        "data-series": json.dumps([s.name for s in drawn]),
        "data-legend": json.dumps(legend),
        "data-points": json.dumps(points),
    }
    shown = " ".join(f"{k}='{html.escape(v, quote=True)}'" for k, v in attrs.items())
    return f"{head} {shown}>{_svg_text(fig, chart.id)}</figure>"


def _finite(chart: Chart) -> tuple[str, list[Series]]:
    """The chart's title and the series that have something to draw; nan and inf are not drawn (a gap), and the
    title says how many there were."""
    skipped = sum(y is not None and not math.isfinite(y) for s in chart.series for y in s.ys)
    series = [
        Series(s.name, [y if y is not None and math.isfinite(y) else None for y in s.ys])
        for s in chart.series
    ]
    title = chart.title
    if skipped:
        title += f" ({skipped} non-finite value{'s' if skipped > 1 else ''} (nan/inf) not drawn)"
    return title, [s for s in series if any(y is not None for y in s.ys)]


def _plot(ax: Axes, chart: Chart, drawn: list[Series]) -> tuple[list[float], dict[str, int]]:
    """Each series as a line (or bars); returns the values that scale the y axis and the points per series."""
    scaled: list[float] = []
    points: dict[str, int] = {}
    for i, s in enumerate(drawn):
        pairs = [
            (x, y) for x, y in zip(chart.xs, s.ys, strict=True) if y is not None and (y > 0 or not chart.log)
        ]
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        points[s.name] = len(pairs)
        colour = COLOURS[i % len(COLOURS)]
        if chart.bars:
            ax.bar(xs, ys, color=colour, label=s.name, gid=f"series-{s.name}", width=0.8)
        else:
            (line,) = ax.plot(
                xs, ys, color=colour, label=s.name, linewidth=1.5, marker="." if len(xs) < 60 else None
            )
            line.set_gid(f"series-{s.name}")
        scaled += [y for x, y in pairs if x >= chart.xs[0] + chart.warmup]
    if not scaled:  # only warm-up steps: scale to what there is
        scaled = [y for s in drawn for y in s.ys if y is not None and (y > 0 or not chart.log)] or [1.0]
    return scaled, points


def _y_axis(ax: Axes, chart: Chart, drawn: list[Series], scaled: list[float]) -> None:
    """The y axis: its scale, round ticks, its range (pinned or from the data), and how far off the scale the
    warm-up's compile time is."""
    _figure, (FuncFormatter, LogLocator, MaxNLocator) = _matplotlib()
    if chart.log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=()))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(_tick))
    lo, hi = _range(scaled, chart.log)
    pin_lo, pin_hi = chart.ylim
    ax.set_ylim(lo if pin_lo is None else pin_lo, hi if pin_hi is None else pin_hi)
    x0 = chart.xs[0]
    warm = [
        y
        for s in drawn
        for x, y in zip(chart.xs, s.ys, strict=True)
        if y is not None and x < x0 + chart.warmup
    ]
    top = ax.get_ylim()[1]
    if warm and max(warm) > top:  # the warm-up's compile time is off the scale: say how far
        ax.text(x0 + (chart.warmup - 1) / 2, top, f"{max(warm):.3g} ↑", ha="center", va="top", fontsize=8,
                gid="warmup-off-scale")  # fmt: skip


def _x_axis(ax: Axes, chart: Chart, size: tuple[float, float]) -> None:
    """The step axis, the warm-up's shade and the recompiles' dashed lines."""
    _figure, (FuncFormatter, _log_locator, MaxNLocator) = _matplotlib()
    x0 = chart.xs[0]
    ax.xaxis.set_major_locator(
        MaxNLocator(nbins=max(4, int(size[0] * 1.3)), integer=True, steps=[1, 2, 5, 10])
    )
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0f}"))
    x1 = chart.xs[-1]
    ax.set_xlim(x0 - 0.5, x1 + 0.5 if x1 > x0 else x0 + 0.5)
    if chart.warmup:
        ax.axvspan(x0 - 0.5, x0 + chart.warmup - 0.5, color=WARMUP_SHADE, alpha=0.3, lw=0, gid="warmup",
                   label=f"warm-up ({chart.warmup} step{'s' if chart.warmup > 1 else ''})")  # fmt: skip
    for j, m in enumerate(m for m in chart.marks if x0 <= m <= x1):
        ax.axvline(m, color="#d62728", linestyle="--", linewidth=1, gid=f"recompile-{m}",
                   label="recompile" if j == 0 else None)  # fmt: skip


def _legend(fig: Figure, ax: Axes, size: tuple[float, float]) -> list[str]:
    """A legend names only what is drawn, and only when there is more than the title already names; returns its
    labels (none when there is no legend)."""
    _handles, labels = ax.get_legend_handles_labels()
    legend = labels if len(labels) > 1 else []
    right = 0.97
    if legend and size[0] >= 6:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
        right = 1 - 1.9 / size[0]
    elif legend:
        ax.legend(loc="best", fontsize=7, framealpha=0.8)
    fig.subplots_adjust(left=0.09 * 7.6 / size[0], right=right, top=0.86, bottom=0.2)
    return legend


def _svg_text(fig: Figure, chart_id: str) -> str:
    """The figure as inline SVG: no prolog, no metadata, its own ids prefixed with the chart's."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    body = buf.getvalue()
    body = body[body.index("<svg") :]  # the XML prolog and doctype are for files, not for inline SVG
    body = re.sub(r"<metadata>.*?</metadata>", "", body, flags=re.S)  # RDF naming matplotlib: no use here
    # Several SVGs share one page: matplotlib's own ids (clip paths, markers, axes) get the chart's prefix so
    # that no chart clips to another's rectangle; the series and mark ids (gid) stay as named.
    own = re.compile(r'(id="|url\(#|href="#)(?!series-|recompile-|warmup)([^"\)]+)')
    return own.sub(lambda m: f"{m[1]}{chart_id}-{m[2]}", body)


def nice_ceiling(v: float) -> float:
    """The round number at or above v (1, 2, 2.5, 5 times a power of ten): an axis end people read."""
    if v <= 0:
        return 1.0
    base = float(10 ** math.floor(math.log10(v)))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= v - 1e-12)
