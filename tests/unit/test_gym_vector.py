"""LeanSyncVectorEnv gives exactly what gymnasium's SyncVectorEnv gives, step by step."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from harness_gymnasium.plugin import GymConfig, _gym, make_env
from harness_gymnasium.vector import LeanSyncVectorEnv

CASES = [
    ("CartPole-v1", {}),  # terminations
    ("Pendulum-v1", {"max_episode_steps": 30}),  # Box actions, truncations
    ("FrozenLake-v1", {}),  # Discrete observations, float infos ("prob")
    ("Taxi-v4", {"max_episode_steps": 40}),  # ndarray infos ("action_mask")
    ("harness/Delay-v0", {"step_seconds": 0.0, "episode_steps": 7}),
]


def _pair(env_id: str, kwargs: dict[str, Any], n: int) -> tuple[Any, Any]:
    _gym()
    fns = [functools.partial(gym.make, env_id, **kwargs)] * n
    lean = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return lean, ref


def _same_infos(a: Any, b: Any, where: str) -> None:
    if isinstance(b, dict):
        assert isinstance(a, dict) and sorted(a) == sorted(b), f"{where}: keys {a} != {b}"
        for key in b:
            _same_infos(a[key], b[key], f"{where}.{key}")
    elif isinstance(b, np.ndarray) and b.dtype == object:
        assert a.shape == b.shape, where
        for x, y in zip(a, b, strict=True):
            _same_infos(x, y, where)
    else:
        np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize(("env_id", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_lean_step_equals_sync_vector_env(env_id: str, kwargs: dict[str, Any]) -> None:
    n = 3
    lean, ref = _pair(env_id, kwargs, n)
    assert lean._lean, "the fast path should serve this env"
    obs_a, _ = lean.reset(seed=11)
    obs_b, _ = ref.reset(seed=11)
    np.testing.assert_array_equal(obs_a, obs_b)
    lean.action_space.seed(5)
    ends = 0
    kept = []
    for t in range(300):
        actions = lean.action_space.sample()
        a = lean.step(actions)
        b = ref.step(actions)
        for x, y, name in zip(
            a[:4], b[:4], ("obs", "rewards", "terminated", "truncated"), strict=True
        ):
            assert x.dtype == y.dtype and x.shape == y.shape, f"step {t} {name}"
            np.testing.assert_array_equal(x, y, err_msg=f"step {t} {name}")
        _same_infos(a[4], b[4], f"step {t} infos")
        ends += int(np.sum(a[2] | a[3]))
        kept.append((a[0], a[0].copy()))
    assert ends > 0, "the comparison never crossed an episode end"
    # every step returned fresh arrays: none was overwritten later
    for held, snapshot in kept:
        np.testing.assert_array_equal(held, snapshot)
    lean.close()
    ref.close()


def test_make_env_uses_the_lean_env_only_for_sync() -> None:
    sync = make_env("CartPole-v1", num_envs=2, seed=0, vector="sync", options=GymConfig())
    assert isinstance(sync, LeanSyncVectorEnv)
    sync.close()


def test_other_autoreset_modes_fall_back_to_the_parent_step() -> None:
    _gym()
    fns = [functools.partial(gym.make, "CartPole-v1")] * 2
    env = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    assert not env._lean
    env.reset(seed=0)
    for _ in range(50):
        obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (2, 4)
    env.close()


def test_unknown_id_and_bad_kwargs_are_config_errors() -> None:
    from harness.errors import ConfigError

    with pytest.raises(gym.error.Error):
        make_env("NoSuchEnv-v9", num_envs=1, options=GymConfig())
    with pytest.raises(ConfigError, match="do not fit"):
        make_env("CartPole-v1", num_envs=1, options=GymConfig(kwargs={"bogus": 1}))
