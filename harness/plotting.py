"""Learning-curve plots (matplotlib figures drawn by the Agg canvas: no display needed).

``Figure`` directly, not ``pyplot``: pyplot's import (~0.9 s here) and its global figure
registry buy nothing when a figure is only saved, and every run pays the import once at its
end."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from harness.plot_cli import Aggregate


def plot_learning_curve(
    train: Sequence[tuple[int, float]],
    evals: Sequence[tuple[int, float]],
    path: Path,
    title: str,
) -> Path:
    """Training episodic return and greedy evaluation return against env steps."""
    fig = _figure(7, 4)
    ax = fig.subplots()
    if train:
        xs, ys = zip(*train, strict=True)
        ax.plot(xs, ys, label="train episodic return", color="tab:blue", alpha=0.8)
    if evals:
        xs, ys = zip(*evals, strict=True)
        ax.plot(xs, ys, "o-", label="eval mean return", color="tab:orange")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write atomically (temp file + rename), so a reader never sees half a PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
    return path


def plot_runs(
    aggregates: Sequence[Aggregate],
    path: Path,
    metric: str,
    *,
    band: str = "minmax",
    title: str | None = None,
) -> Path:
    """One line per config (the mean over its seeds) with a shaded spread: ``"minmax"``,
    ``"std"`` (mean +- one standard deviation) or ``"none"``; see :mod:`harness.plot_cli`."""
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    for i, agg in enumerate(aggregates):
        color = f"C{i % 10}"
        seeds = len(agg.runs)
        ax.plot(agg.steps, agg.mean, color=color, label=f"{agg.label} ({seeds} seed(s))")
        if seeds > 1 and band != "none":
            low, high = (
                (agg.low, agg.high)
                if band == "minmax"
                else (
                    agg.mean - agg.std,
                    agg.mean + agg.std,
                )
            )
            ax.fill_between(agg.steps, low, high, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    spread = {"minmax": "min-max band", "std": "+-1 std band", "none": "mean"}[band]
    ax.set_title(title or f"{metric} (mean over seeds, {spread})")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return _save(fig, path)
