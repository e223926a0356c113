"""Observation and reward normalisation of the on-policy agents (``algo.normalize_obs``,
``algo.normalize_reward``; plugins/harness_algos/moments.py and onpolicy.py).

* The running moments equal numpy's mean and variance of everything merged so far.
* Reward scaling follows VecNormalize's formula, recomputed here independently.
* What acting uses is what is stored and learned from: IMPALA's importance ratios are exactly
  1 at the first update when the rollout was acted by a second agent that received the
  learner's weights and statistics the way farm actors do (``policy_weights``).
* A learning check: PPO solves a CartPole whose observations are scaled by 100 and shifted by
  50 (which it does not solve without the option: fresh mean ~130 at 100k steps, seed 1),
  serially; and plain CartPole over a 2-actor farm with both options on.
* Bad input: image observations and checkpoints trained with the other setting are refused
  with the key named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent
from harness_algos.impala import IMPALAConfig
from harness_algos.impala import make_agent as make_impala
from harness_algos.moments import RunningMoments, merge_stats
from harness_algos.ppo import PPOConfig
from harness_algos.ppo import make_agent as make_ppo

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
SCALE, SHIFT = 100.0, 50.0

CARTPOLE = EnvInfo(
    "cartpole-like",
    SpaceInfo("box", (4,), "float32", low=(-5.0,) * 4, high=(5.0,) * 4),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=3,
)


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    registry = collect_registry(make_plugin_manager())
    spec = registry.backends.get("torch")
    return spec.load(spec.config_cls(threads=1))


def test_running_moments_match_numpy() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, (n, 5)) for n in (1, 7, 64, 3)]
    moments = RunningMoments((5,))
    stats = np.array([0.0, 1.0, 0.0])
    for chunk in chunks:
        moments.update(chunk)
        stats = merge_stats(stats, chunk)
    every = np.concatenate(chunks)
    np.testing.assert_allclose(moments.mean, every.mean(0), rtol=1e-12)
    np.testing.assert_allclose(moments.var, every.var(0), rtol=1e-12)
    assert moments.count == len(every)
    np.testing.assert_allclose(stats, [every.mean(), every.var(), every.size], rtol=1e-12)
    normed = moments.normalize(every, clip=1.0)
    assert normed.dtype == np.float32 and normed.min() >= -1.0 and normed.max() <= 1.0


def test_reward_scaling_follows_vecnormalize(torch_backend: Any) -> None:
    config = PPOConfig(n_steps=50, gamma=0.9, normalize_reward=True, clip_reward=3.0)
    agent = make_ppo(CARTPOLE, torch_backend, config, seed=0)
    rng = np.random.default_rng(2)
    returns, seen = np.zeros(3), []
    obs = rng.normal(size=(3, 4)).astype(np.float32)
    for step in range(50):
        actions, extras = agent.sample(obs)
        rewards = rng.normal(5.0, 3.0, 3)
        terminated = np.array([step % 7 == 6, False, step % 11 == 10])
        agent.observe(Transition(obs, actions, rewards, obs, terminated, terminated * 0, extras))
        # VecNormalize: returns = returns * gamma + r; var over every return seen; r / std
        returns = returns * 0.9 + rewards
        seen.extend(returns)
        expected = np.clip(rewards / np.sqrt(np.var(seen) + 1e-8), -3.0, 3.0)
        np.testing.assert_allclose(agent.buffer.rewards[step], expected, rtol=1e-5)
        returns[terminated] = 0.0


def test_acting_storing_and_learning_share_the_statistics(torch_backend: Any) -> None:
    """A learner with non-trivial statistics; an 'actor' agent gets them with the weights
    (the farm's broadcast) and acts; the learner stores and learns: importance ratio 1."""
    config = IMPALAConfig(rollout_len=4, normalize_obs=True)
    learner = make_impala(CARTPOLE, torch_backend, config, seed=0, total_steps=1000)
    actor = make_impala(CARTPOLE, torch_backend, config, seed=1, total_steps=1000)
    rng = np.random.default_rng(1)
    assert learner.algorithm.obs_norm is not None
    learner.algorithm.obs_norm.update(rng.normal(40.0, 7.0, (500, 4)))
    actor.set_weights(learner.weights())
    actor_norm = actor.algorithm.obs_norm
    assert actor_norm is not None
    np.testing.assert_allclose(actor_norm.mean, learner.algorithm.obs_norm.mean, rtol=1e-6)
    obs = rng.normal(40.0, 7.0, (3, 4)).astype(np.float32)
    raw = []
    for _ in range(4):
        actions, extras = actor.sample(obs)
        raw.append(obs)
        next_obs = rng.normal(40.0, 7.0, (3, 4)).astype(np.float32)
        done = np.zeros(3, bool)
        learner.observe(Transition(obs, actions, np.ones(3), next_obs, done, done, extras))
        obs = next_obs
    assert np.abs(learner.buffer.obs).max() < 5.0  # stored standardised, not raw (~40)
    before = learner.algorithm.obs_norm.count
    metrics = learner.learn()
    assert metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["vtrace/rho_clipped"] == 0.0
    # the rollout's raw observations join the statistics after the update
    assert learner.algorithm.obs_norm.count == before + 12


def test_image_observations_are_refused(torch_backend: Any) -> None:
    frames = EnvInfo(
        "ALE/Pong-v5",
        SpaceInfo("box", (4, 84, 84), "uint8", low=(0.0,), high=(255.0,)),
        SpaceInfo("discrete", (), "int64", n=6),
        num_envs=2,
    )
    with pytest.raises(ConfigError, match="normalize_obs = false"):
        make_impala(frames, torch_backend, IMPALAConfig(normalize_obs=True), seed=0)
    with pytest.raises(ValueError, match="clip_obs"):
        PPOConfig(clip_obs=0.0)


def _make_scaled(**kwargs: Any) -> gym.Env:
    env = gym.make("CartPole-v1", **kwargs)
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    scale, shift = np.float32(SCALE), np.float32(SHIFT)
    return gym.wrappers.TransformObservation(env, lambda o: o * scale + shift, space)


def _train(overrides: list[str], out: Path) -> tuple[Any, Any, Any]:
    from harness.runtime import train

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    base = ["seed=1", f"out='{out}'", "trackers=['csv']", "progress=false"]
    config = resolve(layer(PACK, [], base + overrides, environ={}), registry)
    result = train(config, registry, pm)
    return config, registry, result


def test_ppo_learns_badly_scaled_observations(tmp_path: Path) -> None:
    if "ScaledCartPole-v1" not in gym.registry:
        gym.register("ScaledCartPole-v1", entry_point=_make_scaled, max_episode_steps=500)
    config, registry, result = _train(
        ["env='ScaledCartPole-v1'", "total_steps=100_000", "algo.normalize_obs=true"], tmp_path
    )
    checkpoint = latest_checkpoint(result.run_dir)
    agent = load_agent(config, registry, checkpoint)
    moments = agent.algorithm.obs_norm
    # the statistics came back from the checkpoint: the shift shows in the pole angle's mean
    # (a balanced pole averages ~0 rad), the scale in its spread
    assert moments is not None and moments.count > 0
    assert abs(moments.mean[2] - SHIFT) < 0.05 * SCALE, moments.mean
    assert 0.001 * SCALE < np.sqrt(moments.var[2]) < 0.2 * SCALE, moments.var
    fresh = evaluate(agent, config, registry, 20, seed=777_001)
    assert fresh.mean >= 475.0, f"fresh 20-episode mean {fresh.mean:.1f} < 475"
    # a checkpoint with statistics is refused by a config without the option, and named
    plain = resolve(
        layer(PACK, [], ["env='ScaledCartPole-v1'", f"out='{tmp_path}'"], environ={}), registry
    )
    with pytest.raises(ConfigError, match="normalize_obs = true"):
        load_agent(plain, registry, checkpoint)


@pytest.mark.distributed
def test_ppo_with_both_options_solves_cartpole_over_the_actor_farm(tmp_path: Path) -> None:
    config, registry, result = _train(
        ["actors=2", "algo.normalize_obs=true", "algo.normalize_reward=true"], tmp_path
    )
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_001)
    assert fresh.mean >= 475.0, f"fresh 20-episode mean {fresh.mean:.1f} < 475"
