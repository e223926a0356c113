"""Every hook harness calls. Names start with ``harness_``; implementations may take a subset
of the arguments (pluggy's rule).

Registration hooks return records and instantiate nothing. Lifecycle hooks run once per
iteration (a rollout plus an update), never per environment step: per-step customisation such as
reward shaping belongs in the env family (a wrapper its ``[env]`` options select), not in a hook.

Example plugin module::

    from harness import hookimpl
    from harness.registry import AlgorithmSpec

    @hookimpl
    def harness_register_algorithms():
        return [AlgorithmSpec("my_algo", make_agent=make_agent, config_cls=MyConfig)]

    @hookimpl
    def harness_iteration_end(run, metrics):
        if metrics.get("charts/episodic_return", 0) > 400:
            run.log.info("good policy at step %d", run.step)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from harness.registry import (
        AlgorithmSpec,
        BackendSpec,
        CommandSpec,
        CompetitionSpec,
        EnvSpec,
        TrackerSpec,
        TransportSpec,
    )
    from harness.runtime.state import Run

PROJECT = "harness"
"""The pluggy project name, and the entry-point group plugins are advertised in."""
hookspec = pluggy.HookspecMarker(PROJECT)
"""Marks the hook specifications below (harness's own; plugins do not use it)."""
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's hook implementations: ``@hookimpl`` (also ``from harness import hookimpl``).
Options such as ``@hookimpl(tryfirst=True)`` are pluggy's."""


@hookspec
def harness_register_algorithms() -> Iterable[AlgorithmSpec]:
    """Return algorithm records, e.g. ``[AlgorithmSpec("ppo", make_agent, PPOConfig)]``."""
    raise NotImplementedError


@hookspec
def harness_register_envs() -> Iterable[EnvSpec]:
    """Return env-family records, e.g. ``[EnvSpec("gymnasium", make_env, accepts)]``."""
    raise NotImplementedError


@hookspec
def harness_register_backends() -> Iterable[BackendSpec]:
    """Return NN backend records, e.g. ``[BackendSpec("torch", load=load_torch_backend)]``."""
    raise NotImplementedError


@hookspec
def harness_register_transports() -> Iterable[TransportSpec]:
    """Return distribution-transport records, e.g. ``[TransportSpec("zmq", connect)]``."""
    raise NotImplementedError


@hookspec
def harness_register_trackers() -> Iterable[TrackerSpec]:
    """Return tracker records, e.g. ``[TrackerSpec("tensorboard", make, default=True)]``."""
    raise NotImplementedError


@hookspec
def harness_register_competitions() -> Iterable[CompetitionSpec]:
    """Return competition packs, e.g. ``[CompetitionSpec("cartpole", Path(".../pack.toml"))]``."""
    raise NotImplementedError


@hookspec
def harness_register_commands() -> Iterable[CommandSpec]:
    """Return CLI subcommands, e.g. ``[CommandSpec("tune", add_arguments, run, help=...)]``:
    ``harness tune ...`` then runs ``run(args)``."""
    raise NotImplementedError


@hookspec
def harness_configure(config: Any) -> None:
    """Inspect or adjust the resolved config before anything is built.

    Raise :class:`harness.errors.ConfigError` to refuse a config, e.g.
    ``if config.run.total_steps < 1000: raise ConfigError("...")``.
    """


@hookspec
def harness_run_start(run: Run) -> None:
    """Called once the run directory, env and agent exist, before the first iteration."""


LOGGED_WINDOW = "charts/episodes"
"""The metric that marks an iteration which logged its window (``harness_iteration_end``): the
run's episode count, present only then."""


@hookspec
def harness_iteration_end(run: Run, metrics: Mapping[str, float]) -> None:
    """Called after each iteration with its namespaced metrics (``charts/``, ``losses/``,
    ``perf/``); ``run.step`` is the env-step count so far. The ``charts/`` episode means are
    those of the log window so far; an iteration that logs its window (every
    ``run.log_every`` steps) also carries :data:`LOGGED_WINDOW` (``charts/episodes``, the run's
    episode count) and ``perf/SPS``."""


@hookspec
def harness_checkpoint(run: Run, path: Path) -> None:
    """Called after a checkpoint directory was written atomically at ``path``."""


@hookspec
def harness_run_end(run: Run, summary: Mapping[str, Any]) -> None:
    """Called once when the run finishes, with its summary (the ``summary.json`` values);
    also after an error: empty, or, where the run ended cleanly on an error it could name
    (a full disk, an env fault), the partial summary with its ``error``."""
