"""``harness plot RUN_DIR [RUN_DIR ...]``: learning curves of several runs in one PNG.

Runs whose resolved configs (``config.toml``) are equal except for the seed and bookkeeping keys
(:data:`IGNORED_KEYS`) form one group, drawn as the mean across seeds with a band (min-max or
one standard deviation); different configs get their own line. Curves are read from each run's
``metrics.csv``; seeds logged at different steps are linearly interpolated onto the union of
their steps within the range every seed covers.

    harness plot runs/ppo_s1 runs/ppo_s2 runs/ppo_s3 runs/dqn_s1 --out curves.png

The data functions here need only numpy; matplotlib is imported when drawing.
"""

from __future__ import annotations

import argparse
import csv
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError, did_you_mean

DEFAULT_METRIC = "charts/episodic_return"
IGNORED_KEYS = frozenset(
    f"run.{k}"
    for k in (
        "seed",
        "name",
        "out",
        "trackers",
        "progress",
        "progress_every_s",
        "log_every",
        "max_seconds",
        "cluster",
        "cluster_keys",
        "max_actors",
    )
)
"""Config keys that do not make two runs different experiments (seed repeats group together)."""
BANDS = ("minmax", "std", "none")


@dataclass
class Curve:
    """One run's metric against env steps (rows without a value dropped)."""

    run_dir: Path
    steps: np.ndarray
    values: np.ndarray
    config: dict[str, Any] = field(default_factory=dict)
    """The flattened resolved config (``section.key``), empty without ``config.toml``."""


@dataclass
class Aggregate:
    """Several seeds of one config on a common step grid."""

    label: str
    runs: list[Path]
    steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def rows(self) -> list[dict[str, float | str]]:
        """One dict per grid step (for ``--csv``)."""
        return [
            {
                "label": self.label,
                "step": float(s),
                "mean": float(m),
                "std": float(d),
                "min": float(lo),
                "max": float(hi),
                "seeds": len(self.runs),
            }
            for s, m, d, lo, hi in zip(
                self.steps, self.mean, self.std, self.low, self.high, strict=True
            )
        ]


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = tuple(value) if isinstance(value, list) else value
    return flat


def read_metrics(run_dir: Path) -> dict[str, np.ndarray]:
    """``metrics.csv`` of a run as columns (missing cells are NaN)."""
    path = Path(run_dir) / "metrics.csv"
    if not Path(run_dir).is_dir():
        raise HarnessError(f"{run_dir} is not a directory; give run directories to harness plot.")
    if not path.is_file():
        raise HarnessError(
            f"{run_dir} has no metrics.csv: is it a run directory? `harness run` writes "
            f"RUN_DIR/metrics.csv (the csv tracker, on by default)."
        )
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        names = list(reader.fieldnames or [])
        rows = list(reader)
    if "step" not in names:
        raise HarnessError(f"{path} has no 'step' column; it was not written by harness.")
    return {
        name: np.array(
            [float(r[name]) if r.get(name) not in (None, "") else math.nan for r in rows]
        )
        for name in names
    }


def load_curve(run_dir: Path, metric: str) -> Curve:
    """``metric`` of one run; a clear error listing the available metrics when it is absent."""
    columns = read_metrics(run_dir)
    available = sorted(n for n, v in columns.items() if n != "step" and np.isfinite(v).any())
    if metric not in available:
        raise HarnessError(
            f"{run_dir}/metrics.csv has no values for metric {metric!r}."
            f"{did_you_mean(metric, available)} Available: {', '.join(available) or 'none'}."
        )
    keep = np.isfinite(columns[metric])
    steps, values = columns["step"][keep], columns[metric][keep]
    order = np.argsort(steps, kind="stable")
    config_file = Path(run_dir) / "config.toml"
    config = _flatten(tomllib.loads(config_file.read_text("utf-8"))) if config_file.exists() else {}
    return Curve(Path(run_dir), steps[order], values[order], config)


def group_by_config(curves: Sequence[Curve]) -> list[list[Curve]]:
    """Curves whose configs match outside :data:`IGNORED_KEYS`, in first-seen order. A run
    without ``config.toml`` is a group of its own."""
    groups: dict[Any, list[Curve]] = {}
    for curve in curves:
        if curve.config:
            key: Any = tuple(
                sorted((k, repr(v)) for k, v in curve.config.items() if k not in IGNORED_KEYS)
            )
        else:
            key = ("dir", str(curve.run_dir))
        groups.setdefault(key, []).append(curve)
    return list(groups.values())


