"""Correlated exploration (``algo.noise_correlation``, plugins/harness_algos/noise.py).

* Each env's noise (the on-policy policy's state row ``noise``) is the stationary AR(1)
  process it claims to be: every step N(0, 1), lag-k correlation ``rho ** k``, a fresh draw
  (independent of the last) after its episode ends, a row's process its own when some rows
  are acted for. Measured over thousands of envs.
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
from harness.policy import State
from harness_algos.rollout_policy import RolloutPolicy

ENVS = 4000


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def _noise_policy(rho: float, envs: int = ENVS) -> RolloutPolicy:
    """The on-policy family's policy with correlated noise on a fixed zero mean (the noise
    is what its state keeps: ``noise``, each env's last draw)."""

    class ZeroMean:
        def act(self, x: Any, rnn: Any, rng: Any, noise: Any) -> Any:
            return np.zeros((len(x), 3), np.float32), {}, None

    return RolloutPolicy(
        ZeroMean(),
        np.random.default_rng(0),
        inputs=np.asarray,
        to_env=np.asarray,
        rho=rho,
        act_dim=3,
        load=lambda weights: None,
        program=lambda: None,
    )


def _draw(policy: RolloutPolicy, state: State, rows: int = ENVS) -> tuple[np.ndarray, State]:
    _, _, state = policy.act(np.zeros((rows, 1), np.float32), state, explore=True)
    return state["noise"], state


@pytest.mark.parametrize("rho", [0.3, 0.9])  # (0: white noise, no state rows)
def test_each_env_draws_a_stationary_ar1_process(rho: float) -> None:
    policy = _noise_policy(rho)
    state, draws = policy.initial_state(ENVS), []
    for _ in range(12):
        noise, state = _draw(policy, state)
        draws.append(noise)
    steps = np.stack(draws)  # (T, envs, 3)
    assert steps.dtype == np.float32
    for t in (0, 5, 11):  # N(0, 1) at every step, the first included
        assert abs(steps[t].mean()) < 0.05
        assert steps[t].std() == pytest.approx(1.0, abs=0.05)
    assert _corr(steps[1:], steps[:-1]) == pytest.approx(rho, abs=0.02)
    assert _corr(steps[10], steps[0]) == pytest.approx(rho**10, abs=0.05)


def test_an_ended_episode_starts_a_fresh_process_and_rows_follow_their_envs() -> None:
    policy = _noise_policy(0.9)
    state = policy.initial_state(ENVS)
    for _ in range(5):
        before, state = _draw(policy, state)
    ended = np.arange(ENVS) % 2 == 0
    state = policy.reset(state, ended, explore=True)
    after, state = _draw(policy, state)
    assert _corr(after[ended], before[ended]) == pytest.approx(0.0, abs=0.04)
    assert _corr(after[~ended], before[~ended]) == pytest.approx(0.9, abs=0.02)
    assert after[ended].std() == pytest.approx(1.0, abs=0.05)

    # by row (a policy server acting for some rows): those rows' process goes on from their
    # own last noise, a reset row's starts over
    rows = np.arange(0, ENVS, 4)
    sub = {key: value[rows] for key, value in state.items()}
    sub = policy.reset(sub, np.arange(len(rows)) < 10, explore=True)
    drawn, _ = _draw(policy, sub, len(rows))
    assert _corr(drawn[10:], after[rows[10:]]) == pytest.approx(0.9, abs=0.03)
    assert _corr(drawn[:10], after[rows[:10]]) < 0.9
    greedy = policy.act(np.zeros((ENVS, 1), np.float32), state, explore=False)[2]
    np.testing.assert_array_equal(greedy["noise"], state["noise"])  # (greedy: no noise)


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
    policy = agent.policy()
    state = policy.initial_state(envs)
    mean = agent.algorithm.act(obs, None, None)[0]  # the greedy action before the clip
    draws = []
    for _ in range(6):
        _, extras, state = policy.act(obs, state, explore=True)
        eps = (extras["action"] - mean) / np.exp(log_std)
        density = -0.5 * eps**2 - log_std - 0.5 * np.log(2 * np.pi)
        np.testing.assert_allclose(extras["log_prob"], density.sum(-1), rtol=1e-4, atol=1e-4)
        draws.append(eps)
    steps = np.stack(draws)
    assert _corr(steps[1:], steps[:-1]) == pytest.approx(0.8, abs=0.03)
    assert steps.std() == pytest.approx(1.0, abs=0.05)
    state = policy.reset(state, np.ones(envs, bool), explore=True)
    _, extras, _ = policy.act(obs, state, explore=True)
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
