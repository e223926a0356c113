"""Tests for harness.data.rollout.RolloutBuffer: GAE and minibatching."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import RolloutBatch, RolloutBuffer


def reference_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_values: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Straightforward per-env, per-step GAE with plain Python floats."""
    steps, envs = rewards.shape
    adv = np.zeros((steps, envs))
    for e in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            next_value = float(last_values[e]) if t == steps - 1 else float(values[t + 1, e])
            if dones[t, e]:
                # Episode ended at t: neither bootstrap nor carry the later advantage back.
                delta = float(rewards[t, e]) - float(values[t, e])
                running = delta
            else:
                delta = float(rewards[t, e]) + gamma * next_value - float(values[t, e])
                running = delta + gamma * lam * running
            adv[t, e] = running
    return adv, adv + values


def fill(
    buf: RolloutBuffer, rng: np.random.Generator, done_prob: float = 0.15
) -> dict[str, np.ndarray]:
    steps, envs = buf.num_steps, buf.num_envs
    data = {
        "obs": rng.standard_normal((steps, envs, *buf.obs_shape)).astype(np.float32),
        "actions": rng.integers(0, 4, size=(steps, envs, *buf.action_shape)),
        "rewards": rng.standard_normal((steps, envs)).astype(np.float32),
        "dones": (rng.random((steps, envs)) < done_prob).astype(np.float32),
        "values": rng.standard_normal((steps, envs)).astype(np.float32),
        "log_probs": -rng.random((steps, envs)).astype(np.float32),
    }
    for t in range(steps):
        assert not buf.full
        buf.add(
            *(data[k][t] for k in ("obs", "actions", "rewards", "dones", "values", "log_probs"))
        )
    assert buf.full
    return data


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0), (1.0, 0.8)])
def test_gae_matches_reference(seed: int, gamma: float, lam: float) -> None:
    rng = np.random.default_rng(seed)
    buf = RolloutBuffer(32, 5, (3,))
    data = fill(buf, rng)
    data["dones"][10, :] = 1.0  # make sure every env has an episode end mid-rollout
    buf.dones[10, :] = 1.0
    last_values = rng.standard_normal(5).astype(np.float32)
    buf.compute_gae(last_values, gamma, lam)
    adv, ret = reference_gae(
        data["rewards"], data["values"], data["dones"], last_values, gamma, lam
    )
    np.testing.assert_allclose(buf.advantages, adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buf.returns, ret, rtol=1e-5, atol=1e-5)
    assert buf.advantages.dtype == np.float32 and buf.returns.dtype == np.float32


def test_gae_hand_computed() -> None:
    """Two steps, one env, episode ends at step 0: A_1 bootstraps, A_0 does not."""
    buf = RolloutBuffer(2, 1, (1,))
    buf.add(np.zeros((1, 1)), [0], [1.0], [1.0], [0.5], [0.0])
    buf.add(np.zeros((1, 1)), [0], [2.0], [0.0], [0.25], [0.0])
    buf.compute_gae(np.array([4.0]), gamma=0.5, gae_lambda=0.5)
    a1 = 2.0 + 0.5 * 4.0 - 0.25  # 3.75
    a0 = 1.0 - 0.5  # done: no bootstrap, no carry
    np.testing.assert_allclose(buf.advantages[:, 0], [a0, a1])
    np.testing.assert_allclose(buf.returns[:, 0], [a0 + 0.5, a1 + 0.25])


def test_gae_lambda_one_is_monte_carlo_return() -> None:
    rng = np.random.default_rng(9)
    buf = RolloutBuffer(20, 2, ())
    data = fill(buf, rng, done_prob=0.0)
    last = np.array([1.5, -2.0], dtype=np.float32)
    buf.compute_gae(last, gamma=0.9, gae_lambda=1.0)
    discounted = np.zeros((20, 2))
    running = last.astype(np.float64)
    for t in reversed(range(20)):
        running = data["rewards"][t] + 0.9 * running
        discounted[t] = running
    np.testing.assert_allclose(buf.returns, discounted, rtol=1e-5, atol=1e-5)


