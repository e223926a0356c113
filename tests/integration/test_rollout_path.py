"""One rollout path (issue 49): the serial collector steps its envs as a farm actor does (a
rollout of ``rollout_len`` steps, then its transitions in order), so an exploration schedule
moves between rollouts in both, never inside one."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import Policy
from harness.runtime import build_run
from harness.runtime.collectors import SerialCollector
from harness.runtime.farm import RolloutActor
from harness.runtime.stepper import Episode

# DQN with train_freq 16 on 4 envs: rollouts of 4 vector steps; epsilon falls from 1.0 to 0.04
# over 16% of 2,000 steps, so it moves by ~0.01 per vector step: a schedule read at each
# step would differ inside every rollout
SETTINGS = [
    "env='CartPole-v1'",
    "algo='dqn'",
    "num_envs=4",
    "total_steps=2000",
    "algo.train_freq=16",
    "algo.learning_starts=100000",
    "trackers=['csv']",
    "progress=false",
]


def _spy(policy: Policy, agent: Any, seen: list[tuple[int, float]]) -> None:
    """Record (agent env steps, epsilon) at each exploratory act of ``policy``."""
    act = policy.act

    def recording(obs: Any, state: Any, rng: Any = None, *, explore: bool) -> Any:
        if explore:
            seen.append((agent.env_steps, float(policy.epsilon())))  # type: ignore[attr-defined]
        return act(obs, state, rng, explore=explore)

    policy.act = recording  # type: ignore[method-assign]


def _rollouts(seen: list[tuple[int, float]], steps: int) -> list[list[tuple[int, float]]]:
    assert len(seen) % steps == 0
    return [seen[i : i + steps] for i in range(0, len(seen), steps)]


def test_serial_runs_and_farm_actors_move_epsilon_between_rollouts_only(tmp_path: Path) -> None:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    config = resolve(layer(None, [], [*SETTINGS, f"out='{tmp_path}'"], environ={}), registry)
    run = build_run(config, registry, pm)
    try:
        agent = run.agent
        assert agent.rollout_len == 4
        collector = SerialCollector(run)
        policy = agent.policy()
        serial: list[tuple[int, float]] = []
        _spy(policy, agent, serial)
        agent.policy = lambda: policy  # type: ignore[method-assign]  # (asked once per actor)
        finished: list[Episode] = []
        for _ in range(6):
            collector.collect(run, finished)
        assert run.step == agent.env_steps == 6 * 4 * 4
    finally:
        run.router.close()
        run.envs.close()
        if run.lock is not None:
            run.lock.release()

    actor = RolloutActor(config, 0, 4, seed=5)
    assert actor.agent is not None and actor.policy is not None
    farm: list[tuple[int, float]] = []
    _spy(actor.policy, actor.agent, farm)
    actor.set_weights(0, actor.agent.weights(), 0)
    for _ in range(6):
        actor.rollout(4)

    for seen in (serial, farm):
        rollouts = _rollouts(seen, 4)
        assert len(rollouts) == 6
        for k, rollout in enumerate(rollouts):
            # one schedule value per rollout, read at its first step's count
            assert {steps for steps, _ in rollout} == {k * 16}
            assert len({eps for _, eps in rollout}) == 1
        epsilons = [rollout[0][1] for rollout in rollouts]
        assert all(a > b for a, b in itertools.pairwise(epsilons)), epsilons
    # and the two paths follow the same schedule at the same counts
    np.testing.assert_allclose(np.array(serial), np.array(farm))
