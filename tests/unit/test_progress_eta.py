"""The plain progress line's ETA is the sooner of the steps left and ``run.max_seconds``."""

from __future__ import annotations

import io
from types import SimpleNamespace

from harness.progress import LineProgressReporter


def eta_of(max_seconds: float) -> str:
    """The ETA of the first line of a run 1% through its steps after 60 s."""
    now = [0.0]
    out = io.StringIO()
    reporter = LineProgressReporter(
        1_000_000, 30.0, stream=out, clock=lambda: now[0], max_seconds=max_seconds
    )
    run = SimpleNamespace(step=0, episodes=0, recent_return=float("nan"))
    reporter.harness_run_start(run=run)
    now[0], run.step = 60.0, 10_000
    reporter.harness_iteration_end(run=run, metrics={})
    (line,) = out.getvalue().splitlines()
    return line.rsplit(" | ", 1)[1]


def test_eta_counts_steps_without_a_time_limit() -> None:
    assert eta_of(0.0) == "ETA 1:39:00"  # 990k steps at 10k per minute


def test_eta_is_the_time_limit_when_that_comes_first() -> None:
    assert eta_of(20 * 60) == "ETA 0:19:00"  # the run ends at 20 minutes, 1 of them gone


def test_eta_is_the_steps_when_they_come_first() -> None:
    assert eta_of(3 * 3600) == "ETA 1:39:00"
