"""Where a run's experience comes from: the :class:`Collector` protocol the train loop drives
and its serial and offline implementations. The third, the actor farm's ``FarmCollector``,
lives in ``harness.runtime.farm``; the train loop picks one per run
(``harness.runtime.run.make_collector``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from harness.config import Config
from harness.runtime.stepper import EnvStepper, Episode, chunk_transitions, env_label
from harness.seeds import Seeds

if TYPE_CHECKING:  # (a Run holds its collector: state imports this module)
    from harness.runtime.state import Run


class Collector(Protocol):
    """What the train loop asks of a source of experience, once per iteration: ``collect``,
    then (after ``agent.learn()``) ``after_learn``; ``close`` when the run ends. The serial,
    offline and farm collectors subclass it for the defaults below (a collector that keeps
    no envs of its own has nothing to do in ``update_env`` or ``close``)."""

    def collect(self, run: Run, finished: list[Episode]) -> None:
        """One iteration's experience: ``run.agent`` observes it, ``run.step`` counts it, and
        the episodes that ended are appended to ``finished``."""
        ...

    def after_learn(self, run: Run) -> dict[str, float]:
        """Called after each update; returns metrics to log beside the agent's."""
        return {}

    def update_env(self, config: Config, changes: dict[str, Any]) -> None:
        """``[env]`` options changed (``Run.update_env``, which has already configured
        ``run.envs``): apply ``changes`` to envs the collector keeps elsewhere and build new
        ones with ``config``. Nothing to do for a collector that steps only ``run.envs``."""
        return None

    def close(self) -> None:
        """The run ended: release what the collector holds (processes, connections)."""
        return None


class SerialCollector(Collector):
    """Experience from envs stepped in this process (``run.envs``)."""

    def __init__(self, run: Run) -> None:
        self.stepper = EnvStepper(
            run.envs,
            Seeds(run.config.run.seed).seed("envs", run.step),
            label=env_label(run.config.run.env, run.registry),
            env_steps=run.step,
        )
        if run.step > 0:  # resumed: fresh episodes. A policy's state rows start over with
            # the stepper; an agent written before Policy keeps them itself: reset them there
            run.agent.episodes_ended(np.ones(self.stepper.n, bool))

    def collect(self, run: Run, finished: list[Episode]) -> None:
        # the farm's path with no process between: a rollout, then its transitions in order
        agent, stepper = run.agent, self.stepper
        chunk = stepper.rollout(agent, agent.rollout_len, finished)
        for transition in chunk_transitions([chunk]):
            agent.observe(transition)
            run.step += stepper.n


class OfflineCollector(Collector):
    """No experience at all: an offline agent learns from its dataset (``Agent.offline``). One
    run step is one gradient update, so ``total_steps``, ``eval_every``, ``log_every`` and
    ``checkpoint_every`` count updates and ``perf/SPS`` is updates per second."""

    def __init__(self, run: Run) -> None:
        del run

    def collect(self, run: Run, finished: list[Episode]) -> None:
        run.step += run.agent.rollout_len
