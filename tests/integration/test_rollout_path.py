"""One rollout path (issue 49): the serial collector steps its envs as a farm actor does (a
rollout of ``rollout_len`` steps, then its transitions in order), so an exploration schedule
moves between rollouts in both, never inside one."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import Acting, Policy
from harness.runtime import build, build_run
from harness.runtime.build import make_agent, make_envs
from harness.runtime.collectors import SerialCollector
from harness.runtime.farm import RolloutActor
from harness.runtime.spaces import env_info
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


SPREAD = "mpe2/simple_spread_v3"
"""A multi-agent env (agent-keyed observations, actions and rewards)."""
NEEDS_MPE2 = pytest.mark.skipif(
    importlib.util.find_spec("mpe2") is None, reason="multi-agent cases step mpe2's envs"
)


def _assert_same(a: Any, b: Any, name: str) -> None:
    """Equal arrays, or equal agent-keyed dicts of arrays (a multi-agent env's)."""
    if isinstance(a, Mapping):
        assert a.keys() == b.keys(), name
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}[{key}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=name)


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
    assert actor.acting is not None and actor.policy is not None
    farmed: list[tuple[int, float]] = []
    _spy(actor.policy, actor.acting, farmed)
    actor.set_weights(0, agent.weights(), 0)
    for _ in range(6):
        actor.rollout(4)

    for seen in (serial, farmed):
        rollouts = _rollouts(seen, 4)
        assert len(rollouts) == 6
        for k, rollout in enumerate(rollouts):
            # one schedule value per rollout, read at its first step's count
            assert {steps for steps, _ in rollout} == {k * 16}
            assert len({eps for _, eps in rollout}) == 1
        epsilons = [rollout[0][1] for rollout in rollouts]
        assert all(a > b for a, b in itertools.pairwise(epsilons)), epsilons
    # and the two paths follow the same schedule at the same counts
    np.testing.assert_allclose(np.array(serial), np.array(farmed))


@pytest.mark.parametrize(
    ("algo", "env", "extra"),
    [
        ("dqn", "CartPole-v1", ["algo.learning_starts=0", "algo.exploration_fraction=0.5"]),
        ("sac", "Pendulum-v1", ["algo.learning_starts=40"]),
        ("ddpg", "Pendulum-v1", ["algo.learning_starts=40", "algo.ensemble=3"]),
        (
            "ppo",
            "Pendulum-v1",
            [
                "algo.recurrent='lstm'",
                "algo.rnn_hidden=16",
                "algo.noise_correlation=0.5",
                "algo.normalize_obs=true",
            ],
        ),
        ("impala", "CartPole-v1", []),
        ("es", "CartPole-v1", ["algo.noise_size=100000", "algo.hidden=[8]"]),
        (
            "r2d2",
            "CartPole-v1",
            ["algo.rnn_hidden=16", "algo.exploration_initial_eps=0.5", "algo.learning_starts=0"],
        ),
        pytest.param(
            "qmix",
            SPREAD,
            [
                "algo.recurrent=true",
                "algo.last_action=true",
                "algo.epsilon_start=0.5",
                "algo.epsilon_anneal_steps=200",
            ],
            marks=NEEDS_MPE2,
            id="qmix-gru",
        ),
        pytest.param(
            "maddpg", SPREAD, ["algo.learning_starts=40"], marks=NEEDS_MPE2, id="maddpg-discrete"
        ),
        pytest.param(
            "maddpg",
            SPREAD,
            ["algo.learning_starts=40", "env.continuous_actions=true"],
            marks=NEEDS_MPE2,
            id="maddpg-box",
        ),
        pytest.param(
            "mappo", SPREAD, ["env.continuous_actions=true"], marks=NEEDS_MPE2, id="mappo-box"
        ),
    ],
)
def test_a_farm_actor_acts_without_an_agent_as_one_with_an_agent(
    algo: str, env: str, extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the algorithm declares make_policy, a farm actor holds the algorithm and its
    policy, no agent (no replay, no optimiser steps, no learner counters), and steps exactly
    as an actor that builds an agent does: the same actions, extras and episodes over rollouts
    that cross the warm-up and move the exploration schedule, weights broadcast between."""
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    settings = [f"env='{env}'", f"algo='{algo}'", "num_envs=3", "total_steps=600", *extra]
    config = resolve(layer(None, [], [*settings, f"out='{tmp_path}'"], environ={}), registry)
    learner = make_agent(config, registry, env_info(env, make_envs(config, registry, 3, seed=None)))

    def rollouts(actor: RolloutActor) -> list[dict[str, Any]]:
        chunks = []
        for k in range(4):
            weights = (k, learner.weights(), 60 * k) if k % 2 == 0 else None
            chunks.append(actor.rollout(10, weights))
        return chunks

    agentless = RolloutActor(config, 1, 3, seed=11)
    assert agentless.agent is None and isinstance(agentless.acting, Acting)
    assert not hasattr(agentless.acting, "replay")
    monkeypatch.setattr(build, "make_acting", lambda *args: None)  # the path with an agent
    with_agent = RolloutActor(config, 1, 3, seed=11)
    assert with_agent.agent is not None
    for a, b in zip(rollouts(agentless), rollouts(with_agent), strict=True):
        for name in ("obs", "actions", "rewards", "terminated", "truncated"):
            _assert_same(a[name], b[name], name)
        assert a["extras"].keys() == b["extras"].keys()
        assert a["episodes"] == b["episodes"] and a["version"] == b["version"]
