"""Recurrent PPO and IMPALA (``algo.recurrent``): the state travels with the experience.

- Masked-velocity CartPole (``env.obs_keep = [0, 2]``, a POMDP): recurrent PPO reaches a fresh
  20-episode greedy mean >= 475 and its feed-forward twin, same budget and settings, stays far
  below (memory is what solves it); recurrent IMPALA over a 2-actor farm reaches >= 475.
- The learner replays every sequence exactly as acted: training log-probabilities equal the
  acting ones (serially), V-trace's importance ratios are exactly 1 over a farm without lag,
  also while actors are killed and replaced.
- Truncated episodes bootstrap from V(final obs) in the state after the step.
- ``predict`` carries the state across an episode; checkpoints refuse a mismatched network.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import hookimpl
from harness.api import EnvInfo, SpaceInfo
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent, train
from harness.runtime.stepper import EnvStepper
from harness_algos.impala import IMPALAConfig
from harness_algos.impala import make_agent as make_impala
from harness_algos.ppo import PPOConfig
from harness_algos.ppo import make_agent as make_ppo
from harness_algos.recurrent import numpy_recurrent_policy

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
MASKED_PPO = ROOT / "competitions" / "cartpole" / "masked_ppo.toml"
MASKED_IMPALA = ROOT / "competitions" / "cartpole" / "masked_impala.toml"
MASKED_INFO = EnvInfo(
    "CartPole-v1",
    SpaceInfo("box", (2,), "float32", low=(-4.8, -0.42), high=(4.8, 0.42)),
    SpaceInfo("discrete", (), "int64", n=2),
    4,
)


class Recorder:
    def __init__(self) -> None:
        self.metrics: list[dict[str, float]] = []

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        self.metrics.append(dict(metrics))


def run(
    tmp_path: Path, files: list[Path], overrides: list[str], plugins: tuple[Any, ...] = ()
) -> tuple[Any, Any, Any, Recorder]:
    pm = make_plugin_manager()
    recorder = Recorder()
    pm.register(recorder, name="recorder")
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"test-plugin-{i}")
    registry = collect_registry(pm)
    base = [f"out='{tmp_path}'", "trackers=['csv']", "progress=false"]
    config = resolve(layer(PACK, files, base + overrides, environ={}), registry)
    return train(config, registry, pm), config, registry, recorder


def fresh_eval(config: Any, registry: Any, run_dir: Path, seed: int) -> Any:
    agent = load_agent(config, registry, latest_checkpoint(run_dir))
    return agent, evaluate(agent, config, registry, 20, seed=777_000 + seed)


def torch_backend() -> Any:
    from harness_torch.config import TorchConfig

    return (
        collect_registry(make_plugin_manager()).backends.get("torch").load(TorchConfig(threads=1))
    )


def masked_envs(n: int, seed: int) -> Any:
    from harness_gymnasium.plugin import GymConfig, make_env

    return make_env("CartPole-v1", num_envs=n, seed=seed, options=GymConfig(obs_keep=[0, 2]))


# ------------------------------------------------------------------------------------------
# Exact replay


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_training_replays_the_rollout_exactly_as_acted(kind: str) -> None:
    """The log-probabilities of the first update's forward pass (sequences replayed from the
    stored states, episode starts inside) equal those recorded while acting."""
    bk = torch_backend()
    config = PPOConfig(recurrent=kind, rnn_hidden=16, n_steps=40, batch_size=80, hidden=[16])
    agent = make_ppo(MASKED_INFO, bk, config, seed=3, total_steps=10_000)
    stepper, finished = EnvStepper(masked_envs(4, seed=5), 5), []
    for _ in range(2):  # the second rollout starts from states the first one left
        agent.learn()
        for _ in range(40):
            agent.observe(stepper.step(agent, finished))
    assert finished, "no episode ended inside the rollouts: the resets went untested"
    assert agent.memory is not None and np.abs(agent.memory.rollout_start).sum() > 0
    last = agent.score_rollout(agent._last_next_obs)
    agent.buffer.compute_gae(last, 0.99, 0.95)
    for batch in agent.minibatches():
        assert batch.starts.any()
        with bk.no_grad():
            dist, _ = agent.algorithm.forward(
                bk.tensor(batch.obs), (bk.tensor(batch.state), batch.starts)
            )
            logp = bk.numpy(dist.log_prob(bk.tensor(batch.actions, "int64")))
        np.testing.assert_allclose(logp, batch.log_probs, atol=2e-5)


def test_truncated_episodes_bootstrap_in_the_state_after_the_step() -> None:
    """gamma * V(final obs) goes onto the reward of a time-limit cut, V taken in the state the
    acting policy reached after that step (checked against the numpy acting path)."""
    from harness.api import Transition

    bk = torch_backend()
    config = PPOConfig(recurrent="lstm", rnn_hidden=8, n_steps=6, hidden=[8], gamma=0.9)
    info = EnvInfo(MASKED_INFO.env_id, MASKED_INFO.observation, MASKED_INFO.action, 3)
    agent = make_ppo(info, bk, config, seed=0, total_steps=100)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((3, 2)).astype(np.float32)
    rewards = []
    for t in range(6):
        actions, extras = agent.sample(obs)
        next_obs = rng.standard_normal((3, 2)).astype(np.float32)
        truncated = np.array([t == 3, False, t == 1])
        terminated = np.array([False, t == 2, False])
        reward = np.ones(3, np.float32)
        agent.observe(Transition(obs, actions, reward, next_obs, terminated, truncated, extras))
        rewards.append((t, truncated, next_obs.copy()))
        agent.episodes_ended(truncated | terminated)
        obs = rng.standard_normal((3, 2)).astype(np.float32)
    before = agent.buffer.rewards.copy()
    agent.score_rollout(obs)
    policy = numpy_recurrent_policy(bk, agent.algorithm.net)
    for env, cut in ((0, 3), (2, 1)):
        state = agent.memory.rollout_start[env : env + 1]
        for t in range(cut + 1):
            _, state = policy(agent.buffer.obs[t, env : env + 1], state)
        (_, value), _ = policy(rewards[cut][2][env : env + 1], state)
        expected = before[cut, env] + 0.9 * value[0, 0]
        assert agent.buffer.rewards[cut, env] == pytest.approx(expected, abs=1e-5)
    untouched = np.ones_like(before, bool)
    untouched[3, 0] = untouched[1, 2] = False
    np.testing.assert_array_equal(agent.buffer.rewards[untouched], before[untouched])


class Killer:
    """SIGKILLs one actor every ``every`` seconds (by the pid it reports)."""

    def __init__(self, every: float) -> None:
        self.every, self.next, self.kills = every, time.monotonic() + every, 0

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        if time.monotonic() >= self.next:
            slot = run.collector.slots[self.kills % len(run.collector.slots)]
            os.kill(slot.proxy.pid(), signal.SIGKILL)
            self.kills += 1
            self.next = time.monotonic() + self.every


@pytest.mark.distributed
def test_farm_unrolls_replay_exactly_as_acted_while_actors_die(tmp_path: Path) -> None:
    """Recurrent IMPALA over 2 actors without lag and one gradient step per unroll: every
    behaviour log-probability equals the learner's (rho = 1), though each unroll starts from a
    state its actor carried over from earlier weights, and actors are killed and replaced (a
    replacement starts fresh episodes from zero states, never a stale one)."""
    killer = Killer(every=2.0)
    result, _, _, rec = run(
        tmp_path,
        [MASKED_IMPALA],
        [
            "max_policy_lag=0",
            "algo.epochs=1",
            "total_steps=10_000_000",
            "max_seconds=14",
            "eval_every=0",
            "eval_episodes=2",
            "checkpoint_every=0",
            "seed=2",
        ],
        plugins=(killer,),
    )
    rows = [m for m in rec.metrics if "vtrace/rho_mean" in m]
    assert killer.kills >= 3 and rows[-1]["farm/actor_restarts"] >= killer.kills - 1
    assert len(rows) > 20
    assert max(abs(m["vtrace/rho_mean"] - 1.0) for m in rows) < 1e-4
    assert max(m["vtrace/rho_clipped"] for m in rows) == 0.0
    assert rows[-1]["farm/received_steps"] == result.steps


# ------------------------------------------------------------------------------------------
# Learning checks


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_recurrent_ppo_solves_masked_cartpole_and_its_feed_forward_twin_does_not(
    seed: int, tmp_path: Path
) -> None:
    result, config, registry, _ = run(tmp_path / "lstm", [MASKED_PPO], [f"seed={seed}"])
    agent, fresh = fresh_eval(config, registry, result.run_dir, seed)
    assert fresh.mean >= 475.0, f"recurrent PPO seed {seed}: fresh 20-episode mean {fresh.mean}"
    # the same policy with its state reset before every step has no memory: it falls
    forgetful = evaluate(_Forgetful(agent), config, registry, 10, seed=888_000 + seed)
    assert forgetful.mean < 200.0, f"a memoryless replay of the policy scored {forgetful.mean}"
    steps = f"total_steps={max(result.steps, 60_000)}"
    twin, config, registry, _ = run(
        tmp_path / "ff", [MASKED_PPO], [f"seed={seed}", "algo.recurrent='none'", steps]
    )
    _, ff = fresh_eval(config, registry, twin.run_dir, seed)
    assert ff.mean < 150.0, f"feed-forward PPO on masked CartPole scored {ff.mean}: no POMDP"


class _Forgetful:
    """An agent whose evaluation state is reset before every ``predict``."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def predict(self, obs: Any) -> Any:
        self.agent.predict_episodes_ended(np.ones(len(obs), bool))
        return self.agent.predict(obs)


