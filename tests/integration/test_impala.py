"""IMPALA: the V-trace function against the paper's definition, the agent's truncation
bootstrapping, the CNN path through the conformance check, and learning checks on CartPole-v1
over a real actor farm (2 actor processes over ZeroMQ on loopback, up to 4 rollouts of policy
lag) and serially. A learning check trains until an evaluation reaches the pack's stop return,
then re-evaluates the final checkpoint on 20 fresh episodes (other seeds): that mean must be
>= 475. CI runs seed 1; the other seeds are marked slow."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent
from harness.testing import check_algorithm
from harness_algos.impala import IMPALAConfig, make_agent, vtrace

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
IMPALA = ROOT / "competitions" / "cartpole" / "impala.toml"
THRESHOLD = 475.0


# ------------------------------------------------------------------------------------------
# V-trace


def vtrace_reference(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap: np.ndarray,
    rho_bar: float,
    c_bar: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Equation (1) of Espeholt et al. 2018 term by term, in plain Python:
    v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, with per-step discounts
    gamma_i (0 across an episode end) and V(x_T) = bootstrap; then the policy-gradient
    advantage rho_s (r_s + gamma_s v_{s+1} - V(x_s))."""
    steps, envs = values.shape
    vs = np.zeros((steps, envs))
    adv = np.zeros((steps, envs))
    for e in range(envs):
        v = [float(x) for x in values[:, e]] + [float(bootstrap[e])]
        rho = [min(rho_bar, float(np.exp(x))) for x in log_rhos[:, e]]
        c = [lam * min(c_bar, float(np.exp(x))) for x in log_rhos[:, e]]
        delta = [rho[t] * (rewards[t, e] + discounts[t, e] * v[t + 1] - v[t]) for t in range(steps)]
        for s in range(steps):
            total, coef = v[s], 1.0
            for t in range(s, steps):
                total += coef * delta[t]
                coef *= discounts[t, e] * c[t]
            vs[s, e] = total
        for s in range(steps):
            v_next = vs[s + 1, e] if s + 1 < steps else v[steps]
            adv[s, e] = rho[s] * (rewards[s, e] + discounts[s, e] * v_next - v[s])
    return vs, adv


