"""Learning-curve plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_learning_curve(
    train: Sequence[tuple[int, float]],
    evals: Sequence[tuple[int, float]],
    path: Path,
    title: str,
) -> Path:
    """Training episodic return and greedy evaluation return against env steps."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
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
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
