"""Learning curves as inline SVG: one chart per metric, one coloured series per run.

Drawn here rather than with matplotlib: the page stays a few KB per chart, needs no plotting
package, and each series is an element a test (or a reader's devtools) can find by its
``data-run``. The markup is in report.html's chart blocks; this module only computes
coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness_report.template import Html, Template, join

METRICS: tuple[tuple[str, str], ...] = (
    ("charts/episodic_return", "Training return (shaped)"),
    ("eval/mean_return", "Evaluation return"),
    ("charts/score", "Official score (training episodes)"),
    ("eval/score", "Official score (evaluation)"),
    ("perf/SPS", "Steps per second"),
)
"""The metrics charted, in page order, when at least one run logged them."""

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)

WIDTH, HEIGHT = 560, 250
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 10, 38
MAX_POINTS = 800
"""Points drawn per series: a 10M-step run logged every 2,000 steps has 5,000 rows; 800 keep
the curve's shape at 500 px wide and the page small."""
MARKERS_BELOW = 40
"""Series with fewer points (evaluations) also get a dot per point: a line alone between two
evaluations hides that there were only two."""


@dataclass(frozen=True)
class Series:
    run: str
    color: str
    points: Sequence[tuple[float, float]]  # (step, value), finite, in step order


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def thin(
    points: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most about ``limit`` points, evenly strided, always keeping the last one."""
    if len(points) <= limit:
        return list(points)
    stride = math.ceil(len(points) / limit)
    kept = list(points[::stride])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 times a power of ten) covering [lo, hi]."""
    if not hi > lo:  # one value (a single evaluation): centre it in a band of +-10%
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def label(value: float) -> str:
    """A tick label: 2.5M, 40k, 0.25, -3."""
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:.4g}"


def chart(t: Template, metric: str, title: str, series: Sequence[Series]) -> Html:
    """One chart (the ``chart`` block) of ``series``; each is thinned to :data:`MAX_POINTS`."""
    drawn = [Series(s.run, s.color, thin(s.points)) for s in series if s.points]
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    xticks = nice_ticks(min(0.0, *xs), max(xs), 6)
    yticks = nice_ticks(min(ys), max(ys), 5)
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM

    def sx(x: float) -> float:
        return x0 + (x - xticks[0]) / (xticks[-1] - xticks[0]) * (x1 - x0)

    def sy(y: float) -> float:
        return y1 - (y - yticks[0]) / (yticks[-1] - yticks[0]) * (y1 - y0)

    grid = [
        t.block("xtick", x=f"{sx(v):.1f}", y0=y0, y1=y1, label_y=y1 + 14, label=label(v))
        for v in xticks
    ] + [
        t.block("ytick", y=f"{sy(v):.1f}", x0=x0, x1=x1, label_x=x0 - 6, label=label(v))
        for v in yticks
    ]
    groups = []
    for s in drawn:
        xy = [(sx(x), sy(y)) for x, y in s.points]
        paths = [t.block("polyline", points=" ".join(f"{x:.1f},{y:.1f}" for x, y in xy))]
        if len(xy) < MARKERS_BELOW:
            paths += [t.block("marker", x=f"{x:.1f}", y=f"{y:.1f}") for x, y in xy]
        groups.append(
            t.block("series", run=s.run, points=len(xy), color=s.color, paths=join(paths))
        )
    legend = [t.block("legend_item", color=s.color, run=s.run) for s in drawn]
    return t.block(
        "chart",
        metric=metric,
        label=title,
        width=WIDTH,
        height=HEIGHT,
        grid=join(grid),
        x0=x0,
        x1=x1,
        y0=y0,
        y1=y1,
        series=join(groups),
        xlabel_y=HEIGHT - 4,
        legend=join(legend),
    )


def charts(t: Template, runs: Sequence[tuple[str, dict[str, list[tuple[float, float]]]]]) -> Html:
    """The charts of :data:`METRICS` that some run logged; ``runs`` is (name, metrics) in the
    page's order, which fixes each run's colour on every chart."""
    out = []
    for metric, title in METRICS:
        series = [Series(name, color(i), m.get(metric, [])) for i, (name, m) in enumerate(runs)]
        if any(s.points for s in series):
            out.append(chart(t, metric, title, series))
    return join(out)
