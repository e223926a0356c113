"""QMIX and MAPPO (plugins/harness_algos/qmix.py, mappo.py) through the real runner and the
pettingzoo env plugin: learning checks on mpe2's simple_spread (discrete actions) against the
uniform-random policy measured in the same test, a short MAPPO run over the actor farm, and
unit checks of what a learning check would only catch indirectly (the mixer's monotonicity,
the numpy acting copy of the fused GRU, the stored states, TD(lambda) targets, QMIX's
checkpoint, MAPPO's ValueNorm).

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
from harness.errors import CheckpointError, IncompatibleError
from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend
from harness.runtime import evaluate, load_agent

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


# PyMARL's recurrent agent: 85-100 s a run on 2 shared CPU cores, so every seed is slow. The
# fused GRU (one nn.GRU call per sequence batch) replaced a step-by-step cell (85 s, -53.7 on
# seed 1 then; -56.6 now), but on a CPU torch's GRU is itself a loop of small matmuls and the
# updates' time fell only by 0-25% (tools/bench_rnn.py); measured -55.3 / -56.5 / -59.9 with
# the cell (competitions/mpe_spread/qmix.toml)
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

    small = {"batch_size": 4, "buffer_size": 16, "learning_starts": 4, "seq_len": 4}
    config = QMIXConfig(**{**small, **overrides})
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


@pytest.fixture(scope="module", params=["torch", "paddle"])
def any_backend(request: pytest.FixtureRequest) -> Any:
    pytest.importorskip(request.param)
    return cpu_backend(collect_registry(make_plugin_manager()), request.param)


def test_qmix_acting_copy_matches_the_fused_training_unroll(any_backend: Any) -> None:
    """The agent network as QMIX acts with it (numpy, one time step at a time through the
    recurrent layer's copy) and as it trains it (one fused GRU call over the sequence) give
    the same Q-values, from a non-zero initial state and with non-zero biases (a bias in the
    wrong gate would show)."""
    bk = any_backend
    algo = _qmix(bk, recurrent=True, last_action=True, hidden=16).algorithm
    net = algo.online["agent"]
    rng = np.random.default_rng(0)
    weights = bk.get_weights(net)
    bk.set_weights(
        net, {k: rng.normal(0, 0.3, v.shape).astype(np.float32) for k, v in weights.items()}
    )
    algo.refresh_policy()
    steps, rows = 6, 5
    inputs = rng.standard_normal((steps, rows, algo.in_dim)).astype(np.float32)
    initial = rng.normal(0, 0.5, (rows, 16)).astype(np.float32)
    with bk.no_grad():
        x = bk.tensor(inputs.reshape(steps * rows, -1))
        fused = bk.numpy(algo._unroll(net, x, steps, rows, bk.tensor(initial)))
    hidden = initial
    for t in range(steps):
        q, hidden = algo.q_values(inputs[t], hidden)
        np.testing.assert_allclose(q, fused[t], rtol=1e-4, atol=1e-4)
    assert np.abs(fused).max() > 0.1


def _act(agent: Any, steps: int, rng: np.random.Generator, every: int = 0) -> list[Any]:
    """``steps`` vector steps of random observations and rewards through ``agent`` (episodes
    end every ``every`` steps in env 0; never when 0); returns the sample() extras."""
    info, n = agent.env_info, agent.env_info.num_envs
    extras_seen = []

    def obs() -> dict[str, np.ndarray]:
        return {a: rng.standard_normal((n, info.observations[a].shape[0])) for a in info.agents}

    current = obs()
    for step in range(steps):
        actions, extras = agent.sample(current)
        extras_seen.append(extras)
        rewards = {a: rng.standard_normal(n) for a in info.agents}
        nxt = obs()
        done = np.zeros(n, bool)
        done[0] = every > 0 and step % every == every - 1
        agent.observe(Transition(current, actions, rewards, nxt, done, done & False, extras))
        agent.episodes_ended(done)
        agent.learn()
        current = nxt
    return extras_seen


def test_recurrent_qmix_replays_a_continued_piece_from_the_state_it_acted_from(
    torch_backend: Any,
) -> None:
    """An 8-step stretch of one episode is stored as two 4-step sequences; the second keeps
    the GRU state the agent acted from at its first step (R2D2's stored state), and the
    training unroll from it reproduces the Q-values acting computed, which a zero start
    does not."""
    agent = _qmix(torch_backend, recurrent=True, last_action=True, learning_starts=100)
    extras = _act(agent, 8, np.random.default_rng(1))
    replay, algo = agent.replay, agent.algorithm
    assert replay.size == 4  # two envs x two pieces, in the order env 0, env 1, env 0, env 1
    np.testing.assert_array_equal(replay.initial_state[:2], 0.0)  # episode starts
    acted = np.stack([e["rnn_state"][0] for e in extras])  # env 0's state before each step
    assert np.abs(acted[4]).max() > 0.05
    np.testing.assert_array_equal(replay.initial_state[2], acted[4])
    batch = agent.batch(np.array([2]))
    steps, rows = 5, algo.layout.num_agents
    inputs = torch_backend.tensor(batch["inputs"].reshape(steps * rows, -1))
    stored = torch_backend.tensor(batch["initial_state"].reshape(rows, -1))
    with torch_backend.no_grad():
        replayed = torch_backend.numpy(
            algo._unroll(algo.online["agent"], inputs, steps, rows, stored)
        )
        zero = torch_backend.numpy(
            algo._unroll(algo.online["agent"], inputs, steps, rows, stored * 0)
        )
    for t in range(4):
        q, _ = algo.q_values(batch["inputs"][t, 0], acted[4 + t])
        np.testing.assert_allclose(replayed[t], q, rtol=1e-4, atol=1e-5)
    assert not np.allclose(zero[0], replayed[0], atol=1e-3)


def test_qmix_resumes_a_data_state_saved_before_stored_states(torch_backend: Any) -> None:
    """Replay data written before sequences kept their initial states loads, the missing
    states as zeros (the zero start training used then); the rest is restored."""
    agent = _qmix(torch_backend, recurrent=True, learning_starts=100)
    _act(agent, 8, np.random.default_rng(2))
    state = agent.data_state()
    assert np.abs(state["replay/initial_state"]).max() > 0
    old = {k: v for k, v in state.items() if not k.endswith("/initial_state")}
    restored = _qmix(torch_backend, recurrent=True, learning_starts=100)
    restored.load_data_state(old)
    assert restored.replay.size == agent.replay.size
    np.testing.assert_array_equal(restored.replay.obs, agent.replay.obs)
    np.testing.assert_array_equal(restored.replay.initial_state, 0.0)
    np.testing.assert_array_equal(restored.cur["initial_state"], 0.0)


def test_qmix_refuses_a_checkpoint_of_another_memory_layer(
    tmp_path: Path, torch_backend: Any
) -> None:
    """A feed-forward checkpoint into a recurrent config, the reverse, and a recurrent one
    of the step-by-step GRU cell QMIX had before the fused op: refused, naming both sides."""
    _qmix(torch_backend).save(tmp_path / "ff")
    gru = _qmix(torch_backend, recurrent=True)
    gru.save(tmp_path / "gru")
    with pytest.raises(
        CheckpointError, match=r"has a GRU .* but algo.recurrent = false builds a feed"
    ):
        _qmix(torch_backend).restore(tmp_path / "gru")
    with pytest.raises(
        CheckpointError, match=r"has a feed-forward .* algo.recurrent = true builds a GRU"
    ):
        _qmix(torch_backend, recurrent=True).restore(tmp_path / "ff")
    state = gru.algorithm.state()
    names = {"weight_ih_l0": "ih.weight", "bias_ih_l0": "ih.bias", "weight_hh_l0": "hh.weight"}
    old = {}
    for key, value in state["online"].items():
        for new, before in names.items():
            key = key.replace(f"memory.rnn.{new}", f"memory.{before}")
        old[key] = value
    with pytest.raises(CheckpointError, match="step-by-step GRU cell"):
        _qmix(torch_backend, recurrent=True).algorithm.load_state({**state, "online": old})


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
        actions, extras = agent.sample(current)
        rewards = {a: rng.standard_normal(2) for a in info.agents}
        nxt = obs()
        done = np.array([step % 6 == 5, False])
        agent.observe(Transition(current, actions, rewards, nxt, done, done & False, extras))
        agent.learn()
        current = nxt
    assert agent.updates > 0
    agent.save(tmp_path / "ckpt")
    restored = _qmix(torch_backend, seed=9, recurrent=True, last_action=True, learning_rate=1e-2)
    restored.restore(tmp_path / "ckpt")
    probes = [obs() for _ in range(6)]
    fresh = _qmix(torch_backend, seed=9, recurrent=True, last_action=True)
    differs = False
    # greedy acting as an evaluation does: each policy's state rows, reset at the start
    policies = [a.policy() for a in (agent, restored, fresh)]
    states = [p.reset(p.initial_state(2), np.ones(2, bool), explore=False) for p in policies]
    for probe in probes:
        acted = []
        for k, policy in enumerate(policies):
            actions, _, states[k] = policy.act(probe, states[k], explore=False)
            acted.append(actions)
        mine, theirs, untrained = acted
        for a in info.agents:
            np.testing.assert_array_equal(mine[a], theirs[a])
            differs |= bool((mine[a] != untrained[a]).any())
        assert states[0].keys() == {"hidden", "last"}
        for key, value in states[0].items():
            np.testing.assert_allclose(states[1][key], value, rtol=1e-6)
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
