"""MADDPG (plugins/harness_algos/maddpg.py) through the real runner and the pettingzoo env
plugin: learning checks on mpe2's simple_spread (discrete and continuous actions) and
simple_adversary against the uniform-random policy measured in the same test, a short run
over the actor farm, and unit checks of the pieces a learning check would only catch
indirectly (the straight-through Gumbel-softmax, bootstrapping through time limits, the
replay ring and its checkpoint).

Thresholds (measured numbers in competitions/mpe_spread/pack.toml): a fresh greedy
evaluation of the final checkpoint over 40 episodes must beat both an absolute floor between
the random policy's and the learned policies' measured means, and the random policy's mean
measured here (100 episodes) by a margin."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mpe2", reason="the MADDPG checks run on mpe2's particle environments")

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "competitions" / "mpe_spread"
EVAL_EPISODES = 40
RANDOM_EPISODES = 100
SPREAD = "mpe2/simple_spread_v3"
ADVERSARY = "mpe2/simple_adversary_v3"

# (env overrides, total steps, absolute floor of the learned score, margin over the random
# policy's score); see the module docstring and _score
CASES: dict[str, tuple[list[str], int, float, float]] = {
    "spread": ([], 30_000, -62.0, 10.0),
    "spread-continuous": (["env.continuous_actions=true"], 30_000, -64.0, 10.0),
    "adversary": ([f"env='{ADVERSARY}'"], 30_000, -16.0, 5.0),
}
ADVERSARY_MARGIN = 5.0
"""The learned adversary's own return over the random adversary's (facing random agents)."""


def _config(
    extra: list[str], seed: int, out: Path, steps: int, user_files: tuple[Path, ...] = ()
) -> Any:
    """The mpe_spread pack (with ``user_files`` on top) and the run's overrides."""
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        *extra,
        f"seed={seed}",
        f"total_steps={steps}",
        f"out='{out}'",
        "trackers=['csv']",
        "progress=false",
    ]
    raw = layer(find_pack_file(PACK), list(user_files), overrides, environ={})
    return pm, registry, resolve(raw, registry)


def _score(result: Any, env: str) -> float:
    """Team return (sum over agents) on simple_spread, where every agent's reward counts
    towards the one cooperative task. On simple_adversary the two sides compete: a good
    agent's reward is ``-(closest good agent's distance to the goal) + (the adversary's
    distance)``, the adversary's ``-(its distance)``, so the team sum mixes the sides and a
    good agent's return falls when the adversary improves. Their sum, ``return/agent_0 +
    return/adversary_0 = -(sum over steps of the closest good agent's distance)``, measures
    the good team's task alone, whatever the adversary does; the adversary's own return is
    checked beside it (:func:`check_learns`)."""
    if env == ADVERSARY:
        means = result.metric_means()
        return float(means["return/agent_0"] + means["return/adversary_0"])
    return float(result.mean)


def _adversary(result: Any) -> float:
    return float(result.metric_means()["return/adversary_0"])


def random_eval(extra: list[str], seed: int, out: Path) -> Any:
    """The uniform-random policy over ``RANDOM_EPISODES`` episodes of the same env."""
    _, registry, config = _config([*extra, "algo='random'"], seed, out, 16)
    from harness.runtime import make_agent, make_envs
    from harness.runtime.spaces import env_info

    envs = make_envs(config, registry, 1, seed=None)
    try:
        info = env_info(config.run.env, envs)
    finally:
        envs.close()
    agent = make_agent(config, registry, info)
    return evaluate(agent, config, registry, RANDOM_EPISODES, seed=555_000 + seed)


def train_and_reevaluate(extra: list[str], seed: int, out: Path, steps: int) -> Any:
    from harness.runtime import train

    pm, registry, config = _config(extra, seed, out, steps)
    result = train(config, registry, pm)
    assert result.steps >= steps
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, EVAL_EPISODES, seed=777_000 + seed)
    assert len(fresh.returns) == EVAL_EPISODES
    return fresh


def check_learns(case: str, seed: int, tmp_path: Path) -> None:
    extra, steps, floor, margin = CASES[case]
    env = ADVERSARY if case == "adversary" else SPREAD
    random_result = random_eval(extra, seed, tmp_path / "random")
    learned_result = train_and_reevaluate(extra, seed, tmp_path / "maddpg", steps)
    baseline, learned = _score(random_result, env), _score(learned_result, env)
    print(
        f"{case} seed {seed}: random {baseline:.2f}, maddpg {learned:.2f} after {steps} steps; "
        f"random {random_result.metric_means()}, maddpg {learned_result.metric_means()}"
    )
    assert learned >= floor, f"{case} seed {seed}: learned {learned:.2f} < floor {floor}"
    assert learned >= baseline + margin, (
        f"{case} seed {seed}: learned {learned:.2f} is not {margin} above random {baseline:.2f}"
    )
    if env == ADVERSARY:
        mine, theirs = _adversary(learned_result), _adversary(random_result)
        assert mine >= theirs + ADVERSARY_MARGIN, (
            f"adversary seed {seed}: learned adversary {mine:.2f} is not {ADVERSARY_MARGIN} "
            f"above the random one {theirs:.2f}"
        )


SEEDS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
SLOW_SEEDS = [pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3)]


@pytest.mark.parametrize("seed", SEEDS)
def test_maddpg_learns_simple_spread(seed: int, tmp_path: Path) -> None:
    check_learns("spread", seed, tmp_path)


@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_maddpg_learns_simple_spread_with_continuous_actions(seed: int, tmp_path: Path) -> None:
    check_learns("spread-continuous", seed, tmp_path)


@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_maddpg_learns_simple_adversary(seed: int, tmp_path: Path) -> None:
    check_learns("adversary", seed, tmp_path)


def test_maddpg_runs_over_the_actor_farm(tmp_path: Path) -> None:
    """Two actor processes stream rollouts into the learner's joint replay, which updates."""
    from harness.runtime import train

    pm, registry, config = _config(
        ["actors=2", "num_envs=2", "eval_episodes=4", "algo.learning_starts=500"],
        1,
        tmp_path,
        3_000,
    )
    assert_farm_trained(train(config, registry, pm), 3_000, "losses/critic_loss")


