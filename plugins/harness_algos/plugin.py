"""Registers the first-party algorithms. Algorithm modules import only numpy and harness (the
backend brings the framework), so listing plugins imports no framework."""

from __future__ import annotations

from harness import hookimpl
from harness.registry import AlgorithmSpec
from harness_algos import dqn, ppo, random_policy


@hookimpl
def harness_register_algorithms() -> list[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            "dqn",
            make_agent=dqn.make_agent,
            config_cls=dqn.DQNConfig,
            action_spaces=("discrete",),
            description="DQN with double, dueling and prioritized-replay options",
        ),
        AlgorithmSpec(
            "ppo",
            make_agent=ppo.make_agent,
            config_cls=ppo.PPOConfig,
            action_spaces=("discrete", "box"),
            description="PPO (clipped objective, GAE, vectorized envs)",
        ),
        AlgorithmSpec(
            "random",
            make_agent=random_policy.make_agent,
            config_cls=random_policy.RandomConfig,
            action_spaces=("discrete", "box"),
            description="uniformly random actions, no learning (floor and overhead baseline)",
        ),
    ]
