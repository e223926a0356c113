"""Off-policy continuous control: learning checks for SAC, TD3 and DDPG on Pendulum-v1 (mean
greedy return >= -250 over 10 fresh episodes of the final checkpoint, within 20k env steps),
SAC over the real actor farm, the multi-head DDPG ensemble, and a diverging run stopped with
the step and the last finite checkpoint named.

The CI checks use 64x64 networks (same algorithms and schedules as competitions/pendulum, a
fraction of the arithmetic); the recorded baselines use the RL Zoo's networks."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent
from harness.testing import check_algorithm

ROOT = Path(__file__).resolve().parents[2]
PENDULUM = ROOT / "competitions" / "pendulum"
THRESHOLD = -250.0
BUDGET = 20_000
SMALL = ["algo.hidden=[64, 64]"]
# The runs stop at the first periodic evaluation above -170 over 20 episodes, stricter than
# the pack's -200 over 10: a policy of a few thousand steps can fail to swing up from some
# start angles, and 10 evaluation episodes may miss that (measured: DDPG seed 1 on an Intel
# Xeon stopped at 4k steps on -197 and its fresh 10 episodes scored -280; SAC over the farm,
# whose runs are not deterministic, once scored -274 fresh after stopping at -170 over 10).
STOP = ["stop_at_return=-170", "eval_episodes=20"]
USER_FILES = {"sac": [], "td3": [PENDULUM / "td3.toml"], "ddpg": [PENDULUM / "ddpg.toml"]}
# the Zoo's TD3/DDPG entries act randomly for 10k of the 20k steps; the CI checks start at 1k
FAST_START = {
    "sac": [],
    "td3": ["algo.learning_starts=1000"],
    "ddpg": ["algo.learning_starts=1000"],
}


def train_and_reevaluate(
    algo: str, seed: int, out: Path, extra: list[str], backend: str = "torch"
) -> tuple[float, Path]:
    from harness.runtime import train

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        *SMALL,
        *FAST_START[algo],
        *STOP,
        *extra,
        f"seed={seed}",
        f"total_steps={BUDGET}",
        f"out='{out}'",
        "trackers=['csv']",
        f"backend='{backend}'",
    ]
    config = resolve(
        layer(find_pack_file(PENDULUM), USER_FILES[algo], overrides, environ={}), registry
    )
    result = train(config, registry, pm)
    assert result.steps <= BUDGET + 1_000
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 10, seed=777_000 + seed)
    assert len(fresh.returns) == 10
    return fresh.mean, result.run_dir


SEEDS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_solves_pendulum(algo: str, seed: int, harness_backend_name: str, tmp_path: Path) -> None:
    mean, _ = train_and_reevaluate(algo, seed, tmp_path, [], harness_backend_name)
    assert mean >= THRESHOLD, f"{algo} seed {seed}: fresh 10-episode mean {mean:.1f}"


def test_sac_learns_over_the_actor_farm(tmp_path: Path) -> None:
    """Two actor processes over ZeroMQ stream rollouts into the learner's replay."""
    mean, run_dir = train_and_reevaluate(
        "sac", 1, tmp_path, ["actors=2", "num_envs=2", "max_policy_lag=2"]
    )
    assert mean >= THRESHOLD, f"SAC over the farm: fresh 10-episode mean {mean:.1f}"
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("farm/actors")]
    assert rows and float(rows[-1]["farm/actors"]) == 2.0
    assert float(rows[-1]["farm/received_steps"]) > 0


@pytest.mark.slow
def test_ddpg_ensemble_solves_pendulum(tmp_path: Path) -> None:
    """PARL's 3-head DDPG in the RL Zoo's budget (20k steps, 10k of them warm-up), over three
    seeds: the median of their fresh means. One seed alone is a coin with ~1/3 tails here
    (seeds 1-3: -294, -159, -142 once every seed came from harness.seeds)."""
    means = [
        train_and_reevaluate("ddpg", seed, tmp_path / str(seed), ["algo.ensemble=3"])[0]
        for seed in (1, 2, 3)
    ]
    assert float(np.median(means)) >= THRESHOLD, f"DDPG x3 heads: fresh means {means}"


BOX = EnvInfo(
    "box-test",
    SpaceInfo("box", (3,), "float32", low=(-1.0, -1.0, -8.0), high=(1.0, 1.0, 8.0)),
    SpaceInfo("box", (2,), "float32", low=(-2.0, 0.0), high=(2.0, 1.0)),
    num_envs=3,
)


@pytest.fixture(scope="module")
def torch_backend():  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    registry = collect_registry(make_plugin_manager())
    spec = registry.backends.get("torch")
    return spec.load(spec.config_cls(threads=1))


def test_ddpg_ensemble_conforms(torch_backend) -> None:  # type: ignore[no-untyped-def]
    registry = collect_registry(make_plugin_manager())
    spec = registry.algorithms.get("ddpg")
    check_algorithm(spec, torch_backend, BOX, config=spec.config_cls(ensemble=3))


