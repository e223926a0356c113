"""R2D2 (plugins/harness_algos/r2d2.py): recurrent DQN on replayed sequences.

Learning check: CartPole-v1 with the velocities hidden (``env.obs_keep = [0, 2]``, position
and angle only), where a policy needs memory. R2D2 (competitions/cartpole/r2d2.toml, an LSTM
of 64 units) must reach a fresh greedy mean >= 300 over 20 evaluation episodes of the checkpoint of
its best periodic evaluation (``run.keep_best``: R2D2, like DQN, can degrade after its peak;
measured on an Intel Xeon, seed 1: periodic evaluations 423 at 15k steps, 284 at 40k, whose
final checkpoint scored 288.8 fresh); its feed-forward twin, ``dqn`` with the tuned CartPole
settings
(competitions/cartpole/dqn.toml, which solves the fully observed task in this budget, at a
comparable replay ratio: ~32 sampled steps per env step, R2D2 ~30), must stay below 150 on the
same task and budget. The same check proves the trained policy uses its memory: evaluated with
its state reset before every step, it must fall below 150. Stated margin: R2D2 >= 300 where
DQN < 150. Measured at 50k steps (R2D2 stops at its first periodic evaluation >= 475, 20-30k
steps), seeds 1 / 2 / 3: R2D2 fresh 494.6 / 485.1 / 494.9 (state reset every step: 25.9 /
21.0 / 30.4), DQN 41.2 / 40.4 / 39.7 (no periodic evaluation above 50).

CI runs seed 1 with DQN on 20k steps, as it must fail anyway (measured: R2D2 500.0, reset
22.4, DQN 43.9; ~45 s on 2 cores); seeds 1-3 with both at 50k are marked slow (~75 s each).

A 2-actor farm run (learning rate 0, so the weights stay those the actors acted with) checks
that every stored sequence replays exactly as acted: its stored state is the actor's state at
its first step, and the fused unroll of the sequence from it gives the Q-values the actor's
numpy copy computed at every step, across chunk boundaries.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import Policy, State
from harness.pytest_plugin import cpu_backend
from harness.runtime import evaluate, load_agent
from harness_algos.r2d2 import R2D2Agent, R2D2Config, make_agent
from harness_algos.sequence_replay import n_step_targets, rescale, unrescale

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "competitions" / "cartpole"
MASKED = "env.obs_keep=[0, 2]"
EPISODES = 20
R2D2_FLOOR = 300.0
DQN_CEILING = 150.0
BUDGET = 50_000


def _config(algo: str, seed: int, steps: int, out: Path, *extra: str) -> tuple[Any, Any, Any]:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        f"seed={seed}",
        f"total_steps={steps}",
        f"out='{out}'",
        "trackers=['csv']",
        "checkpoint_every=0",
        MASKED,
        *extra,
    ]
    user = [CARTPOLE / f"{algo}.toml"]
    config = resolve(layer(find_pack_file(CARTPOLE), user, overrides, environ={}), registry)
    assert config.run.algo == algo and config.env.obs_keep == [0, 2]
    return pm, registry, config


def _train(algo: str, seed: int, steps: int, out: Path, *extra: str) -> tuple[Any, Any, Any]:
    """Train with ``run.keep_best``, then load the checkpoint of the run's best periodic
    evaluation as ``harness eval RUN_DIR/best`` does (the final one where none was kept)."""
    from harness.runtime import train

    pm, registry, config = _config(algo, seed, steps, out, "keep_best=true", *extra)
    result = train(config, registry, pm)
    best = result.run_dir / "best"
    chosen = best if best.is_dir() else result.run_dir
    return config, registry, load_agent(config, registry, latest_checkpoint(chosen))


class Forgetful(Policy):
    """``agent``'s greedy policy acting from its initial (zero) recurrent state at every
    step: the state the evaluation loop keeps is never used."""

    def __init__(self, agent: Any) -> None:
        self.policy = agent.policy()

    def act(
        self, obs: Any, state: State, rng: Any = None, *, explore: bool
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        fresh = self.policy.initial_state(len(obs))
        actions, _, _ = self.policy.act(obs, fresh, explore=False)
        return actions, {}, {}


def check_memory_learned(seed: int, r2d2_steps: int, dqn_steps: int, out: Path) -> None:
    config, registry, agent = _train("r2d2", seed, r2d2_steps, out / "r2d2")
    learned = evaluate(agent, config, registry, EPISODES, seed=777_000 + seed).mean
    memoryless = Forgetful(agent)
    forgetful = evaluate(memoryless, config, registry, EPISODES, seed=777_000 + seed).mean
    config, registry, dqn = _train("dqn", seed, dqn_steps, out / "dqn", "stop_at_return=1e9")
    feed_forward = evaluate(dqn, config, registry, EPISODES, seed=777_000 + seed).mean
    print(
        f"seed {seed}: r2d2 {learned:.1f} (state reset every step: {forgetful:.1f}), "
        f"dqn {feed_forward:.1f}"
    )
    assert learned >= R2D2_FLOOR, f"r2d2 seed {seed}: {learned:.1f} < {R2D2_FLOOR}"
    assert forgetful < DQN_CEILING, (
        f"r2d2 seed {seed} scores {forgetful:.1f} without its memory: masked CartPole should "
        f"need it (< {DQN_CEILING})"
    )
    assert feed_forward < DQN_CEILING, f"dqn seed {seed}: {feed_forward:.1f} >= {DQN_CEILING}"


def test_r2d2_learns_masked_cartpole_where_dqn_cannot(tmp_path: Path) -> None:
    check_memory_learned(1, 40_000, 20_000, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_r2d2_learns_masked_cartpole_where_dqn_cannot_at_the_same_budget(
    seed: int, tmp_path: Path
) -> None:
    check_memory_learned(seed, BUDGET, BUDGET, tmp_path)


# -- the farm ------------------------------------------------------------------------------


def test_r2d2_over_the_farm_replays_sequences_as_the_actors_acted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two actor processes (two envs each) act with the initial weights (learning rate 0:
    the learner updates, the weights stay) and keep their envs' states across chunks; the
    learner stores each sequence with the state its first step was acted from."""
    from harness.runtime import train

    seen: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = []
    observe = R2D2Agent.observe

    def recording(self: R2D2Agent, t: Transition) -> None:
        done = np.asarray(t.terminated) | np.asarray(t.truncated)
        seen.append((self, np.array(t.obs), np.array(t.extras["rnn_state"]), done))
        observe(self, t)

    monkeypatch.setattr(R2D2Agent, "observe", recording)
    extra = ("actors=2", "num_envs=4", "eval_episodes=2", "algo.learning_rate=0.0")
    pm, registry, config = _config("r2d2", 1, 3_000, tmp_path, *extra, "algo.learning_starts=500")
    result = train(config, registry, pm)
    with (result.run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    farm = [r for r in rows if r.get("farm/actors")]
    assert farm and float(farm[-1]["farm/actors"]) == 2.0
    losses = [float(r["losses/td_loss"]) for r in rows if r.get("losses/td_loss")]
    agent = seen[0][0]
    assert losses and np.all(np.isfinite(losses)) and agent.updates >= 100
    obs = np.stack([s[1] for s in seen])  # (T, envs, 2)
    states = np.stack([s[2] for s in seen])  # (T, envs, S)
    done = np.stack([s[3] for s in seen])
    algo = agent.algorithm
    # every actor stepped its states with the learner's weights, across chunks, and zeroed
    # them after an episode ended
    for t in range(len(obs) - 1):
        _, after = algo.q_step(obs[t], states[t])
        expected = np.where(done[t][:, None], 0.0, after)
        np.testing.assert_allclose(states[t + 1], expected, atol=1e-6, err_msg=f"step {t}")
    # every stored sequence starts from the state its first step was acted from, and its
    # fused unroll gives the actor's Q-values at each of its steps
    where = {
        (obs[t, e].tobytes(), states[t, e].tobytes()): (t, e) for t, e in np.ndindex(*done.shape)
    }
    replay = agent.replay
    assert replay.size > 50
    # sequences longer than a chunk (16 steps) that continue an episode from a stored state
    continuing = (replay.train_from[: replay.size] > 0) & (replay.length[: replay.size] == 20)
    assert continuing.sum() > 5
    assert (np.abs(replay.state[: replay.size][continuing]).sum(1) > 0).all()
    first = [
        where[(replay.obs[k, 0].tobytes(), replay.state[k].tobytes())] for k in range(replay.size)
    ]
    batch = replay.batch(np.arange(replay.size))
    bk = agent.backend
    replayed = bk.numpy(
        algo.unroll(algo.online, bk.tensor(batch["obs"]), bk.tensor(batch["state"]))
    )
    for k, (t0, e) in enumerate(first):
        length = int(replay.length[k])
        acted, _ = algo.q_step(obs[t0 : t0 + length, e], states[t0 : t0 + length, e])
        np.testing.assert_allclose(replayed[:length, k], acted, atol=1e-5, err_msg=f"seq {k}")
        np.testing.assert_array_equal(replay.obs[k, :length], obs[t0 : t0 + length, e])


# -- unit checks ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    return cpu_backend(collect_registry(make_plugin_manager()), "torch")


def _info(num_envs: int = 2) -> EnvInfo:
    return EnvInfo(
        "test",
        SpaceInfo("box", (3,), "float32"),
        SpaceInfo("discrete", (), "int64", n=2),
        num_envs=num_envs,
    )


def _agent(backend: Any, seed: int = 0, **overrides: Any) -> R2D2Agent:
    options: dict[str, Any] = {
        "seq_len": 6,
        "burn_in": 2,
        "overlap": 3,
        "batch_size": 4,
        "buffer_size": 64,
        "learning_starts": 0,
        "rnn_hidden": 8,
        "hidden": [8],
        "head_hidden": [8],
    }
    return make_agent(_info(), backend, R2D2Config(**(options | overrides)), seed=seed)


class Episodes:
    """Two envs with episodes of fixed lengths (a step's observation is (episode, t, env +
    1), never all zeros) that end terminated (even episodes) or truncated (odd ones), stepped
    as a run's stepper does: through the agent's policy, keeping its state rows (``state``,
    None: the policy's initial state) and resetting those of ended episodes."""

    def __init__(self, lengths: tuple[int, int]) -> None:
        self.lengths = lengths
        self.t = np.zeros(2, np.int64)
        self.episode = np.zeros(2, np.int64)
        self.state: dict[str, np.ndarray] | None = None

    def obs(self) -> np.ndarray:
        return np.stack([self.episode, self.t, [1, 2]], 1).astype(np.float32)

    def step(self, agent: R2D2Agent) -> Transition:
        obs = self.obs()
        policy = agent.policy()
        state = policy.initial_state(2) if self.state is None else self.state
        actions, extras, self.state = policy.act(obs, state, explore=True)
        self.t += 1
        ended = self.t == self.lengths
        final = self.obs()
        terminated = ended & (self.episode % 2 == 0)
        self.t[ended] = 0
        self.episode[ended] += 1
        self.state = policy.reset(self.state, ended, explore=True)
        return Transition(
            obs, actions, self.t * 0 + 1.0, final, terminated, ended & ~terminated, extras
        )


def test_sequences_overlap_and_never_cross_an_episode_end(torch_backend: Any) -> None:
    agent = _agent(torch_backend)
    env = Episodes((11, 4))
    acted = []
    for _ in range(22):
        transition = env.step(agent)
        acted.append((transition.obs, transition.extras["rnn_state"]))
        agent.observe(transition)
    replay = agent.replay
    found = []
    for k in range(replay.size):
        length = int(replay.length[k])
        episode, t0, e = (int(v) for v in replay.obs[k, 0] - [0, 0, 1])
        found.append((e, episode, t0, length, int(replay.train_from[k]), replay.terminated[k]))
        assert np.all(replay.obs[k, :length, 1] == np.arange(t0, t0 + length))
        assert np.all(replay.obs[k, length + 1 :] == 0) and np.all(replay.rewards[k, length:] == 0)
        assert replay.obs[k, length, 1] == t0 + length  # the observation after the last step
        step = next(i for i, (o, _) in enumerate(acted) if o[e, 0] == episode and o[e, 1] == t0)
        np.testing.assert_array_equal(replay.state[k], acted[step][1][e])
    # env 0 (episodes of 11): steps 0-5, then 3-8 (3 carried over, burn-in 2), then 6-10 (to
    # the terminal step); env 1 (episodes of 4) stores whole episodes
    assert sorted(found) == sorted(
        [
            (0, 0, 0, 6, 0, 0.0),
            (0, 0, 3, 6, 2, 0.0),
            (0, 0, 6, 5, 2, 1.0),
            (0, 1, 0, 6, 0, 0.0),
            (0, 1, 3, 6, 2, 0.0),
            (0, 1, 6, 5, 2, 0.0),
        ]
        + [(1, ep, 0, 4, 0, float(ep % 2 == 0)) for ep in range(5)]
    )
    assert (replay.state[[i for i, f in enumerate(found) if f[2] == 0]] == 0).all()


@pytest.mark.parametrize("sign", ["observation", "state", "both"])
def test_a_reset_env_cuts_its_sequence(torch_backend: Any, sign: str) -> None:
    """A replaced actor's or a resumed run's env starts a new episode without an end flag,
    seen by its observation (not where the last step led), its acting state (zeros) or both:
    the sequence so far is stored, cut (bootstrapping from its last real observation), and a
    new one starts an episode."""
    agent = _agent(torch_backend)
    env = Episodes((50, 50))
    for _ in range(4):
        agent.observe(env.step(agent))
    if sign != "state":
        env.t[:] = 0
        env.episode[:] = 7
    if sign != "observation":
        env.state = None  # (zeros: a fresh stepper's initial state)
    agent.observe(env.step(agent))
    replay = agent.replay
    assert replay.size == 2
    np.testing.assert_array_equal(replay.length[:2], [4, 4])
    np.testing.assert_array_equal(replay.terminated[:2], [0, 0])
    np.testing.assert_array_equal(replay.obs[:2, 4, 1], [4, 4])  # the last real next obs
    assert agent.assembler.starts_episode.all() and (agent.assembler.length == 1).all()


def test_n_step_targets_match_a_direct_sum() -> None:
    rng = np.random.default_rng(0)
    steps, width, n, gamma = 7, 5, 3, 0.9
    rewards = rng.standard_normal((steps, width)).astype(np.float32)
    lengths = np.array([7, 4, 1, 7, 5])
    terminated = np.array([1.0, 0.0, 1.0, 0.0, 1.0], np.float32)
    rewards[np.arange(steps)[:, None] >= lengths[None]] = 0.0
    values = rng.standard_normal((steps + 1, width)).astype(np.float32) * 10
    got = n_step_targets(rewards, lengths, terminated, values, gamma, n)
    for b in range(width):
        for t in range(lengths[b]):
            m = min(n, lengths[b] - t)
            want = sum(gamma**k * float(rewards[t + k, b]) for k in range(m))
            if not (t + m == lengths[b] and terminated[b]):
                want += gamma**m * float(values[t + m, b])
            assert got[t, b] == pytest.approx(want, rel=1e-5, abs=1e-5)
    rescaled = n_step_targets(rewards, lengths, terminated, values, gamma, n, True)
    wide = values.astype(np.float64) * 100
    np.testing.assert_allclose(unrescale(rescale(wide)), wide, rtol=1e-9, atol=1e-9)
    assert np.all(np.isfinite(rescaled))


def test_a_restored_agent_continues_the_sequences_it_was_writing(
    torch_backend: Any, tmp_path: Path
) -> None:
    a = _agent(torch_backend, seed=1)
    env = Episodes((9, 5))
    for _ in range(12):
        a.observe(env.step(a))
        a.learn()
    a.save(tmp_path / "ck")
    state = (env.t.copy(), env.episode.copy(), env.state)  # (acting state: the stepper's)
    for _ in range(8):
        a.observe(env.step(a))
        a.learn()
    b = _agent(torch_backend, seed=5)
    b.restore(tmp_path / "ck")
    env.t, env.episode, env.state = state
    for _ in range(8):
        b.observe(env.step(b))
        b.learn()
    for name in ("obs", "actions", "state", "length", "train_from"):
        np.testing.assert_array_equal(getattr(b.replay, name), getattr(a.replay, name))
    np.testing.assert_array_equal(b.replay.tree.leaves(), a.replay.tree.leaves())


@pytest.mark.parametrize("change", [{"recurrent": "gru"}, {"rnn_hidden": 16}])
def test_a_checkpoint_refuses_another_recurrent_layer(
    torch_backend: Any, tmp_path: Path, change: dict[str, Any]
) -> None:
    _agent(torch_backend).save(tmp_path / "ck")
    other = _agent(torch_backend, **change)
    with pytest.raises(ConfigError) as err:
        other.restore(tmp_path / "ck")
    message = str(err.value)
    assert 'algo.recurrent = "lstm", algo.rnn_hidden = 8' in message
    kind, hidden = change.get("recurrent", "lstm"), change.get("rnn_hidden", 8)
    assert f'algo.recurrent = "{kind}", algo.rnn_hidden = {hidden}' in message


def test_bad_sequence_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="burn_in <= overlap < seq_len"):
        R2D2Config(burn_in=8, overlap=4)
    with pytest.raises(ValueError, match="recurrent = 'none'"):
        R2D2Config(recurrent="none")


def test_images_and_box_actions_are_refused(torch_backend: Any) -> None:
    from harness.errors import IncompatibleError

    frames = EnvInfo(
        "frames",
        SpaceInfo("box", (4, 84, 84), "uint8"),
        SpaceInfo("discrete", (), "int64", n=4),
        num_envs=1,
    )
    with pytest.raises(IncompatibleError, match=r"images of shape \(4, 84, 84\)"):
        make_agent(frames, torch_backend, R2D2Config())
    box = EnvInfo(
        "box", SpaceInfo("box", (3,), "float32"), SpaceInfo("box", (1,), "float32"), num_envs=1
    )
    with pytest.raises(IncompatibleError, match="box actions"):
        make_agent(box, torch_backend, R2D2Config())
