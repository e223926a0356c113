"""Small real Minari datasets for testing offline algorithms against any :class:`EnvInfo`
(``harness.testing.check_algorithm`` of an offline algorithm needs a dataset whose spaces fit
the env it is checked on). Written with Minari's own ``create_dataset_from_buffers``."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import EnvInfo, SpaceInfo
from harness_offline.datasets import import_minari, minari_root


def gym_space(space: SpaceInfo) -> Any:
    """The gymnasium space a :class:`SpaceInfo` describes."""
    from gymnasium import spaces

    if space.kind == "discrete":
        return spaces.Discrete(space.n)
    low = np.asarray(space.low, np.float64).reshape(space.shape)
    high = np.asarray(space.high, np.float64).reshape(space.shape)
    dtype = np.dtype(space.dtype)
    return spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype)


def _draw(space: Any, rows: int, rng: np.random.Generator) -> np.ndarray:
    if hasattr(space, "n"):
        return rng.integers(space.n, size=rows)
    low = np.maximum(space.low, -10.0)  # (CartPole's +-3.4e38 "bounds")
    high = np.minimum(space.high, 10.0)
    return rng.uniform(low, high, (rows, *space.shape)).astype(space.dtype)


def random_dataset(
    directory: Path, info: EnvInfo, *, episodes: int = 4, length: int = 50, seed: int = 0
) -> Path:
    """A Minari dataset at ``directory`` (named NAME-vN) of uniformly random observations,
    actions and rewards in ``info``'s spaces; the last step of every other episode is a
    termination, the others are truncated."""
    from minari.data_collector import EpisodeBuffer

    minari = import_minari()
    obs_space, act_space = gym_space(info.observation), gym_space(info.action)
    rng = np.random.default_rng(seed)
    buffers = []
    for i in range(episodes):
        terminal = np.zeros(length, bool)
        terminal[-1] = i % 2 == 0
        buffers.append(
            EpisodeBuffer(
                id=i,
                seed=seed + i,
                observations=_draw(obs_space, length + 1, rng),
                actions=_draw(act_space, length, rng),
                rewards=rng.standard_normal(length).tolist(),
                terminations=terminal.tolist(),
                truncations=(~terminal & (np.arange(length) == length - 1)).tolist(),
            )
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    with minari_root(directory.parent.absolute()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        minari.create_dataset_from_buffers(
            directory.name,
            buffers,
            observation_space=obs_space,
            action_space=act_space,
            algorithm_name="random",
            description="random transitions for a conformance check",
            data_format="hdf5",
        )
    return directory
