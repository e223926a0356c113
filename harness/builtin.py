"""Built-in plugin: what the core itself registers (the CSV tracker, ``harness plot`` and a
finished run's ``learning_curve.png``). Built-ins are plugins too, registered the same way,
and can be blocked with ``-p no:builtin``. (``harness checkpoint convert`` is a core command
of :mod:`harness.cli`: it must work with every plugin blocked.)"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harness.hookspecs import hookimpl
from harness.registry import CommandSpec, TrackerSpec
from harness.tracking import CSVTracker

if TYPE_CHECKING:
    from harness.runtime.state import Run

log = logging.getLogger(__name__)


@hookimpl
def harness_register_trackers() -> list[TrackerSpec]:
    return [TrackerSpec("csv", make=CSVTracker, default=True, description="metrics.csv")]


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.plot_cli import add_arguments  # numpy and matplotlib only when plotting

    add_arguments(parser)


def _plot_run(args: argparse.Namespace) -> int:
    from harness.plot_cli import run

    return run(args)


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "plot",
            add_arguments=_plot_arguments,
            run=_plot_run,
            help="learning curves of several runs in one PNG (mean and spread over seeds)",
            description=(
                "Plot a metric of several run directories in one PNG. Runs whose configs differ "
                "only by seed are drawn as their mean with a min-max or std band."
            ),
        ),
    ]


@hookimpl
def harness_run_end(run: Run, summary: Mapping[str, Any]) -> None:
    """``learning_curve.png`` in the run directory of a run that trained to its end (its
    ``summary``: a run that failed has none, or one with an ``error``): the training and
    evaluation returns against env steps. matplotlib is optional (a warning without it)."""
    if not summary or "error" in summary:
        return
    try:
        from harness.plotting import plot_learning_curve
    except ImportError:
        log.warning("matplotlib is missing: no learning_curve.png (pip install matplotlib)")
        return
    title = f"{run.config.run.algo} on {run.config.run.env} (seed {run.config.run.seed})"
    path = run.run_dir / "learning_curve.png"
    try:
        plot_learning_curve(run.history, run.eval_history, path, title)
    except Exception as exc:  # (train calls this while closing the run: a picture never fails it)
        log.warning("could not write %s: %s: %s", path, type(exc).__name__, exc)
