"""The state of a training run and what a run reports: :class:`Run` (handed to the lifecycle
hooks), :class:`RunResult` (what ``train`` returns) and :class:`EvalResult`; and the runner
state a checkpoint keeps of a run (``runner.json``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Agent, EnvInfo
from harness.config import Config
from harness.errors import CheckpointError, ConfigError
from harness.plugins import HarnessPluginManager
from harness.registry import Registry
from harness.rundir import RunLock
from harness.runtime.acting import NO_FARM, ActingPlan
from harness.runtime.collectors import Collector
from harness.runtime.stepper import configure_envs
from harness.tracking import MetricsRouter

RUN_LOG = logging.getLogger("harness.runtime.run")
"""The runner's logger (``Run.log``): its name stays that of the module that runs the loop,
where log filters and handlers set up for runs already point."""

RUNNER_STATE = "runner.json"
"""The file of a checkpoint that holds the runner state (:func:`runner_state`)."""


@dataclass
class EvalResult:
    """What ``evaluate`` returns: the evaluated episodes."""

    returns: list[float]
    """Each episode's return."""
    lengths: list[int]
    """Each episode's length."""
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """The env's episode metrics (see ``EPISODE_METRICS``), one list per name."""

    def metric_means(self) -> dict[str, float]:
        """The mean of each episode metric."""
        return {name: float(np.mean(v)) for name, v in self.metrics.items() if v}

    @property
    def mean(self) -> float:
        """The mean return (nan without episodes)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")

    @property
    def std(self) -> float:
        """The standard deviation of the returns (nan without episodes)."""
        return float(np.std(self.returns)) if self.returns else float("nan")


@dataclass
class RunResult:
    """What ``train`` returns (and ``harness run`` prints)."""

    run_dir: Path
    """The run directory."""
    steps: int
    """Env steps trained (for an offline agent, gradient updates)."""
    episodes: int
    """Training episodes finished."""
    wall_time: float
    """Seconds from the start of training to the summary."""
    final_eval: float
    """The mean return of the last evaluation (nan without one)."""
    best_eval: float
    """The best mean evaluation return."""
    recent_return: float
    """The mean return of the last (up to) 20 training episodes."""
    checkpoint: Path | None
    """The final checkpoint."""
    stopped_early: bool
    """True when the run stopped before its step budget (a return threshold, a time limit,
    a plugin's request, SIGTERM)."""
    terminated: bool = False
    """True when SIGTERM stopped the run: it ended after the iteration it was in, with a
    checkpoint and without the final evaluation (``harness run`` exits 143)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON values (paths as strings): ``summary.json``."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass
class Run:
    """The state of one training run, handed to lifecycle hooks. Treat its attributes as
    read-only; change the run only through :meth:`update_env` and :attr:`stop_requested`."""

    config: Config
    """The resolved run config: ``config.run`` (the ``[run]`` section), ``config.algo``,
    ``config.env`` and ``config.backend`` (instances of the selected plugins' config
    dataclasses)."""
    registry: Registry
    """Every record the loaded plugins registered."""
    pm: HarnessPluginManager
    """The plugin manager whose hooks the run calls."""
    run_dir: Path
    """The run directory (``config.toml``, ``metrics.csv``, ``checkpoints/``, ...)."""
    agent: Agent
    """The learning agent."""
    envs: Any
    """The vector env of this process (with remote actors: one env that describes the
    spaces)."""
    info: EnvInfo
    """The env as the agent sees it."""
    router: MetricsRouter
    """Where metrics rows go (the run's trackers)."""
    step: int = 0
    """Env steps so far (vector steps times envs; for an offline agent, gradient updates)."""
    iteration: int = 0
    """Iterations (a rollout plus an update) so far."""
    episodes: int = 0
    """Training episodes finished so far."""
    best_eval: float = -math.inf
    """The best mean evaluation return so far (``-inf`` before the first evaluation)."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """``(step, mean training return)`` of every logged row that had finished episodes."""
    eval_history: list[tuple[int, float]] = field(default_factory=list)
    """``(step, mean evaluation return)`` of every evaluation."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=20))
    """The returns of the last (up to) 20 training episodes."""
    log: logging.Logger = RUN_LOG
    """The runner's logger, for messages that belong to the run."""
    stop_requested: bool = False
    """Set by a plugin (e.g. in harness_iteration_end) to end the run after this iteration."""
    terminated: bool = False
    """Set when the process got SIGTERM (``train`` in the main thread): the run ends after this
    iteration with a checkpoint, skipping the final evaluation."""
    # where the run's actions are computed: run.inference decided once at build time
    # (harness.runtime.acting.plan_acting), read by the collector and the farm (a comment,
    # not a docstring: the plan is the runtime's own, not part of the API reference)
    acting: ActingPlan = NO_FARM
    collector: Collector | None = None
    """Where experience comes from: the envs of this process, remote actors or, for an
    offline agent, nothing; set when training starts."""
    env_changes: dict[str, Any] = field(default_factory=dict)
    """``[env]`` options changed during the run by :meth:`update_env` or recorded by
    :meth:`remember_env` (kept in checkpoints; a resumed run applies them)."""
    lock: RunLock | None = None
    """The lock on :attr:`run_dir` this process holds while the run lives
    (:func:`harness.rundir.lock_run_dir`); ``train`` releases it at the end."""

    def remember_env(self, **changes: Any) -> None:
        """Record ``[env]`` options for a resumed run to give its envs (:meth:`update_env` at
        the restore) without changing the running envs: for state the envs keep themselves
        and a resumed run would otherwise start again without (harness_myo's adaptive goal
        range records each logged mean range here)."""
        self._check_env_options(changes)
        self.env_changes.update(changes)

    def _check_env_options(self, changes: dict[str, Any]) -> Any:
        """The current ``[env]`` options, which must have every option in ``changes``."""
        current: Any = self.config.env
        if current is None or not dataclasses.is_dataclass(current) or isinstance(current, type):
            raise ConfigError(f"{self.config.run.env!r} has no [env] options to change.")
        names = {f.name for f in dataclasses.fields(current)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(
                f"[env] has no option {', '.join(map(repr, unknown))} "
                f"(options: {', '.join(sorted(names))})."
            )
        return current

    def update_env(self, **changes: Any) -> None:
        """Change ``[env]`` options of the running envs (a curriculum): every env, here and in
        every farm actor (replacements and evaluation envs are built with them), gets
        ``configure(**changes)``, which takes effect at its next episode. Env plugins that
        support it document which options may change."""
        if not changes:
            return
        current = self._check_env_options(changes)
        self.config = dataclasses.replace(self.config, env=dataclasses.replace(current, **changes))
        self.env_changes.update(changes)
        configure_envs(self.envs, changes)
        if self.collector is not None:
            self.collector.update_env(self.config, changes)
        self.log.info("env options changed at step %d: %s", self.step, changes)

    @property
    def recent_return(self) -> float:
        """The mean return of the last (up to) 20 training episodes (nan before the
        first)."""
        return float(np.mean(self.recent)) if self.recent else float("nan")


def runner_state(run: Run) -> dict[str, Any]:
    """What a checkpoint keeps of ``run`` beside the agent (JSON values)."""
    return {
        "step": run.step,
        "iteration": run.iteration,
        "episodes": run.episodes,
        "best_eval": run.best_eval if math.isfinite(run.best_eval) else None,
        "history": run.history,
        "eval_history": run.eval_history,
        "recent": list(run.recent),
        "env_changes": run.env_changes,
    }


_RUNNER_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "iteration": (int,),
    "episodes": (int,),
    "best_eval": (int, float, type(None)),
    "history": (list,),
    "eval_history": (list,),
    "recent": (list,),
}
"""The keys of ``runner.json`` and their JSON types (``env_changes`` is optional)."""


def read_runner_state(ckpt: Path, env_options: Any = None) -> dict[str, Any]:
    """The runner state of checkpoint directory ``ckpt``, checked (a truncated or edited
    ``runner.json`` is refused naming the file, before a resume writes anything); with
    ``env_options`` (the run's ``[env]`` dataclass) its recorded env changes must be options
    of it."""
    path = ckpt / RUNNER_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _damaged(ckpt, f"{path} cannot be read ({exc})") from None
    if not isinstance(state, dict):
        raise _damaged(ckpt, f"{path} holds {type(state).__name__}, not a JSON object")
    for key, types in _RUNNER_FIELDS.items():
        value = state.get(key)
        if key not in state or isinstance(value, bool) or not isinstance(value, types):
            raise _damaged(ckpt, f"{path} has no valid {key!r} (found {value!r:.60})")
    pairs = state["history"] + state["eval_history"]
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise _damaged(ckpt, f"{path}: history entries must be [step, return] pairs")
    changes = state.get("env_changes") or {}
    if not isinstance(changes, dict):
        raise _damaged(ckpt, f"{path}: env_changes must be a JSON object")
    if changes and env_options is not None and dataclasses.is_dataclass(env_options):
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(env_options)})
        if unknown:
            raise _damaged(ckpt, f"{path} records env changes of options [env] has not: {unknown}")
    return state


def _damaged(ckpt: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"Checkpoint {ckpt} is damaged: {what}. Nothing was written. Move it out of "
        f"{ckpt.parent} to resume from the checkpoint before it, or start a fresh run."
    )


def restore_runner_state(run: Run, state: dict[str, Any]) -> None:
    """Put a checkpoint's :func:`runner_state` back into ``run`` (a resume)."""
    run.step = int(state["step"])
    run.iteration = int(state["iteration"])
    run.episodes = int(state["episodes"])
    run.best_eval = state["best_eval"] if state["best_eval"] is not None else -math.inf
    run.history = [(int(a), float(b)) for a, b in state["history"]]
    run.eval_history = [(int(a), float(b)) for a, b in state["eval_history"]]
    run.recent.extend(state["recent"])
    if state.get("env_changes"):  # a curriculum's stage, an adaptive range go on where they were
        run.update_env(**state["env_changes"])