def test_minibatches_cover_every_sample_once_and_stay_aligned() -> None:
    steps, envs = 10, 3
    buf = RolloutBuffer(steps, envs, (2,), (2,), action_dtype=np.float32)
    ids = np.arange(steps * envs, dtype=np.float32).reshape(steps, envs)
    for t in range(steps):
        buf.add(
            np.repeat(ids[t][:, None], 2, axis=1),  # obs identify (t, env)
            np.repeat(ids[t][:, None], 2, axis=1) + 0.5,
            np.zeros(envs),
            np.zeros(envs),
            ids[t] * 2,  # values
            -ids[t],  # log_probs
        )
    buf.compute_gae(np.zeros(envs), gamma=0.99, gae_lambda=0.95)
    batches = list(buf.minibatches(7, np.random.default_rng(0), normalize_advantages=False))
    assert [len(b.obs) for b in batches] == [7, 7, 7, 7, 2]  # 30 samples, last batch smaller
    seen = np.concatenate([b.obs[:, 0] for b in batches])
    np.testing.assert_array_equal(np.sort(seen), np.arange(30))
    assert not np.array_equal(seen, np.arange(30))  # shuffled
    flat_adv = buf.advantages.reshape(-1)
    flat_ret = buf.returns.reshape(-1)
    for b in batches:
        assert isinstance(b, RolloutBatch)
        sample = b.obs[:, 0].astype(np.int64)
        np.testing.assert_array_equal(b.actions[:, 1], b.obs[:, 1] + 0.5)
        np.testing.assert_array_equal(b.values, sample * 2)
        np.testing.assert_array_equal(b.log_probs, -sample)
        np.testing.assert_array_equal(b.advantages, flat_adv[sample])
        np.testing.assert_array_equal(b.returns, flat_ret[sample])


def test_minibatch_order_is_determined_by_rng() -> None:
    buf = RolloutBuffer(8, 2, (1,))
    fill(buf, np.random.default_rng(1))
    buf.compute_gae(np.zeros(2), 0.99, 0.95)
    first = [b.obs.copy() for b in buf.minibatches(4, np.random.default_rng(5))]
    again = [b.obs.copy() for b in buf.minibatches(4, np.random.default_rng(5))]
    other = [b.obs.copy() for b in buf.minibatches(4, np.random.default_rng(6))]
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
    assert not np.array_equal(np.concatenate(first), np.concatenate(other))


def test_advantage_normalisation_per_minibatch() -> None:
    buf = RolloutBuffer(64, 4, (2,))
    fill(buf, np.random.default_rng(3))
    buf.rewards *= 10.0  # make raw advantages far from standardised
    buf.compute_gae(np.ones(4), 0.99, 0.95)
    assert abs(float(buf.advantages.std()) - 1.0) > 0.5
    for b in buf.minibatches(64, np.random.default_rng(0), normalize_advantages=True):
        assert b.advantages.dtype == np.float32
        assert abs(float(b.advantages.mean())) < 1e-5
        assert float(b.advantages.std()) == pytest.approx(1.0, abs=1e-4)
    # The stored advantages are untouched by normalisation.
    raw = list(buf.minibatches(256, np.random.default_rng(0), normalize_advantages=False))
    assert abs(float(raw[0].advantages.std()) - 1.0) > 0.5


def test_single_element_minibatch_normalises_to_zero() -> None:
    buf = RolloutBuffer(1, 1, (1,))
    buf.add(np.zeros((1, 1)), [0], [1.0], [0.0], [0.0], [0.0])
    buf.compute_gae(np.zeros(1), 0.99, 0.95)
    (batch,) = buf.minibatches(1, np.random.default_rng(0))
    assert np.isfinite(batch.advantages).all() and batch.advantages[0] == 0.0


def test_lifecycle_and_validation() -> None:
    buf = RolloutBuffer(2, 3, (4,))
    rng = np.random.default_rng(0)
    with pytest.raises(RuntimeError, match="full rollout"):
        buf.compute_gae(np.zeros(3), 0.99, 0.95)
    with pytest.raises(RuntimeError, match="compute_gae"):
        next(buf.minibatches(2, rng))
    with pytest.raises(ValueError, match="obs"):
        buf.add(np.zeros((2, 4)), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="rewards"):
        buf.add(np.zeros((3, 4)), np.zeros(3), np.zeros(2), np.zeros(3), np.zeros(3), np.zeros(3))
    fill(buf, rng)
    assert len(buf) == 6
    with pytest.raises(RuntimeError, match="full"):
        buf.add(np.zeros((3, 4)), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="last_values"):
        buf.compute_gae(np.zeros(2), 0.99, 0.95)
    buf.compute_gae(np.zeros(3), 0.99, 0.95)
    assert sum(len(b.obs) for b in buf.minibatches(4, rng)) == 6
    buf.reset()
    assert not buf.full and len(buf) == 0
    with pytest.raises(RuntimeError, match="compute_gae"):
        next(buf.minibatches(2, rng))
    fill(buf, rng)
    assert buf.full
    with pytest.raises(ValueError):
        RolloutBuffer(0, 1, (1,))