def aggregate(curves: Sequence[Curve], label: str) -> Aggregate:
    """Mean, std, min and max across ``curves`` on a common step grid: their shared steps when
    all logged at the same steps, otherwise the union of steps within the range all cover,
    each curve linearly interpolated."""
    if not curves:
        raise ValueError("aggregate needs at least one curve")
    first = curves[0].steps
    if all(np.array_equal(c.steps, first) for c in curves):
        grid = first
        stack = np.stack([c.values for c in curves])
    else:
        lo = max(float(c.steps[0]) for c in curves)
        hi = min(float(c.steps[-1]) for c in curves)
        if lo > hi:
            names = ", ".join(str(c.run_dir) for c in curves)
            raise HarnessError(f"the runs {names} share no step range; plot them separately.")
        union = np.unique(np.concatenate([c.steps for c in curves]))
        grid = union[(union >= lo) & (union <= hi)]
        stack = np.stack([np.interp(grid, c.steps, c.values) for c in curves])
    return Aggregate(
        label=label,
        runs=[c.run_dir for c in curves],
        steps=grid,
        mean=stack.mean(axis=0),
        std=stack.std(axis=0),
        low=stack.min(axis=0),
        high=stack.max(axis=0),
    )


def _labels(groups: Sequence[list[Curve]]) -> list[str]:
    """``algo on env``, plus the config keys that tell apart groups of the same algo and env."""
    configs = [g[0].config for g in groups]
    labels = []
    for group, cfg in zip(groups, configs, strict=True):
        if not cfg:
            labels.append(group[0].run_dir.name)
            continue
        label = f"{cfg.get('run.algo', '?')} on {cfg.get('run.env', '?')}"
        peers = [
            c
            for c in configs
            if c
            and (c.get("run.algo"), c.get("run.env")) == (cfg.get("run.algo"), cfg.get("run.env"))
        ]
        differ = sorted(
            k
            for k in set().union(*peers)
            if k not in IGNORED_KEYS and len({repr(c.get(k)) for c in peers}) > 1
        )
        extra = ", ".join(f"{k}={cfg[k]}" for k in differ[:3] if k in cfg)
        labels.append(f"{label} ({extra})" if extra else label)
    return labels


def aggregate_runs(run_dirs: Sequence[Path], metric: str = DEFAULT_METRIC) -> list[Aggregate]:
    """Load, group by config and aggregate: what ``harness plot`` draws."""
    if not run_dirs:
        raise HarnessError("harness plot needs at least one run directory.")
    curves = [load_curve(Path(d), metric) for d in run_dirs]
    groups = group_by_config(curves)
    return [aggregate(g, lbl) for g, lbl in zip(groups, _labels(groups), strict=True)]


# ------------------------------------------------------------------------------------------
# The command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories")
    parser.add_argument(
        "--metric", default=DEFAULT_METRIC, help=f"metrics.csv column to plot ({DEFAULT_METRIC})"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG to write (default: METRIC.png, '/' -> '_')"
    )
    parser.add_argument(
        "--band",
        choices=BANDS,
        default="minmax",
        help="spread across seeds: min-max, mean +- one std, or none (default minmax)",
    )
    parser.add_argument("--title", default=None, help="plot title")
    parser.add_argument("--csv", type=Path, default=None, help="also write the aggregated curves")


def run(args: argparse.Namespace) -> int:
    aggregates = aggregate_runs(args.run_dirs, args.metric)
    out = args.out or Path(args.metric.replace("/", "_") + ".png")
    from harness.plotting import plot_runs

    plot_runs(aggregates, out, args.metric, band=args.band, title=args.title)
    if args.csv is not None:
        rows = [row for agg in aggregates for row in agg.rows()]
        with open(args.csv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, ["label", "step", "mean", "std", "min", "max", "seeds"])
            writer.writeheader()
            writer.writerows(rows)
    for agg in aggregates:
        print(
            f"{agg.label}: {len(agg.runs)} run(s), final {args.metric} "
            f"{agg.mean[-1]:.2f} +- {agg.std[-1]:.2f} at step {int(agg.steps[-1])}"
        )
    print(f"wrote {out}")
    return 0
