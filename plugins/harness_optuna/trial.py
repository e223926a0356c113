"""One trial: an in-process ``train(config)`` that reports to its Optuna trial and stops when
the pruner says so. The same function runs in the ``harness tune`` process (``--jobs 1``) and
inside a remote :class:`TrialWorker` actor (``--jobs J``); either way it reaches the study
through the shared storage."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import hookimpl
from harness.plugins import PluginSelection


@dataclass(frozen=True)
class TrialJob:
    """Everything a worker needs to run one trial (plain data: it crosses processes)."""

    study_name: str
    storage: str
    trial_id: int
    number: int
    config: dict[str, dict[str, Any]]
    """The trial's full resolved config (``Config.to_dict()``)."""
    metric: str
    direction: str
    objective: str
    pruner: str
    pruner_options: dict[str, Any] = field(default_factory=dict)
    plugins: PluginSelection = field(default_factory=PluginSelection)
    """The ``harness tune`` command's plugin selection: the trial loads exactly it."""


@dataclass(frozen=True)
class TrialOutcome:
    number: int
    pruned: bool
    value: float
    """The objective value (the last reported one when pruned; NaN when none was reported)."""
    reported: int
    run_dir: str
    wall_s: float
    pid: int


class TrialReporter:
    """A harness plugin for one run: ``trial.report(metric, env step)`` at each evaluation and
    ``run.stop_requested`` once the pruner says the trial is not promising."""

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial = trial
        self.metric = metric
        self.values: list[tuple[int, float]] = []
        self.pruned = False

    @hookimpl
    def harness_run_end(self, run: Any, summary: Mapping[str, Any]) -> None:
        """The closing evaluation (after the last iteration) counts as the final value."""
        value = summary.get("final_eval_metrics", {}).get(self.metric)
        if value is None or not math.isfinite(value):
            return
        if not self.values or self.values[-1] != (run.step, float(value)):
            self.values.append((run.step, float(value)))

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            return
        self.values.append((run.step, float(value)))
        self.trial.report(float(value), step=run.step)
        if self.trial.should_prune():
            self.pruned = True
            run.stop_requested = True


def objective_value(
    reporter: TrialReporter, eval_history: list[tuple[int, float]], job: TrialJob
) -> float:
    """The trial's value: the metric's final (or best) value. For ``eval/mean_return`` the
    run's own evaluation history counts, which includes the closing evaluation."""
    values = [v for _, v in (eval_history if job.metric == "eval/mean_return" else [])]
    values = values or [v for _, v in reporter.values]
    if not values:
        return math.nan
    if job.objective == "best":
        return max(values) if job.direction == "maximize" else min(values)
    return values[-1]


def wandb_group(job: TrialJob) -> str:
    """The W&B group of a study's trials (``HARNESS_WANDB_GROUP``, read by the wandb tracker)."""
    return f"tune-{job.study_name}"


def run_trial(job: TrialJob) -> TrialOutcome:
    """Train ``job.config`` in this process, reporting to trial ``job.number``."""
    import optuna

    from harness.config import RawConfig, resolve
    from harness.runtime import train
    from harness_optuna.storage import make_pruner, open_storage

    t0 = time.perf_counter()
    # the W&B tracker groups the runs of one study (a group the user set is kept)
    os.environ["HARNESS_WANDB_GROUP"] = os.environ.get("HARNESS_WANDB_GROUP") or wandb_group(job)
    run_cfg = job.config["run"]
    pruner = make_pruner(
        job.pruner, job.pruner_options, int(run_cfg["eval_every"]), int(run_cfg["total_steps"])
    )
    study = optuna.load_study(
        study_name=job.study_name, storage=open_storage(job.storage), pruner=pruner
    )
    trial = optuna.trial.Trial(study, job.trial_id)
    pm, registry = job.plugins.load_plugins(f"tune trial {job.number} (pid {os.getpid()})")
    raw = RawConfig()
    raw.merge(job.config, f"harness tune trial {job.number}", for_algo=run_cfg["algo"])
    config = resolve(raw, registry)
    reporter = TrialReporter(trial, job.metric)
    pm.register(reporter, name="harness-tune-trial")
    eval_history: list[tuple[int, float]] = []

    class _History:
        @hookimpl
        def harness_run_end(self, run: Any) -> None:
            eval_history.extend(run.eval_history)

    pm.register(_History(), name="harness-tune-history")
    started = time.time()
    result = train(config, registry, pm)
    trial.set_user_attr("run_dir", str(result.run_dir))
    trial.set_user_attr("worker", {"pid": os.getpid(), "start": started, "end": time.time()})
    return TrialOutcome(
        number=job.number,
        pruned=reporter.pruned,
        value=objective_value(reporter, eval_history, job),
        reported=len(reporter.values),
        run_dir=str(result.run_dir),
        wall_s=time.perf_counter() - t0,
        pid=os.getpid(),
    )


class TrialWorker:
    """A remote actor running trials one after another (``RemoteClass(TrialWorker, ...)``)."""

    def run(self, job: TrialJob) -> TrialOutcome:
        return run_trial(job)

    def pid(self) -> int:
        return os.getpid()