def random_unrolls(seed: int, steps: int = 9, envs: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ends = rng.random((steps, envs)) < 0.2
    return {
        "log_rhos": rng.normal(0.0, 0.7, (steps, envs)),
        "discounts": np.where(ends, 0.0, 0.97),
        "rewards": rng.normal(size=(steps, envs)),
        "values": rng.normal(size=(steps, envs)),
        "bootstrap": rng.normal(size=envs),
    }


@pytest.mark.parametrize(
    ("rho_bar", "c_bar", "lam"), [(1.0, 1.0, 1.0), (0.5, 2.0, 1.0), (2.0, 0.8, 0.9)]
)
def test_vtrace_matches_the_papers_definition(rho_bar: float, c_bar: float, lam: float) -> None:
    for seed in range(3):
        u = random_unrolls(seed)
        vs, adv = vtrace(
            u["log_rhos"],
            u["discounts"],
            u["rewards"],
            u["values"],
            u["bootstrap"],
            rho_bar=rho_bar,
            c_bar=c_bar,
            lam=lam,
        )
        ref_vs, ref_adv = vtrace_reference(
            u["log_rhos"],
            u["discounts"],
            u["rewards"],
            u["values"],
            u["bootstrap"],
            rho_bar,
            c_bar,
            lam,
        )
        assert vs.dtype == adv.dtype == np.float32
        np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_on_policy_is_the_n_step_return() -> None:
    """rho = c = 1 (behaviour == target): v_s is the discounted sum of rewards to the end of
    the unroll plus the discounted bootstrap value, cut at episode ends."""
    u = random_unrolls(7)
    zeros = np.zeros_like(u["log_rhos"])
    vs, adv = vtrace(zeros, u["discounts"], u["rewards"], u["values"], u["bootstrap"])
    steps, envs = u["values"].shape
    for e in range(envs):
        ret = u["bootstrap"][e]
        for t in range(steps - 1, -1, -1):
            ret = u["rewards"][t, e] + u["discounts"][t, e] * ret
            assert vs[t, e] == pytest.approx(ret, abs=1e-5)
            v_next = vs[t + 1, e] if t + 1 < steps else u["bootstrap"][e]
            want = u["rewards"][t, e] + u["discounts"][t, e] * v_next - u["values"][t, e]
            assert adv[t, e] == pytest.approx(want, abs=1e-5)


def test_vtrace_truncates_importance_weights() -> None:
    """A behaviour action the target policy likes far more (pi/mu = e^3) counts with weight
    rho_bar, not 20: the target moves only by rho_bar * delta."""
    log_rhos = np.array([[3.0]])
    vs, adv = vtrace(log_rhos, np.array([[0.0]]), np.array([[1.0]]), np.array([[0.0]]), [0.0])
    assert vs[0, 0] == pytest.approx(1.0)
    assert adv[0, 0] == pytest.approx(1.0)
    vs, _ = vtrace(
        log_rhos, np.array([[0.0]]), np.array([[1.0]]), np.array([[0.0]]), [0.0], rho_bar=0.5
    )
    assert vs[0, 0] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------
# The agent

CARTPOLE = EnvInfo(
    "cartpole-like",
    SpaceInfo("box", (4,), "float32", low=(-5.0,) * 4, high=(5.0,) * 4),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=3,
)
FRAMES = EnvInfo(
    "atari-like",
    SpaceInfo("box", (4, 84, 84), "uint8", low=(0.0,) * 4 * 84 * 84, high=(255.0,) * 4 * 84 * 84),
    SpaceInfo("discrete", (), "int64", n=6),
    num_envs=2,
)


def test_truncated_steps_bootstrap_and_terminated_ones_do_not(torch_backend: Any) -> None:
    config = IMPALAConfig(rollout_len=2, gamma=0.9)
    agent = make_agent(CARTPOLE, torch_backend, config, seed=0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 4)).astype(np.float32)
    final = rng.normal(size=(3, 4)).astype(np.float32)
    actions, extras = agent.sample(obs)
    rewards = np.array([1.0, 1.0, 1.0])
    terminated = np.array([True, False, False])
    truncated = np.array([False, True, False])
    agent.observe(Transition(obs, actions, rewards, final, terminated, truncated, extras))
    v_final = agent.algorithm.values(final)
    buf = agent.buffer
    assert buf.rewards[0, 0] == pytest.approx(1.0)  # terminated: no bootstrap
    assert buf.rewards[0, 1] == pytest.approx(1.0 + 0.9 * v_final[1], rel=1e-5)  # truncated
    assert buf.rewards[0, 2] == pytest.approx(1.0)  # going on: bootstrapped by V-trace itself
    np.testing.assert_array_equal(buf.dones[0], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(buf.log_probs[0], extras["log_prob"])


def test_serial_behaviour_and_target_policy_coincide(torch_backend: Any) -> None:
    """Without actors the rollout comes from the weights being trained: rho = 1 at the first
    gradient step (up to float error between numpy acting and the framework's forward)."""
    config = IMPALAConfig(rollout_len=4)
    agent = make_agent(CARTPOLE, torch_backend, config, seed=0, total_steps=1000)
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(3, 4)).astype(np.float32)
    for _ in range(4):
        actions, extras = agent.sample(obs)
        next_obs = rng.normal(size=(3, 4)).astype(np.float32)
        done = np.zeros(3, bool)
        agent.observe(Transition(obs, actions, np.ones(3), next_obs, done, done, extras))
        obs = next_obs
    metrics = agent.learn()
    assert metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["vtrace/rho_clipped"] == 0.0
    assert agent.updates == 1


