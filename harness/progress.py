"""Training progress on stderr, as lifecycle-hook plugins the CLI registers (the runner itself
never prints): a live rich bar on a terminal, plain lines every ``run.progress_every_s``
seconds elsewhere (nohup, a batch scheduler, CI), where a bar would print nothing until it
ends or fill a log file with redraws.

Both update from ``harness_iteration_end``, once per iteration at most, never per env step.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from harness.hookspecs import hookimpl


class RichProgressReporter:
    """A rich progress bar with steps/s and the recent return, updated once per iteration."""

    def __init__(self, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]:>7} steps/s"),
            TextColumn("{task.fields[episodes]:>6} episodes"),
            TextColumn("return {task.fields[ret]:>7}{task.fields[score]}"),
            TextColumn("eval {task.fields[eval]:>7}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.task = self.progress.add_task(
            "train", total=total, sps="-", episodes=0, ret="-", score="", eval="-"
        )

    @hookimpl
    def harness_run_start(self, run: Any) -> None:
        self.progress.update(self.task, description=run.run_dir.name, completed=run.step)
        self.progress.start()

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        fields: dict[str, Any] = {}
        if "perf/SPS" in metrics:
            fields["sps"] = f"{metrics['perf/SPS']:.0f}"
        if math.isfinite(run.recent_return):
            fields["ret"] = f"{run.recent_return:.1f}"
        if "eval/mean_return" in metrics:
            fields["eval"] = f"{metrics['eval/mean_return']:.1f}"
        fields["episodes"] = run.episodes
        if "charts/score" in metrics:  # an env's official score beside the shaped return
            fields["score"] = f"  score {metrics['charts/score']:>7.1f}"
        self.progress.update(self.task, completed=run.step, **fields)

    @hookimpl
    def harness_run_end(self) -> None:
        self.progress.stop()


class LineProgressReporter:
    """One plain line on ``stream`` every ``every_s`` seconds, checked once per iteration
    (Sample Factory and SB3 log the same way), and a last one when the run ends::

        harness: step 12288/100000 (12%) | 2410 steps/s | 96 episodes | return 41.3
        | eval 120.5 | elapsed 0:00:05 | ETA 0:00:36

    (one line). steps/s is measured since the previous line (the last line: over the whole
    run); the ETA uses the rate since the start of this process (a resumed run counts from its
    checkpoint's step). With ``max_seconds`` (``run.max_seconds`` > 0, which ends the run
    after that many seconds of this process) the ETA is the sooner of the steps left and the
    time left."""

    def __init__(
        self,
        total: int,
        every_s: float,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_seconds: float = 0.0,
    ) -> None:
        self.total = total
        self.every_s = every_s
        self.max_seconds = max_seconds
        self.stream = stream
        self.clock = clock
        self.started: float | None = None  # (None until the run has started)
        self.last_time = 0.0
        self.first_step = self.last_step = 0
        self.score: float | None = None
        self.eval: float | None = None

    @hookimpl
    def harness_run_start(self, run: Any) -> None:
        self.started = self.last_time = self.clock()
        self.first_step = self.last_step = run.step

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        if "charts/score" in metrics:  # only in iterations where episodes ended: keep it
            self.score = metrics["charts/score"]
        if "eval/mean_return" in metrics:
            self.eval = metrics["eval/mean_return"]
        if self.clock() - self.last_time >= self.every_s:
            self._write(run)

    @hookimpl
    def harness_run_end(self, run: Any, summary: Mapping[str, Any]) -> None:
        if self.started is None:
            return
        if not summary:  # (an error ended the run: the CLI reports it next)
            self._write(run, " | ended by an error")
        else:
            self._write(run, " | stopped early" if summary.get("stopped_early") else " | done")

    def _write(self, run: Any, tail: str = "") -> None:
        """A line; the last one (``tail`` set) gives the whole run's steps/s."""
        if self.started is None:
            return
        now = self.clock()
        step = int(run.step)
        overall = (step - self.first_step) / max(now - self.started, 1e-9)
        rate = overall if tail else (step - self.last_step) / max(now - self.last_time, 1e-9)
        parts = [
            f"harness: step {step}/{self.total} ({100 * step / max(self.total, 1):.0f}%)",
            f"{rate:.0f} steps/s",
            f"{run.episodes} episodes",
        ]
        if math.isfinite(run.recent_return):
            parts.append(f"return {run.recent_return:.1f}")
        if self.score is not None:
            parts.append(f"score {self.score:.1f}")
        if self.eval is not None:
            parts.append(f"eval {self.eval:.1f}")
        parts.append(f"elapsed {_clock_time(now - self.started)}")
        if step < self.total and (overall > 0 or self.max_seconds > 0):
            left = (self.total - step) / overall if overall > 0 else math.inf
            if self.max_seconds > 0:  # the run ends at its time limit if that comes first
                left = min(left, self.max_seconds - (now - self.started))
            parts.append(f"ETA {_clock_time(left)}")
        stream = self.stream if self.stream is not None else sys.stderr
        print(" | ".join(parts) + tail, file=stream, flush=True)
        self.last_time, self.last_step = now, step


def _clock_time(seconds: float) -> str:
    """``H:MM:SS`` (rich's and tqdm's format)."""
    whole = int(max(0.0, seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
