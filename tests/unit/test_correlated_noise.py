"""Correlated exploration (``algo.noise_correlation``, plugins/harness_algos/noise.py).

* Each env's noise is the stationary AR(1) process it claims to be: every step N(0, 1), lag-k
  correlation ``rho ** k``, a fresh draw (independent of the last) after its episode ends; 0 is
  white noise. Measured over thousands of envs.
* A PPO agent acts with it: its sampled actions are mean + std * that noise (seen through the
  unclipped ``action`` extra), and the ``log_prob`` extras are the policy's own Gaussian
  log-densities of those actions, which the PPO ratio and V-trace take.
* Bad values are refused naming the key (the CLI's exit 2 is in test_cli_bad_input).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness_algos.noise import CorrelatedNoise

ENVS = 4000


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_each_env_draws_a_stationary_ar1_process(rho: float) -> None:
    noise = CorrelatedNoise(rho, 3, ENVS)
    rng = np.random.default_rng(0)
    steps = np.stack([noise.draw(rng, ENVS) for _ in range(12)])  # (T, envs, 3)
    assert steps.dtype == np.float32
    for t in (0, 5, 11):  # N(0, 1) at every step, the first included
        assert abs(steps[t].mean()) < 0.05
        assert steps[t].std() == pytest.approx(1.0, abs=0.05)
    assert _corr(steps[1:], steps[:-1]) == pytest.approx(rho, abs=0.02)
    assert _corr(steps[10], steps[0]) == pytest.approx(rho**10, abs=0.05)


def test_an_ended_episode_starts_a_fresh_process_and_rows_follow_their_envs() -> None:
    noise = CorrelatedNoise(0.9, 2, ENVS)
    rng = np.random.default_rng(1)
    for _ in range(5):
        before = noise.draw(rng, ENVS)
    ended = np.arange(ENVS) % 2 == 0
    noise.ended(ended)
    after = noise.draw(rng, ENVS)
    assert _corr(after[ended], before[ended]) == pytest.approx(0.0, abs=0.04)
    assert _corr(after[~ended], before[~ended]) == pytest.approx(0.9, abs=0.02)
    assert after[ended].std() == pytest.approx(1.0, abs=0.05)

    # by row (a policy server): the rows drawn move on, the others keep their last noise
    rows = np.arange(0, ENVS, 4)
    noise.rows_ended(rows[:10], ENVS)
    drawn = noise.draw_rows(rng, rows, ENVS)
    assert _corr(drawn[10:], after[rows[10:]]) == pytest.approx(0.9, abs=0.03)
    assert _corr(drawn[:10], after[rows[:10]]) < 0.9
    others = np.setdiff1d(np.arange(ENVS), rows)
    np.testing.assert_array_equal(noise.held[others], after[others])
    np.testing.assert_array_equal(noise.held[rows], drawn)


def _box_info(num_envs: int) -> EnvInfo:
    obs = SpaceInfo("box", (3,), "float32", low=(-1.0,) * 3, high=(1.0,) * 3)
    act = SpaceInfo("box", (2,), "float32", low=(-1.0,) * 2, high=(1.0,) * 2)
    return EnvInfo("box-test", obs, act, num_envs=num_envs)


def _ppo(backend: Any, info: EnvInfo, **overrides: Any) -> Any:
    spec = collect_registry(make_plugin_manager()).algorithms.get("ppo")
    config = spec.config_cls(**overrides)
    return spec.make_agent(info, backend, config, seed=0, total_steps=1000)


def test_a_ppo_agent_acts_with_it_and_logs_its_policys_log_probs(torch_backend: Any) -> None:
    envs, log_std = 2000, -1.0
    agent = _ppo(torch_backend, _box_info(envs), noise_correlation=0.8, log_std_init=log_std)
    obs = np.random.default_rng(2).uniform(-1, 1, (envs, 3)).astype(np.float32)
    mean = agent.greedy_outputs(obs)[0]
    draws = []
    for _ in range(6):
        _, extras = agent.sample(obs)
        eps = (extras["action"] - mean) / np.exp(log_std)
        density = -0.5 * eps**2 - log_std - 0.5 * np.log(2 * np.pi)
        np.testing.assert_allclose(extras["log_prob"], density.sum(-1), rtol=1e-4, atol=1e-4)
        draws.append(eps)
    steps = np.stack(draws)
    assert _corr(steps[1:], steps[:-1]) == pytest.approx(0.8, abs=0.03)
    assert steps.std() == pytest.approx(1.0, abs=0.05)
    agent.episodes_ended(np.ones(envs, bool))
    _, extras = agent.sample(obs)
    fresh = (extras["action"] - mean) / np.exp(log_std)
    assert _corr(fresh, steps[-1]) == pytest.approx(0.0, abs=0.05)


def test_bad_values_are_refused_naming_the_key(torch_backend: Any) -> None:
    with pytest.raises(ValueError, match=r"noise_correlation = 1\.0 must be in \[0, 1\)"):
        _ppo(torch_backend, _box_info(2), noise_correlation=1.0)
    discrete = EnvInfo(
        "discrete-test",
        SpaceInfo("box", (3,), "float32", low=(-1.0,) * 3, high=(1.0,) * 3),
        SpaceInfo("discrete", (), "int64", n=2),
        num_envs=2,
    )
    with pytest.raises(ConfigError, match=r"algo\.noise_correlation = 0\.5 .* discrete actions"):
        _ppo(torch_backend, discrete, noise_correlation=0.5)