def test_image_observations_use_the_cnn_and_conform(harness_backend: Any) -> None:
    spec = collect_registry(make_plugin_manager()).algorithms.get("impala")
    check_algorithm(spec, harness_backend, FRAMES, steps=200)
    agent = make_agent(FRAMES, harness_backend, IMPALAConfig(cnn="shallow"), seed=0)
    names = list(agent.weights())
    assert any(name.startswith("trunk.") for name in names), names
    frames = np.random.default_rng(0).integers(0, 256, (5, 4, 84, 84), dtype=np.uint8)
    actions = agent.predict(frames)
    assert actions.shape == (5,) and ((actions >= 0) & (actions < 6)).all()


# ------------------------------------------------------------------------------------------
# Learning checks


def train_and_reevaluate(overrides: list[str], seed: int, out: Path) -> tuple[float, Path]:
    from harness.runtime import train

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    base = [f"seed={seed}", f"out='{out}'", "trackers=['csv']", "progress=false"]
    config = resolve(layer(PACK, [IMPALA], base + overrides, environ={}), registry)
    result = train(config, registry, pm)
    assert result.steps <= config.run.total_steps + config.run.num_envs * config.algo.rollout_len
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_000 + seed)
    assert len(fresh.returns) == 20
    return fresh.mean, result.run_dir


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(fh)]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_impala_on_a_two_actor_farm_solves_cartpole(
    seed: int, harness_backend_name: str, tmp_path: Path
) -> None:
    overrides = ["actors=2", f"backend='{harness_backend_name}'"]
    mean, run_dir = train_and_reevaluate(overrides, seed, tmp_path)
    assert mean >= THRESHOLD, f"IMPALA seed {seed}: fresh 20-episode mean {mean:.1f}"
    rows = [r for r in read_metrics(run_dir) if "farm/actors" in r]
    assert rows, "no farm metrics: the run did not use the actor farm"
    assert all(r["farm/actors"] == 2.0 for r in rows)
    lags = [r["farm/policy_lag"] for r in rows]
    # actors ran ahead of the learner (max_policy_lag = 4): V-trace had stale data to correct
    assert max(lags) > 0.0 and max(r["farm/policy_lag_max"] for r in rows) <= 4.0
    assert all("vtrace/rho_mean" in r for r in rows)


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_impala_serial_solves_cartpole(seed: int, tmp_path: Path) -> None:
    mean, run_dir = train_and_reevaluate(["actors=0"], seed, tmp_path)
    assert mean >= THRESHOLD, f"IMPALA (serial) seed {seed}: fresh 20-episode mean {mean:.1f}"
    assert not any("farm/actors" in r for r in read_metrics(run_dir))


def test_int8_acting_records_its_own_log_probs_for_v_trace() -> None:
    """With ``[backend] int8_acting`` the behaviour log-probabilities are the int8 policy's:
    the learner, scoring in float32, sees importance weights near 1 but not exactly 1, which
    V-trace corrects like policy lag."""
    pytest.importorskip("torch")
    from harness_torch.plugin import TorchConfig, load

    backend = load(TorchConfig(device="cpu", threads=1, int8_acting=True))
    agent = make_agent(FRAMES, backend, IMPALAConfig(rollout_len=3, cnn="shallow"), seed=0)
    rng = np.random.default_rng(2)
    obs = rng.integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    for _ in range(3):
        actions, extras = agent.sample(obs)
        next_obs = rng.integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
        done = np.zeros(2, bool)
        agent.observe(Transition(obs, actions, np.ones(2), next_obs, done, done, extras))
        obs = next_obs
    rho_mean = agent.learn()["vtrace/rho_mean"]
    assert rho_mean == pytest.approx(1.0, abs=0.05)
    assert abs(rho_mean - 1.0) > 1e-6  # float32 scoring of int8 behaviour is not exact