@pytest.mark.distributed
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_recurrent_impala_on_a_two_actor_farm_solves_masked_cartpole(
    seed: int, tmp_path: Path
) -> None:
    result, config, registry, rec = run(tmp_path, [MASKED_IMPALA], [f"seed={seed}"])
    _, fresh = fresh_eval(config, registry, result.run_dir, seed)
    assert fresh.mean >= 475.0, f"recurrent IMPALA seed {seed}: fresh mean {fresh.mean}"
    assert any(m.get("farm/actors") == 2.0 for m in rec.metrics)


@pytest.mark.slow
def test_recurrent_ppo_with_a_gru_solves_masked_cartpole(tmp_path: Path) -> None:
    result, config, registry, _ = run(tmp_path, [MASKED_PPO], ["seed=1", "algo.recurrent='gru'"])
    _, fresh = fresh_eval(config, registry, result.run_dir, 1)
    assert fresh.mean >= 475.0, f"GRU PPO: fresh 20-episode mean {fresh.mean}"


# ------------------------------------------------------------------------------------------
# Backends, checkpoints, bad input


@pytest.mark.parametrize("make", [make_ppo, make_impala])
def test_paddle_acts_and_replays_like_torch(make: Any) -> None:
    """The same recurrent algorithm file on the paddle backend: its acting copy and its fused
    replay agree (log-probabilities and values of a rollout with episode starts inside)."""
    pytest.importorskip("paddle")
    from harness_paddle.config import PaddleConfig

    registry = collect_registry(make_plugin_manager())
    bk = registry.backends.get("paddle").load(PaddleConfig(threads=1))
    cls = PPOConfig if make is make_ppo else IMPALAConfig
    agent = make(MASKED_INFO, bk, cls(recurrent="lstm", rnn_hidden=8, hidden=[8]), seed=1)
    stepper, finished = EnvStepper(masked_envs(4, seed=2), 2), []
    steps = [stepper.step(agent, finished) for _ in range(30)]
    assert finished, "no episode ended: the resets went untested"
    flags = np.zeros((30, 4), bool)
    flags[1:] = [t.terminated | t.truncated for t in steps[:-1]]
    obs = np.array([t.obs for t in steps])
    with bk.no_grad():
        out, values = agent.algorithm.net_outputs(
            agent.algorithm.net, bk.tensor(obs), (bk.tensor(steps[0].extras["rnn_state"]), flags)
        )
    logits = bk.numpy(out).reshape(30, 4, 2)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = np.array([t.extras["action"] for t in steps])
    replayed = np.take_along_axis(logp, actions[..., None], -1)[..., 0]
    np.testing.assert_allclose(replayed, [t.extras["log_prob"] for t in steps], atol=2e-5)
    values = bk.numpy(values)[:, 0].reshape(30, 4)
    state = steps[0].extras["rnn_state"]
    np.testing.assert_allclose(
        agent.algorithm.sequence_values(obs, flags, state), values, atol=1e-6
    )