def assert_farm_trained(result: Any, steps: int, loss: str) -> None:
    """A 2-actor farm run reached ``steps``, its actors delivered steps and the learner's
    ``loss`` was logged and finite throughout (metrics.csv)."""
    assert result.steps >= steps
    with (result.run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    farm = [r for r in rows if r.get("farm/actors")]
    assert farm and float(farm[-1]["farm/actors"]) == 2.0
    assert float(farm[-1]["farm/received_steps"]) > 0
    losses = [float(r[loss]) for r in rows if r.get(loss)]
    assert losses and all(np.isfinite(losses))


# -- unit checks --------------------------------------------------------------------------


def _info(kind: str, num_envs: int = 2) -> EnvInfo:
    obs = {
        "adversary_0": SpaceInfo("box", (8,), "float32"),
        "agent_0": SpaceInfo("box", (10,), "float32"),
    }
    action = (
        SpaceInfo("discrete", (), "int64", n=5)
        if kind == "discrete"
        else SpaceInfo("box", (5,), "float32", low=(0.0,) * 5, high=(1.0,) * 5)
    )
    return EnvInfo(
        "unit",
        obs["adversary_0"],
        action,
        num_envs=num_envs,
        agents=tuple(obs),
        observations=obs,
        actions=dict.fromkeys(obs, action),
    )


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    spec = collect_registry(make_plugin_manager()).backends.get("torch")
    return spec.load(spec.config_cls(threads=1))


def test_gumbel_softmax_is_one_hot_forward_with_the_soft_gradient(torch_backend: Any) -> None:
    import torch

    from harness_algos.maddpg import MADDPGConfig, make_agent

    agent = make_agent(_info("discrete"), torch_backend, MADDPGConfig(gumbel_temperature=0.7))
    space = agent.algorithm.act_spaces[0]
    logits = torch.randn(64, 5, requires_grad=True)
    noise = torch.as_tensor(np.random.default_rng(0).gumbel(size=(64, 5)), dtype=torch.float32)
    out = agent.algorithm._relaxed(logits, noise, space)
    expected = torch.nn.functional.one_hot((logits + noise).argmax(-1), 5).float()
    assert torch.equal(out.detach(), expected)
    weights = torch.randn(5)
    (out * weights).sum().backward()
    straight = logits.grad.clone()
    logits.grad = None
    soft = torch.softmax((logits + noise) / 0.7, -1)
    (soft * weights).sum().backward()
    torch.testing.assert_close(straight, logits.grad)
    assert straight.abs().sum() > 0


def test_truncation_keeps_bootstrapping_and_actions_are_encoded(torch_backend: Any) -> None:
    """Only ``terminated`` stops the bootstrap; discrete actions reach the critics one-hot
    and box actions mapped onto [-1, 1]; per-agent rewards stay per agent."""
    from harness_algos.maddpg import MADDPGConfig, make_agent

    for kind in ("discrete", "box"):
        info = _info(kind, num_envs=3)
        agent = make_agent(info, torch_backend, MADDPGConfig(buffer_size=16))
        rng = np.random.default_rng(1)
        obs = {a: rng.standard_normal((3, info.observations[a].shape[0])) for a in info.agents}
        actions, _ = agent.sample(obs)
        rewards = {"adversary_0": np.array([1.0, 2.0, 3.0]), "agent_0": np.array([4.0, 5, 6])}
        agent.observe(
            Transition(
                obs,
                actions,
                rewards,
                obs,
                np.array([True, False, False]),
                np.array([False, True, False]),
                {},
            )
        )
        data = agent.replay.state_dict()
        np.testing.assert_array_equal(data["dones"], [1.0, 0.0, 0.0])
        np.testing.assert_array_equal(data["rewards"], [[1, 4], [2, 5], [3, 6]])
        np.testing.assert_allclose(data["obs"][:, :8], obs["adversary_0"], rtol=1e-6)
        coded = data["actions"][:, :5]
        if kind == "discrete":
            np.testing.assert_array_equal(coded.argmax(1), actions["adversary_0"])
            np.testing.assert_array_equal(coded.sum(1), 1.0)
        else:
            np.testing.assert_allclose(coded, actions["adversary_0"] * 2 - 1, atol=1e-6)


def test_replay_ring_wraps_and_restores(tmp_path: Path, torch_backend: Any) -> None:
    from harness_algos.maddpg import MADDPGConfig, make_agent

    info = _info("discrete", num_envs=4)
    config = MADDPGConfig(buffer_size=10, batch_size=4, learning_starts=0, train_freq=4)
    agent = make_agent(info, torch_backend, config, seed=3)
    rng = np.random.default_rng(2)
    for step in range(4):  # 16 rows into a ring of 10
        obs = {a: np.full((4, info.observations[a].shape[0]), step * 4.0) for a in info.agents}
        obs["agent_0"] += np.arange(4)[:, None]
        actions, _ = agent.sample(obs)
        rewards = {a: rng.standard_normal(4) for a in info.agents}
        done = np.zeros(4, bool)
        agent.observe(Transition(obs, actions, rewards, obs, done, done, {}))
        agent.learn()
    assert len(agent.replay) == 10 and agent.replay.pos == 6
    kept = sorted(agent.replay.data["obs"][:, 8])  # agent_0's first feature: 12..15, 6..11
    assert kept == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert agent.updates > 0
    agent.save(tmp_path / "ckpt")
    restored = make_agent(info, torch_backend, config, seed=9)
    restored.restore(tmp_path / "ckpt")
    for name, value in agent.replay.state_dict().items():
        np.testing.assert_array_equal(restored.replay.state_dict()[name], value)
    probe = {a: rng.standard_normal((5, info.observations[a].shape[0])) for a in info.agents}
    first, second = agent.sample(probe)[0], restored.sample(probe)[0]
    for a in info.agents:
        np.testing.assert_array_equal(first[a], second[a])
