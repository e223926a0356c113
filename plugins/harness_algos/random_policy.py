"""``random``: uniformly random actions, no learning.

The floor every competition result is compared with, and a policy that costs (almost) nothing
to run, for measuring what the runner and the actor farm themselves cost
(tools/bench_farm.py --algo random).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import (
    Agent,
    Algorithm,
    Backend,
    EnvInfo,
    Obs,
    SpaceInfo,
    Transition,
    batch_size,
)
from harness.policy import ActingParts, Policy, State


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


class Uniform(Policy):
    """Uniform actions from ``rng`` (None: the agent's own generator) when exploring; greedy,
    random too but a fixed function of each row's observation alone (seeded by its hash), so
    acting for any subset of rows gives those rows' actions. In a multi-agent env each agent's
    from its own action space. No weights, no state."""

    def __init__(self, info: EnvInfo, own_rng: Callable[[], np.random.Generator]) -> None:
        self.multi_agent = info.multi_agent
        self.own_rng = own_rng
        """The generator when ``act`` is given none: the agent's ``rng``, read at each call."""
        self.spaces: dict[str, SpaceInfo] = dict(info.actions) or {"": info.action}
        self.bounds = {
            name: (
                np.asarray(space.low, np.float32).reshape(space.shape),
                np.asarray(space.high, np.float32).reshape(space.shape),
            )
            for name, space in self.spaces.items()
            if space.kind == "box"
        }

    def _one(self, name: str, count: int, rng: np.random.Generator) -> np.ndarray:
        space = self.spaces[name]
        if space.kind == "discrete":
            # floor(u * n) with u in [0, 1): uniform over 0..n-1, 2-3x cheaper than integers()
            return (rng.random(count) * space.n).astype(np.int64)
        low, high = self.bounds[name]
        u = rng.random((count, *space.shape), dtype=np.float32)
        return low + u * (high - low)

    def _random(self, count: int, rng: np.random.Generator) -> Any:
        if self.multi_agent:
            return {name: self._one(name, count, rng) for name in self.spaces}
        return self._one("", count, rng)

    def act(
        self,
        obs: Obs,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if explore:
            return self._random(batch_size(obs), self.own_rng() if rng is None else rng), {}, state
        return self._hashed(obs), {}, state

    def _hashed(self, obs: Obs) -> Any:
        parts = list(obs.values()) if isinstance(obs, Mapping) else [obs]
        rows = []
        for i in range(batch_size(obs)):
            seed = 0
            for part in parts:
                seed = zlib.crc32(np.ascontiguousarray(part[i]).tobytes(), seed)
            rows.append(self._random(1, np.random.default_rng(seed)))
        if isinstance(rows[0], Mapping):
            return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
        return np.concatenate(rows)

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.version = version  # (no weights)


class RandomAgent(Agent):
    """Acts through :class:`Uniform`; learns nothing."""

    algorithm: RandomPolicy
    independent_transitions = True  # observe only counts steps

    def __init__(
        self, algorithm: RandomPolicy, info: EnvInfo, config: RandomConfig, *, seed: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed)
        self.name = "random"
        self.rollout_len = config.rollout_len
        self.n = info.num_envs

    def policy(self) -> Uniform:
        return make_policy(self)

    def observe(self, transition: Transition) -> None:
        self.env_steps += len(transition.terminated)

    def learn(self) -> dict[str, float]:
        return {}


def make_algorithm(backend: Backend, info: EnvInfo, config: RandomConfig) -> RandomPolicy:
    """No networks: the algorithm of the random agent."""
    return RandomPolicy(backend)


def make_policy(parts: ActingParts) -> Uniform:
    """Uniform actions for ``parts.env_info``'s envs from ``parts.rng`` (an agent, or a farm
    actor's :class:`~harness.policy.Acting`)."""
    return Uniform(parts.env_info, lambda: parts.rng)


def make_agent(
    info: EnvInfo, backend: Backend, config: RandomConfig, *, seed: int = 0, total_steps: int = 1
) -> RandomAgent:
    return RandomAgent(RandomPolicy(backend), info, config, seed=seed)