def test_checkpoint_of_another_network_is_refused_naming_both(tmp_path: Path) -> None:
    result, _, _, _ = run(
        tmp_path, [MASKED_PPO], ["seed=1", "total_steps=512", "eval_every=0", "eval_episodes=0"]
    )
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "eval",
            str(result.run_dir),
            "--episodes",
            "1",
            "--set",
            "algo.recurrent=none",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert 'algo.recurrent = "lstm", algo.rnn_hidden = 64' in proc.stderr
    assert 'algo.recurrent = "none"' in proc.stderr and "Traceback" not in proc.stderr


def test_recurrent_on_an_algorithm_without_it_names_those_with_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(ROOT / "competitions" / "cartpole"),
            "--set",
            "algo=dqn",
            "--set",
            "algo.recurrent=lstm",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "'recurrent' is not an option of algorithm 'dqn'" in proc.stderr
    assert "'impala'" in proc.stderr and "'ppo'" in proc.stderr
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize("algo", ["ppo", "impala"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("actions", ["discrete", "box"])
def test_recurrent_variants_conform(algo: str, kind: str, actions: str, torch_backend: Any) -> None:
    """harness.testing.check_algorithm (sample/observe/learn, save/restore, weights
    broadcast, predict) on both action kinds: the acting states change shape with the batch
    a probe sends and survive save/restore."""
    from harness.testing import check_algorithm

    registry = collect_registry(make_plugin_manager())
    action = (
        SpaceInfo("discrete", (), "int64", n=3)
        if actions == "discrete"
        else SpaceInfo("box", (2,), "float32", low=(-1.0, -1.0), high=(1.0, 1.0))
    )
    info = EnvInfo("t", SpaceInfo("box", (3,), "float32"), action, 2)
    if algo == "ppo":
        config: Any = PPOConfig(
            recurrent=kind, rnn_hidden=8, hidden=[8], n_steps=8, batch_size=8, n_epochs=2
        )
    else:
        config = IMPALAConfig(recurrent=kind, rnn_hidden=8, hidden=[8], rollout_len=8)
    check_algorithm(registry.algorithms.get(algo), torch_backend, info, config=config)
