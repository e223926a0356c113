"""The chain task as a gymnasium env, and its vector env.

States 0..length-1, one-hot observations, two actions (0 = left, 1 = right). Each move slips
the other way with probability ``slip``. Reaching the last state pays 1 and ends the episode;
the time limit truncates it. A random policy rarely gets there in time; "always right" nearly
always does.

The step that ends an episode reports ``info["episode_metrics"]``, a dict of floats the runner
logs as ``charts/NAME`` (window means) and ``eval/NAME``: ``reached_end`` (1.0 or 0.0) and
``distance`` (states left to the end). The env keeps its own time limit rather than gymnasium's
``TimeLimit`` wrapper so that it knows when an episode is truncated and can report them then too.

The env is deliberately not put in gymnasium's global registry: the ``gymnasium`` env family
accepts every id registered there, and harness would then find two plugins for one id.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from harness_example.plugin import ChainConfig


class ChainEnv(gym.Env[np.ndarray, np.int64]):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, length: int = 10, slip: float = 0.1, max_steps: int = 25) -> None:
        self.length = length
        self.slip = slip
        self.max_steps = max_steps
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.position = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        # harness resets the vector env with the run's seed (gymnasium gives env i seed + i):
        # every random draw must come from self.np_random, which this seeds
        super().reset(seed=seed)
        self.position = 0
        self.steps = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        move = 1 if int(action) == 1 else -1
        if self.np_random.random() < self.slip:
            move = -move
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.steps += 1
        terminated = self.position == self.length - 1
        truncated = not terminated and self.steps >= self.max_steps
        info: dict[str, Any] = {}
        if terminated or truncated:
            # floats only: the runner averages them over episodes (and over farm actors)
            distance = float(self.length - 1 - self.position)
            info["episode_metrics"] = {"reached_end": float(terminated), "distance": distance}
        return self._obs(), float(terminated), terminated, truncated, info


def make_one(config: ChainConfig) -> gym.Env[np.ndarray, np.int64]:
    return ChainEnv(config.length, config.slip, config.max_steps)


def make_vector_env(
    config: ChainConfig, *, num_envs: int, seed: int | None, vector: str
) -> gym.vector.VectorEnv[Any, Any, Any]:
    """SAME_STEP autoreset: what harness's runner expects (see harness.testing.check_env)."""
    fns = [partial(make_one, config) for _ in range(num_envs)]
    vector_cls = SyncVectorEnv if vector == "sync" else AsyncVectorEnv
    envs = vector_cls(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    if seed is not None:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs
