"""QMIX and MAPPO (plugins/harness_algos/qmix.py, mappo.py) through the real runner and the
pettingzoo env plugin: learning checks on mpe2's simple_spread (discrete actions) against the
uniform-random policy measured in the same test, a short MAPPO run over the actor farm, and
unit checks of what a learning check would only catch indirectly (the mixer's monotonicity,
the numpy GRU copy acting uses, TD(lambda) targets, QMIX's checkpoint, MAPPO's ValueNorm).

The learning checks reuse test_maddpg's random baseline and its thresholds' shape: a fresh
greedy evaluation of the final checkpoint over 40 episodes must beat an absolute floor between
the random policy's and the learned policies' measured means (numbers in
competitions/mpe_spread/qmix.toml and mappo.toml, the tuned overlays these runs use), and the
random policy's mean measured here (100 episodes) by a margin."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mpe2", reason="the QMIX and MAPPO checks run on mpe2's particle environments")

from test_maddpg import EVAL_EPISODES, PACK, _info, assert_farm_trained, random_eval
from test_maddpg import _config as maddpg_config

from harness.api import Transition
from harness.checkpoint import latest_checkpoint
from harness.config import layer, resolve
from harness.errors import IncompatibleError
from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend
from harness.runtime.run import evaluate, load_agent

# algorithm -> (total env steps, absolute floor of the learned score, margin over random)
CASES: dict[str, tuple[int, float, float]] = {
    "qmix": (24_000, -65.0, 10.0),
    "mappo": (60_000, -67.0, 10.0),
}


def _config(algo: str, extra: list[str], seed: int, out: Path, steps: int) -> Any:
    """The mpe_spread pack with the algorithm's tuned overlay (competitions/mpe_spread/)."""
    return maddpg_config(extra, seed, out, steps, (PACK / f"{algo}.toml",))


def check_learns(algo: str, seed: int, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    from harness.runtime import train

    steps, floor, margin = CASES[algo]
    baseline = random_eval([], seed, tmp_path / "random").mean
    pm, registry, config = _config(algo, list(extra), seed, tmp_path / algo, steps)
    assert config.run.algo == algo
    if algo == "qmix":  # the monotonic hypernetwork mixer, not VDN's sum
        assert config.algo.mixer == "qmix"
    result = train(config, registry, pm)
    assert result.steps >= steps
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, EVAL_EPISODES, seed=777_000 + seed)
    assert len(fresh.returns) == EVAL_EPISODES
    learned = float(fresh.mean)
    print(f"{algo} seed {seed}: random {baseline:.2f}, learned {learned:.2f} after {steps} steps")
    assert learned >= floor, f"{algo} seed {seed}: learned {learned:.2f} < floor {floor}"
    assert learned >= baseline + margin, (
        f"{algo} seed {seed}: learned {learned:.2f} is not {margin} above random {baseline:.2f}"
    )


SEEDS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]


@pytest.mark.parametrize("seed", SEEDS)
def test_qmix_learns_simple_spread(seed: int, tmp_path: Path) -> None:
    check_learns("qmix", seed, tmp_path)


# PyMARL's recurrent agent: about 100 s a run on 2 CPU cores (the GRU is unrolled step by
# step), so every seed is slow; measured -55.3 / -56.5 / -59.9 (competitions/mpe_spread/qmix.toml)
RECURRENT = ("algo.recurrent=true", "algo.train_every=2", "algo.batch_size=64")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_qmix_with_gru_agents_learns_simple_spread(seed: int, tmp_path: Path) -> None:
    check_learns("qmix", seed, tmp_path, RECURRENT)


@pytest.mark.parametrize("seed", SEEDS)
def test_mappo_learns_simple_spread(seed: int, tmp_path: Path) -> None:
    check_learns("mappo", seed, tmp_path)


def test_mappo_runs_over_the_actor_farm(tmp_path: Path) -> None:
    """Two actor processes stream rollouts (both networks' inputs, log-probabilities) into
    the learner, which updates on them."""
    from harness.runtime import train

    pm, registry, config = _config(
        "mappo",
        ["actors=2", "num_envs=2", "eval_episodes=4", "algo.n_steps=50"],
        1,
        tmp_path,
        3_000,
    )
    assert_farm_trained(train(config, registry, pm), 3_000, "losses/value_loss")


def test_recurrent_qmix_runs_over_the_actor_farm(tmp_path: Path) -> None:
    """Two actor processes act with the GRU agent (a hidden state per env of their own) and
    stream whole episodes' steps into the learner's episode replay, which updates on them."""
    from harness.runtime import train

    pm, registry, config = _config(
        "qmix", ["actors=2", "num_envs=2", "eval_episodes=4", *RECURRENT], 1, tmp_path, 3_000
    )
    assert config.algo.recurrent
    assert_farm_trained(train(config, registry, pm), 3_000, "losses/td_loss")


# -- unit checks --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    return cpu_backend(collect_registry(make_plugin_manager()), "torch")


def _qmix(backend: Any, num_envs: int = 2, seed: int = 0, **overrides: Any) -> Any:
    from harness_algos.qmix import QMIXConfig, make_agent

    config = QMIXConfig(batch_size=4, buffer_size=16, learning_starts=4, seq_len=4, **overrides)
    return make_agent(_info("discrete", num_envs), backend, config, seed=seed)


def test_qmix_mixer_is_monotonic_in_every_agents_q(torch_backend: Any) -> None:
    """dQ_tot/dQ_a >= 0 everywhere (the greedy joint action is then the agents' own greedy
    actions), also after the hypernetworks' weights are scrambled (negative ones included)."""
    import torch

    algo = _qmix(torch_backend).algorithm
    mixer = algo.online["mixer"]
    gen = torch.Generator().manual_seed(0)
    for scramble in (False, True):
        if scramble:
            with torch.no_grad():
                for p in mixer.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 2)
        q = (torch.randn(256, algo.layout.num_agents, generator=gen) * 10).requires_grad_()
        state = torch.randn(256, algo.layout.state_dim, generator=gen) * 3
        (grad,) = torch.autograd.grad(algo._mix(mixer, q, state).sum(), q)
        assert (grad >= 0).all(), grad.min()
        assert (grad > 0).any()
    vdn = _qmix(torch_backend, mixer="vdn").algorithm
    q = torch.randn(16, vdn.layout.num_agents, generator=gen)
    state = torch.randn(16, vdn.layout.state_dim, generator=gen)
    torch.testing.assert_close(vdn._mix(vdn.online["mixer"], q, state), q.sum(1))


def test_qmix_value_offset_starts_q_tot_at_the_mean_reward_over_one_minus_gamma(
    torch_backend: Any,
) -> None:
    """With ``value_offset`` Q_tot = the mixer's output + the running mean team reward / (1 -
    gamma), and the mixer (small ``hypernet_gain``) starts near 0, so the first update's Q_tot
    is already at the returns' scale; without it Q_tot starts near 0."""
    for offset in (True, False):
        agent = _qmix(torch_backend, gamma=0.9, value_offset=offset)
        info = agent.env_info
        rng = np.random.default_rng(0)
        obs = {a: rng.standard_normal((2, info.observations[a].shape[0])) for a in info.agents}
        metrics: dict[str, float] = {}
        for step in range(16):
            actions, _ = agent.sample(obs)
            rewards = {a: np.full(2, -1.0) for a in info.agents}  # team reward -2 a step
            done = np.full(2, step % 4 == 3)
            agent.observe(Transition(obs, actions, rewards, obs, done & False, done, {}))
            metrics = agent.learn() or metrics
        assert metrics, "no update ran"
        expected = -2.0 / (1.0 - 0.9) if offset else 0.0
        assert abs(metrics["losses/q_tot"] - expected) < 2.0, metrics
        if offset:
            assert agent.algorithm.reward_stats[0] == pytest.approx(-2.0)


def _gru_check(backend: Any, to_tensor: Any, to_numpy: Any) -> None:
    rng = np.random.default_rng(0)
    cell = backend.gru(7, 5)
    # non-zero biases too, so a bias in the wrong gate would show
    weights = {
        k: rng.standard_normal(v.shape).astype(np.float32) * 0.5
        for k, v in backend.get_weights(cell).items()
    }
    backend.set_weights(cell, weights)
    copy = backend.inference(cell)
    h_np = h = np.zeros((3, 5), np.float32)
    for _ in range(4):
        x = rng.standard_normal((3, 7)).astype(np.float32)
        h = to_numpy(cell(to_tensor(x), to_tensor(h)))
        h_np = copy(x, h_np)
        np.testing.assert_allclose(h_np, h, rtol=1e-5, atol=1e-5)
    assert np.abs(h).max() > 0.05


def test_gru_numpy_inference_matches_torch(torch_backend: Any) -> None:
    import torch

    with torch.no_grad():
        _gru_check(torch_backend, torch.as_tensor, lambda t: t.numpy())


def test_gru_numpy_inference_matches_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    backend = cpu_backend(collect_registry(make_plugin_manager()), "paddle")
    with paddle.no_grad():
        _gru_check(backend, paddle.to_tensor, lambda t: t.numpy())


def test_lambda_returns_span_one_step_td_to_monte_carlo() -> None:
    from harness_algos.qmix import lambda_returns

    rng = np.random.default_rng(0)
    rewards = rng.standard_normal((5, 2)).astype(np.float32)
    values = rng.standard_normal((5, 2)).astype(np.float32)
    terminated = np.zeros((5, 2), np.float32)
    mask = np.ones((5, 2), np.float32)
    terminated[4, 0] = 1.0  # column 0: an episode that ends in step 5
    mask[3:, 1] = 0.0  # column 1: a 3-step piece, bootstrapping from its last value
    one_step = lambda_returns(rewards, terminated, mask, values, 0.9, 0.0)
    np.testing.assert_allclose(one_step, rewards + 0.9 * (1 - terminated) * values, rtol=1e-6)
    mc = lambda_returns(rewards, terminated, mask, values, 0.9, 1.0)
    expected0 = [sum(0.9**k * rewards[t + k, 0] for k in range(5 - t)) for t in range(5)]
    np.testing.assert_allclose(mc[:, 0], expected0, rtol=1e-5)
    expected1 = [
        sum(0.9**k * rewards[t + k, 1] for k in range(3 - t)) + 0.9 ** (3 - t) * values[2, 1]
        for t in range(3)
    ]
    np.testing.assert_allclose(mc[:3, 1], expected1, rtol=1e-5)


def test_qmix_checkpoint_round_trip_reproduces_predictions(
    tmp_path: Path, torch_backend: Any
) -> None:
    """A recurrent QMIX agent saved after some updates and restored into a fresh one (another
    seed) acts the same: same greedy actions, step by step through its hidden state."""
    agent = _qmix(torch_backend, seed=3, recurrent=True, last_action=True, learning_rate=1e-2)
    info = agent.env_info
    rng = np.random.default_rng(5)

    def obs() -> dict[str, np.ndarray]:
        return {a: rng.standard_normal((2, info.observations[a].shape[0])) for a in info.agents}

    current = obs()
    for step in range(24):
        actions, _ = agent.sample(current)
        rewards = {a: rng.standard_normal(2) for a in info.agents}
        nxt = obs()
        done = np.array([step % 6 == 5, False])
        agent.observe(Transition(current, actions, rewards, nxt, done, done & False, {}))
        agent.learn()
        current = nxt
    assert agent.updates > 0
    agent.save(tmp_path / "ckpt")
    restored = _qmix(torch_backend, seed=9, recurrent=True, last_action=True, learning_rate=1e-2)
    restored.restore(tmp_path / "ckpt")
    probes = [obs() for _ in range(6)]
    fresh = _qmix(torch_backend, seed=9, recurrent=True, last_action=True)
    differs = False
    for probe in probes:
        mine, theirs, untrained = (
            agent.predict(probe),
            restored.predict(probe),
            fresh.predict(probe),
        )
        for a in info.agents:
            np.testing.assert_array_equal(mine[a], theirs[a])
            differs |= bool((mine[a] != untrained[a]).any())
        np.testing.assert_allclose(agent.eval_hidden, restored.eval_hidden, rtol=1e-6)
    assert differs, "the probe cannot tell a trained agent from an untrained one"
    assert restored.replay.size == agent.replay.size


def test_mappo_value_norm_matches_numpy_over_concatenated_batches() -> None:
    from harness_algos.mappo import ValueNorm

    rng = np.random.default_rng(0)
    norm = ValueNorm()
    batches = [rng.normal(-100, 30, size) for size in (7, 2400, 1, 333)]
    for i, batch in enumerate(batches):
        norm.update(batch)
        seen = np.concatenate(batches[: i + 1])
        mean, var, count = norm.stats
        np.testing.assert_allclose([mean, var], [seen.mean(), seen.var()], rtol=1e-9)
        assert count == len(seen)
    probe = rng.normal(-100, 30, 50)
    z = norm.normalize(probe)
    np.testing.assert_allclose(z, (probe - seen.mean()) / seen.std(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.denormalize(z), probe, rtol=1e-4)


def test_mappo_value_norm_survives_a_checkpoint(tmp_path: Path, torch_backend: Any) -> None:
    from harness_algos.mappo import MAPPOConfig, make_agent

    info = dataclasses.replace(_info("discrete"), num_envs=2)
    agent = make_agent(info, torch_backend, MAPPOConfig(n_steps=4), seed=1)
    rng = np.random.default_rng(3)
    obs = {a: rng.standard_normal((2, info.observations[a].shape[0])) for a in info.agents}
    for _ in range(4):
        actions, extras = agent.sample(obs)
        rewards = {a: rng.normal(-5, 2, 2) for a in info.agents}
        done = np.zeros(2, bool)
        agent.observe(Transition(obs, actions, rewards, obs, done, done, extras))
    assert agent.learn()
    stats = agent.algorithm.value_norm.stats.copy()
    assert stats[2] == 4 * 2 * 2 and stats[0] < -5
    agent.save(tmp_path / "ckpt")
    restored = make_agent(info, torch_backend, MAPPOConfig(n_steps=4), seed=2)
    restored.restore(tmp_path / "ckpt")
    np.testing.assert_array_equal(restored.algorithm.value_norm.stats, stats)
    inputs = agent._inputs(obs)
    np.testing.assert_allclose(
        restored.algorithm.values(inputs), agent.algorithm.values(inputs), rtol=1e-6
    )


@pytest.mark.parametrize("algo", ["maddpg", "qmix", "mappo"])
def test_multi_agent_algorithms_refuse_a_single_agent_env(algo: str, tmp_path: Path) -> None:
    """The reverse of test_pettingzoo's single-agent check: refused at start-up, naming both
    and the algorithms that fit."""
    from harness.runtime import train

    pack = tmp_path / "pack.toml"
    pack.write_text(f'[run]\nalgo = "{algo}"\nenv = "CartPole-v1"\nout = "{tmp_path}"\n')
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    config = resolve(layer(pack, [], [], environ={}), registry)
    with pytest.raises(IncompatibleError) as err:
        train(config, registry, pm)
    message = str(err.value)
    assert f"'{algo}' is multi-agent, but 'CartPole-v1' is a single-agent env" in message
    assert "Algorithms that fit: " in message and "ppo" in message
    assert not list(tmp_path.glob("CartPole-v1__*")), "a refused run left a run directory"
