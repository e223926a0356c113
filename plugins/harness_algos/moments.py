"""Running means and variances merged batch by batch (Chan et al.'s parallel update), and the
observation/reward normalisation the on-policy agents build on them (SB3's ``VecNormalize``,
CleanRL's ``NormalizeObservation``/``NormalizeReward`` wrappers, RLlib's ``MeanStdFilter``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

EPS = 1e-8


def merge_moments(
    mean: np.ndarray, var: np.ndarray, count: float, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """``mean``/``var`` (population) of ``count`` samples merged with the rows of ``x``
    (shape ``(n, *mean.shape)``): the moments of all ``count + n`` samples."""
    n = len(x)
    if not n:
        return mean, var, count
    total = count + n
    delta = x.mean(0) - mean
    m2 = var * count + x.var(0) * n + delta**2 * count * n / total
    return mean + delta * n / total, m2 / total, total


def merge_stats(stats: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Running ``[mean, variance, count]`` of scalars merged with every element of ``x``
    (QMIX's value offset, MAPPO's ValueNorm)."""
    mean, var, count = merge_moments(
        stats[0], stats[1], float(stats[2]), np.asarray(x, np.float64).ravel()
    )
    return np.array([mean, var, count])


class RunningMoments:
    """Per-feature running mean and variance of rows of shape ``shape`` (starts at mean 0,
    variance 1, count 0: the identity normalisation)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.shape = tuple(shape)
        self.mean = np.zeros(self.shape, np.float64)
        self.var = np.ones(self.shape, np.float64)
        self.count = 0.0

    def update(self, x: np.ndarray) -> None:
        rows = np.asarray(x, np.float64).reshape(-1, *self.shape)
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, rows)

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        """``(x - mean) / std`` clipped to ``[-clip, clip]``, as float32."""
        out = (np.asarray(x, np.float64) - self.mean) / np.sqrt(self.var + EPS)
        return np.clip(out, -clip, clip).astype(np.float32)

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], np.float64).reshape(self.shape).copy()
        self.var = np.asarray(state["var"], np.float64).reshape(self.shape).copy()
        self.count = float(state["count"])


@runtime_checkable
class Normalization(Protocol):
    """Observation and reward normalisation of the on-policy agents, as SB3's ``VecNormalize``
    (the RL Zoo turns it on for PPO/A2C on MuJoCo); flat observations only. These four
    ``[algo]`` keys are declared, with their docs, in each config that offers them (PPO, A2C,
    PG, IMPALA); :class:`harness_algos.onpolicy.RolloutAgent` normalises nothing for a config
    without them (MAPPO's)."""

    normalize_obs: bool
    normalize_reward: bool
    clip_obs: float
    clip_reward: float


def check_normalization(clip_obs: float, clip_reward: float) -> None:
    """Refuse clip bounds that are not positive (the first check of every config with
    :class:`Normalization` keys)."""
    if clip_obs <= 0 or clip_reward <= 0:
        raise ValueError(f"clip_obs = {clip_obs} and clip_reward = {clip_reward} must be > 0")
