"""``random``: uniformly random actions, no learning.

The floor every competition result is compared with, and a policy that costs (almost) nothing
to run, for measuring what the runner and the actor farm themselves cost
(tools/bench_farm.py --algo random).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition


@dataclass
class RandomConfig:
    """Options of the random policy ([algo] section)."""

    rollout_len: int = 16
    """Vector steps per iteration (between two no-op learn calls)."""

    def __post_init__(self) -> None:
        if self.rollout_len < 1:
            raise ValueError("rollout_len must be >= 1")


class RandomPolicy(Algorithm):
    """No parameters: state and weights are empty."""

    def learn(self, batch: Any) -> dict[str, float]:
        return {}

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        pass

    def policy_weights(self) -> dict[str, np.ndarray]:
        return {}

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        pass


class RandomAgent(Agent):
    algorithm: RandomPolicy
    independent_transitions = True  # observe only counts steps

    def __init__(
        self, algorithm: RandomPolicy, info: EnvInfo, config: RandomConfig, *, seed: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed)
        self.name = "random"
        self.rollout_len = config.rollout_len
        self.action = info.action
        self.n = info.num_envs
        if info.action.kind == "box":
            self.low = np.asarray(info.action.low, np.float32).reshape(info.action.shape)
            self.high = np.asarray(info.action.high, np.float32).reshape(info.action.shape)

    def _random(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.action.kind == "discrete":
            # floor(u * n) with u in [0, 1): uniform over 0..n-1, 2-3x cheaper than integers()
            return (rng.random(count) * self.action.n).astype(np.int64)
        u = rng.random((count, *self.action.shape), dtype=np.float32)
        return self.low + u * (self.high - self.low)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self._random(len(obs), self.rng), {}

    def predict(self, obs: np.ndarray) -> np.ndarray:
        # deterministic like every predict(): random, but a fixed function of the observations
        seed = zlib.crc32(np.ascontiguousarray(obs).tobytes())
        return self._random(len(obs), np.random.default_rng(seed))

    def observe(self, transition: Transition) -> None:
        self.env_steps += len(transition.obs)

    def learn(self) -> dict[str, float]:
        return {}


def make_agent(
    info: EnvInfo, backend: Backend, config: RandomConfig, *, seed: int = 0, total_steps: int = 1
) -> RandomAgent:
    return RandomAgent(RandomPolicy(backend), info, config, seed=seed)
