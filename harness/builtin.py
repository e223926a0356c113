"""Built-in plugin: what the core itself registers (the CSV tracker and ``harness plot``).
Built-ins are plugins too, registered the same way, and can be blocked with ``-p no:builtin``.
(``harness checkpoint convert`` is a core command of :mod:`harness.cli`: it must work with
every plugin blocked.)"""

from __future__ import annotations

import argparse

from harness.hookspecs import hookimpl
from harness.registry import CommandSpec, TrackerSpec
from harness.tracking import CSVTracker


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