def test_ddpg_ensemble_acts_with_the_best_scored_head(torch_backend) -> None:  # type: ignore[no-untyped-def]
    """Greedy acting scores every head's action with every critic and takes the action with
    the highest mean Q; exploration follows each env's own head (the policy's state row
    ``head``, drawn from the agent's generator at the first exploratory step, as the agent
    drew its heads when it was made) and redraws it only for the envs whose episode ended."""
    from harness_algos.ddpg import DDPGConfig, make_agent
    from harness_algos.offpolicy import gaussian_explore

    config = DDPGConfig(ensemble=4, hidden=[16], learning_starts=0)
    agent = make_agent(BOX, torch_backend, config, seed=3)
    algo = agent.algorithm
    obs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    candidates = algo.head_actions(obs)
    assert candidates.shape == (4, 5, 2)
    critics = torch_backend.inference(algo.critics)
    scores = np.array(
        [
            [np.mean([q[i, 0] for q in critics(np.concatenate([obs, a], -1))]) for i in range(5)]
            for a in candidates
        ]
    )
    expected = candidates[scores.argmax(0), np.arange(5)]
    np.testing.assert_allclose(algo.act(obs), expected, rtol=1e-6)
    assert not np.allclose(candidates[0], candidates[1])  # the heads really differ

    policy = agent.policy()
    fresh = policy.initial_state(3)
    greedy, _, kept = policy.act(obs[:3], fresh, explore=False)
    np.testing.assert_allclose(greedy, agent.to_env(expected[:3]), rtol=1e-6)
    assert kept is fresh and (fresh["head"] == -1).all()  # greedy acting draws no head
    _, extras, state = policy.act(obs[:3], fresh, explore=True)
    assert extras == {} and (fresh["head"] == -1).all()  # (a new state, not written into)
    before = state["head"].copy()
    np.testing.assert_array_equal(before, np.random.default_rng(3).integers(4, size=3))
    noise = gaussian_explore(candidates[before, np.arange(3)], 0.1, np.random.default_rng(5))
    again, _, _ = policy.act(obs[:3], state, np.random.default_rng(5), explore=True)
    np.testing.assert_allclose(again, agent.to_env(noise), rtol=1e-6)  # each row's own head
    for _ in range(20):  # nothing ended: nobody switches
        state = policy.reset(state, np.zeros(3, bool), explore=True)
    np.testing.assert_array_equal(state["head"], before)
    switched = set()
    for _ in range(50):
        held = state["head"]
        state = policy.reset(state, np.array([True, False, False]), explore=True)
        assert state["head"] is not held
        switched.add(int(state["head"][0]))
        np.testing.assert_array_equal(state["head"][1:], before[1:])
    assert switched == {0, 1, 2, 3}


def test_ddpg_checkpoint_holds_no_acting_state_and_loads_one_that_does(
    torch_backend,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """The ensemble's heads are the policy's per-env state, kept by whoever steps the envs:
    a checkpoint no longer holds them (a resumed run starts new episodes, each drawing its
    head), and the agent state of a checkpoint written when it did still loads."""
    from harness_algos.ddpg import DDPGConfig, make_agent

    config = DDPGConfig(ensemble=3, hidden=[16])
    agent = make_agent(BOX, torch_backend, config, seed=1)
    assert "heads" not in agent.extra_state()
    agent.save(tmp_path / "ckpt")
    restored = make_agent(BOX, torch_backend, config, seed=2)
    restored.restore(tmp_path / "ckpt")
    assert restored.rng.bit_generator.state == agent.rng.bit_generator.state
    old = {**agent.extra_state(), "heads": [2, 0, 1]}  # (what checkpoints held before)
    restored.load_extra_state(old)
    np.testing.assert_array_equal(restored.policy().initial_state(3)["head"], [-1, -1, -1])


def test_unbounded_action_box_is_refused() -> None:
    from harness.errors import ConfigError
    from harness_algos.offpolicy import box_bounds

    info = EnvInfo(
        "free",
        SpaceInfo("box", (3,), "float32", low=(-1.0,) * 3, high=(1.0,) * 3),
        SpaceInfo("box", (1,), "float32", low=(-np.inf,), high=(np.inf,)),
        num_envs=1,
    )
    with pytest.raises(ConfigError, match=r"'free' has action bounds.*RescaleAction"):
        box_bounds(info, "sac")


def test_a_diverging_run_stops_naming_the_step_and_last_finite_checkpoint(tmp_path: Path) -> None:
    """DQN with a learning rate of 1e30 overflows within its first updates: the run stops
    with exit code 2, names the step, and points at the checkpoint written before it."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(ROOT / "competitions" / "cartpole"),
         "--config", str(ROOT / "competitions" / "cartpole" / "dqn.toml"),
         "--set", "algo.learning_rate=1e30", "--set", "checkpoint_every=500",
         "--set", "total_steps=20000", "--set", "trackers=['csv']", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Training diverged at step" in proc.stderr
    (run_dir,) = tmp_path.iterdir()
    last = latest_checkpoint(run_dir)
    assert f"The last finite checkpoint is {last}" in proc.stderr
    assert f"--resume {run_dir}" in proc.stderr
