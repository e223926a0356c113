"""The DeepMind Atari preprocessing (harness_gymnasium.atari) on real ALE games: observation
shape and dtype, frame stacking, reward clipping, episodic life, sticky actions, the gymnasium
plugin's [env] options, and harness.testing.check_env on an ALE id."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale-py is not installed (pip install 'harness[atari]')")

from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.testing import check_env
from harness_gymnasium.atari import _area_weights, _AreaResize, make_atari
from harness_gymnasium.plugin import GymConfig, make_env


def play(env: Any, steps: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """``steps`` seeded random steps (resetting after episode ends); each step's results."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    out = []
    for _ in range(steps):
        result = env.step(int(rng.integers(env.action_space.n)))
        out.append(result)
        if result[2] or result[3]:
            env.reset()
    return out


def test_observations_are_stacked_84x84_uint8_frames() -> None:
    env = make_atari("ALE/Breakout-v5")
    try:
        assert env.observation_space.shape == (4, 84, 84)
        assert env.observation_space.dtype == np.uint8
        obs, info = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert all(np.array_equal(obs[0], frame) for frame in obs)  # reset fills the stack
        assert info["lives"] == 5
        previous = obs
        for action in (0, 2, 3, 0, 2):
            obs, *_ = env.step(action)
            # the oldest frame drops out, the newest one is last
            np.testing.assert_array_equal(obs[:-1], previous[1:])
            previous = obs
        assert obs.max() > obs.min()  # a real picture, not a blank
    finally:
        env.close()


def test_resize_averages_areas() -> None:
    resize = _AreaResize((210, 160), (84, 84))
    image = np.random.default_rng(0).integers(0, 256, (210, 160), dtype=np.uint8)
    dense = _area_weights(210, 84).astype(np.float64) @ image @ _area_weights(160, 84).T
    assert np.abs(resize(image).astype(np.int64) - np.rint(dense)).max() <= 1
    flat = np.full((210, 160), 77, np.uint8)
    assert (resize(flat) == 77).all()


def test_rewards_are_clipped_to_their_sign() -> None:
    """Space Invaders scores 5-30 per invader: the same seeded game gives the raw scores
    without clipping and exactly their signs with it."""
    raw_env = make_atari("ALE/SpaceInvaders-v5", clip_rewards=False)
    clipped_env = make_atari("ALE/SpaceInvaders-v5")
    try:
        raw = np.array([r[1] for r in play(raw_env, 300)])
        clipped = np.array([r[1] for r in play(clipped_env, 300)])
    finally:
        raw_env.close()
        clipped_env.close()
    assert raw.max() > 1.0, "no invader was hit: the check needs a reward above 1"
    np.testing.assert_array_equal(clipped, np.sign(raw))
    assert set(np.unique(clipped)) <= {-1.0, 0.0, 1.0}


def lose_a_life(env: Any, seed: int = 0) -> tuple[bool, bool, int]:
    """Random play until the first life is lost (or the game ends); (terminated, truncated,
    lives) of that step."""
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    start = info["lives"]
    for _ in range(2000):
        _, _, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
        if info["lives"] < start or terminated or truncated:
            return terminated, truncated, info["lives"]
    raise AssertionError("no life was lost in 2000 random steps")


def test_episodic_life_ends_the_episode_but_not_the_game() -> None:
    env = make_atari("ALE/Breakout-v5")
    try:
        terminated, truncated, lives = lose_a_life(env)
        assert terminated and not truncated and lives == 4
        _, info = env.reset()  # no seed: the game goes on, with the lives left
        assert info["lives"] == 4
        _, info = env.reset(seed=1)  # a seeded reset always starts a new game
        assert info["lives"] == 5
    finally:
        env.close()
    whole = make_atari("ALE/Breakout-v5", episodic_life=False)
    try:
        terminated, truncated, lives = lose_a_life(whole)
        assert not terminated and not truncated and lives == 4
    finally:
        whole.close()


def test_sticky_actions_default_to_v5s_and_can_be_turned_off() -> None:
    for sticky, want in ((None, 0.25), (0.0, 0.0)):
        kwargs = {} if sticky is None else {"sticky_actions": sticky}
        env = make_atari("ALE/Pong-v5", **kwargs)
        try:
            ale = env.unwrapped.ale  # type: ignore[attr-defined]
            assert ale.getFloat("repeat_action_probability") == pytest.approx(want)
        finally:
            env.close()


def test_the_gymnasium_plugin_applies_it_to_ale_ids() -> None:
    envs = make_env("ALE/Pong-v5", num_envs=2, seed=0)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    finally:
        envs.close()
    raw = make_env("ALE/Pong-v5", num_envs=1, options=GymConfig(atari=False))
    try:
        assert raw.single_observation_space.shape == (210, 160, 3)
    finally:
        raw.close()
    two = make_env("ALE/Pong-v5", num_envs=1, options=GymConfig(frame_stack=2))
    try:
        assert two.single_observation_space.shape == (2, 84, 84)
    finally:
        two.close()
    with pytest.raises(ConfigError, match="frameskip"):
        make_env("ALE/Pong-v5", num_envs=1, options=GymConfig(kwargs={"frameskip": 4}))


def test_check_env_passes_on_an_ale_id_with_the_wrappers() -> None:
    registry = collect_registry(make_plugin_manager())
    spec = registry.env_for("ALE/Breakout-v5")
    assert spec.name == "gymnasium"
    check_env(spec, "ALE/Breakout-v5")  # Breakout loses a life within 200 random steps
