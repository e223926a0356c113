"""``harness/Delay-v0``: an env whose step takes a fixed wall-clock time.

It stands in for an expensive simulator (OpenSim steps take 10-100 ms) when measuring how much
of the ideal throughput a distributed run delivers: with ``step_seconds=0.02`` one env gives at
most 50 steps/s, so N actors give at most 50 N. Observations are random normals, reward 1 per
step, episodes last ``episode_steps`` steps (truncated). Sleeping costs no CPU, so hundreds of
actors fit on two cores.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


class DelayEnv(gym.Env[np.ndarray, np.int64]):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium declares it so

    def __init__(self, step_seconds: float = 0.02, episode_steps: int = 200) -> None:
        if step_seconds < 0 or episode_steps < 1:
            raise ValueError("step_seconds must be >= 0 and episode_steps >= 1")
        self.step_seconds = step_seconds
        self.episode_steps = episode_steps
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.step_seconds:
            time.sleep(self.step_seconds)
        self._t += 1
        return self._obs(), 1.0, False, self._t >= self.episode_steps, {}

    def _obs(self) -> np.ndarray:
        return self.np_random.standard_normal(4, dtype=np.float32)
