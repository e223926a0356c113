"""Tests for harness.data.prioritized: SumTree against brute force, and PrioritizedReplay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.data import PrioritizedReplay, ReplayMemory, SumTree

# Capacities around powers of two, and larger than the 2**10 nodes that find() resolves with
# a cumulative sum, so that both the top step and the per-level descent are exercised.
CAPACITIES = [1, 2, 3, 5, 8, 31, 100, 1024, 1500, 5000]


def assert_tree_consistent(tree: SumTree, reference: np.ndarray) -> None:
    """Leaves equal the reference and every internal node is exactly left + right."""
    np.testing.assert_array_equal(tree.leaves(), reference)
    np.testing.assert_array_equal(tree[np.arange(tree.capacity)], reference)
    raw = tree._tree
    base = len(raw) // 2
    assert np.all(raw[base + tree.capacity :] == 0.0)  # padding leaves stay empty
    internal = np.arange(1, base)
    np.testing.assert_array_equal(raw[internal], raw[2 * internal] + raw[2 * internal + 1])
    assert tree.total == pytest.approx(float(reference.sum()), rel=1e-12, abs=0.0)


def brute_force_find(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(reference), values, side="right")


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sum_tree_matches_brute_force(capacity: int, seed: int) -> None:
    """Random batched updates (with duplicate indices) then totals and find vs cumsum."""
    rng = np.random.default_rng(seed)
    tree = SumTree(capacity)
    reference = np.zeros(capacity)
    for _ in range(8):
        n = int(rng.integers(1, 3 * capacity + 2))
        indices = rng.integers(0, capacity, size=n)  # duplicates are likely
        # Small integers keep every sum exact, so find() must agree with searchsorted exactly;
        # zeros create empty leaves that must never be returned.
        priorities = rng.integers(0, 6, size=n).astype(np.float64)
        tree.update(indices, priorities)
        for i, p in zip(indices, priorities, strict=True):  # sequential semantics: last wins
            reference[i] = p
        assert_tree_consistent(tree, reference)
        if reference.sum() == 0:
            continue
        total = reference.sum()
        boundaries = np.cumsum(reference)
        boundaries = boundaries[boundaries < total]  # exact prefix-sum boundaries inside range
        values = np.concatenate([rng.random(300) * total, boundaries, [0.0]])
        found = tree.find(values)
        np.testing.assert_array_equal(found, brute_force_find(reference, values))
        assert np.all(reference[found] > 0)


@pytest.mark.parametrize("capacity", [7, 1024, 3000])
def test_sum_tree_float_priorities(capacity: int) -> None:
    """With arbitrary floats, every found leaf's prefix-sum interval contains the value."""
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    reference = rng.random(capacity) ** 3
    reference[rng.random(capacity) < 0.2] = 0.0
    tree.update(np.arange(capacity), reference)
    assert_tree_consistent(tree, reference)
    values = rng.random(5000) * tree.total
    found = tree.find(values)
    cumulative = np.cumsum(reference)
    lower = np.where(found > 0, cumulative[found - 1], 0.0)
    tol = 1e-9 * tree.total
    assert np.all(lower <= values + tol) and np.all(values < cumulative[found] + tol)
    assert np.all(reference[found] > 0)


def test_find_never_returns_empty_leaves_even_at_or_beyond_total() -> None:
    tree = SumTree(10)
    tree.update(np.array([1, 4, 6]), np.array([0.1, 0.2, 0.3]))  # slots 7..9 stay empty
    total = tree.total
    edge = np.array([total, np.nextafter(total, 0.0), total * 2, 0.0, 1e-300])
    found = tree.find(edge)
    assert np.all(np.isin(found, [1, 4, 6]))
    np.testing.assert_array_equal(found[:3], [6, 6, 6])


def test_sum_tree_duplicates_last_write_wins() -> None:
    tree = SumTree(8)
    tree.update(np.array([3, 5, 3, 3]), np.array([1.0, 2.0, 7.0, 4.0]))
    assert tree[3] == 4.0 and tree[5] == 2.0
    assert tree.total == 6.0
    assert tree.max_priority == 7.0  # the largest value written, even if overwritten


def test_sum_tree_single_and_range_updates_match_batch_updates() -> None:
    rng = np.random.default_rng(0)
    capacity = 37
    a, b = SumTree(capacity), SumTree(capacity)
    for start, count in [(0, 5), (30, 10), (36, 1), (3, 37), (10, 0), (20, 20)]:
        value = float(rng.integers(1, 9))
        a.fill_range(start, count, value)
        b.update((start + np.arange(count)) % capacity, np.full(count, value))
        np.testing.assert_array_equal(a._tree, b._tree)
    for index in rng.integers(0, capacity, size=20):
        value = float(rng.integers(0, 9))
        a.update(np.array([index]), np.array([value]))
        b.update(np.array([index, index]), np.array([99.0, value]))
        np.testing.assert_array_equal(a._tree, b._tree)


def test_set_leaves_rebuild_equals_incremental() -> None:
    rng = np.random.default_rng(4)
    incremental, rebuilt = SumTree(300), SumTree(300)
    for _ in range(20):
        incremental.update(rng.integers(0, 300, size=17), rng.random(17))
    rebuilt.set_leaves(incremental.leaves(), incremental.max_priority)
    np.testing.assert_array_equal(rebuilt._tree, incremental._tree)
    assert rebuilt.max_priority == incremental.max_priority


def test_sum_tree_rejects_bad_input() -> None:
    tree = SumTree(4)
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0, 1]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(TypeError):
        tree.update(np.array([0.5]), np.array([1.0]))
    with pytest.raises(ValueError, match="total"):
        tree.find(np.array([0.0]))
    with pytest.raises(ValueError):
        SumTree(0)
    assert tree.total == 0.0  # rejected updates changed nothing


# ------------------------------------------------------------------ PrioritizedReplay
def per_with(priorities: np.ndarray, *, alpha: float = 0.6, beta: float = 0.4, seed: int = 0):
    n = len(priorities)
    per = PrioritizedReplay(n, (2,), alpha=alpha, beta=beta, seed=seed)
    obs = np.repeat(np.arange(n, dtype=np.float32)[:, None], 2, axis=1)
    per.add(obs, np.arange(n), np.arange(n, dtype=np.float32), obs + 1, np.zeros(n))
    per.update_priorities(np.arange(n), priorities)
    return per


def test_sampling_frequencies_follow_priorities() -> None:
    """Empirical frequencies match (|td| + eps)^alpha / sum: chi-square bound, fixed seed."""
    rng = np.random.default_rng(11)
    td = rng.exponential(size=50)
    td[3] = 0.0  # still sampled, thanks to eps
    per = per_with(td, alpha=0.6, seed=1)
    draws = np.concatenate([per.sample(256).indices for _ in range(400)])
    p = (td + per.eps) ** per.alpha
    expected = p / p.sum() * draws.size
    counts = np.bincount(draws, minlength=50)
    assert counts.sum() == draws.size
    # Only leaves with enough expected mass enter the statistic (classic chi-square rule).
    mask = expected >= 5
    chi2 = float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())
    dof = int(mask.sum()) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof)  # a far tail bound for chi2(dof)
    # Ignoring alpha (proportional to |td|) would be rejected by the same statistic.
    wrong = td / td.sum() * draws.size
    wrong_mask = wrong >= 5  # excludes td == 0
    diff = counts[wrong_mask] - wrong[wrong_mask]
    chi2_wrong = float((diff**2 / wrong[wrong_mask]).sum())
    assert chi2_wrong > 10 * chi2


def test_importance_weights_match_formula() -> None:
    rng = np.random.default_rng(2)
    td = rng.random(40) * 3
    per = per_with(td, alpha=0.7, beta=0.5)
    for beta in (0.5, 1.0, 0.0):
        per.beta = beta
        batch = per.sample(64)
        p = (td + per.eps) ** per.alpha
        probs = p[batch.indices] / p.sum()
        expected = (len(per) * probs) ** -beta
        expected /= expected.max()
        assert batch.weights.dtype == np.float32
        np.testing.assert_allclose(batch.weights, expected, rtol=1e-5)
        assert batch.weights.max() == pytest.approx(1.0)


def test_stratified_sampling_takes_one_sample_per_segment() -> None:
    per = PrioritizedReplay(64, (1,), seed=3)
    per.add(
        np.zeros((64, 1)), np.zeros(64, np.int64), np.zeros(64), np.zeros((64, 1)), np.zeros(64)
    )
    # All priorities equal (the initial max): segment k covers exactly leaf k.
    np.testing.assert_array_equal(per.sample(64).indices, np.arange(64))
    np.testing.assert_array_equal(per.sample(64).weights, 1.0)


def test_only_filled_slots_are_sampled() -> None:
    per = PrioritizedReplay(100, (2,), seed=0)
    for i in range(10):
        per.add(np.full(2, i, np.float32), i, float(i), np.full(2, i + 1, np.float32), False)
    batch = per.sample(1000)
    assert batch.indices.max() < 10
    np.testing.assert_array_equal(batch.rewards, batch.indices.astype(np.float32))


def test_new_transitions_get_max_priority() -> None:
    per = per_with(np.array([0.5, 0.1, 0.2, 0.3]), alpha=0.5)
    per.update_priorities(np.array([1]), np.array([9.0]))
    top = (9.0 + per.eps) ** 0.5
    assert per.tree.max_priority == pytest.approx(top)
    per.update_priorities(np.array([1]), np.array([0.0]))  # max stays the historical max
    per.add(np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False)  # slot 0
    per.add(np.zeros((2, 2), np.float32), [0, 0], [0, 0], np.zeros((2, 2)), [0, 0])  # 1, 2
    np.testing.assert_allclose(per.tree[np.array([0, 1, 2])], top)
    assert per.tree[3] == pytest.approx((0.3 + per.eps) ** 0.5)


def test_batch_add_that_wraps_sets_priorities_on_both_ends() -> None:
    per = PrioritizedReplay(6, (1,), seed=0)
    per.add(np.zeros((4, 1)), np.zeros(4, np.int64), np.zeros(4), np.zeros((4, 1)), np.zeros(4))
    per.update_priorities(np.arange(4), np.full(4, 0.0))
    low = (0.0 + per.eps) ** per.alpha
    per.add(np.zeros((4, 1)), np.zeros(4, np.int64), np.zeros(4), np.zeros((4, 1)), np.zeros(4))
    np.testing.assert_allclose(per.tree.leaves(), [1.0, 1.0, low, low, 1.0, 1.0])
    assert per.tree.total == pytest.approx(4.0 + 2 * low)


def test_update_priorities_validation() -> None:
    per = per_with(np.ones(5))
    before = per.tree.leaves()
    with pytest.raises(ValueError, match="NaN"):
        per.update_priorities(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=">= 0"):
        per.update_priorities(np.array([0]), np.array([-0.5]))
    with pytest.raises(ValueError, match="finite"):
        per.update_priorities(np.array([0]), np.array([np.inf]))
    with pytest.raises(ValueError, match="indices"):
        per.update_priorities(np.array([5]), np.array([1.0]))
    with pytest.raises(ValueError, match="shape"):
        per.update_priorities(np.array([0, 1]), np.array([1.0]))
    np.testing.assert_array_equal(per.tree.leaves(), before)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplay(4, (1,), alpha=-1.0)
    with pytest.raises(ValueError, match="eps"):
        PrioritizedReplay(4, (1,), eps=0.0)
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplay(4, (1,)).sample(2)


def test_save_load_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    per = PrioritizedReplay(30, (3,), alpha=0.7, beta=0.45, eps=1e-4, seed=9)
    for _ in range(7):  # 42 transitions: wraps
        n = 6
        per.add(
            rng.random((n, 3)),
            rng.integers(0, 4, n),
            rng.random(n),
            rng.random((n, 3)),
            rng.random(n) < 0.1,
        )
        batch = per.sample(8)
        per.update_priorities(batch.indices, rng.random(8) * 2)
    per.beta = 0.8  # annealed
    per.save(tmp_path / "per.npz")
    loaded = PrioritizedReplay.load(tmp_path / "per.npz")
    assert isinstance(loaded, PrioritizedReplay)
    assert (loaded.alpha, loaded.beta, loaded.eps) == (0.7, 0.8, 1e-4)
    np.testing.assert_array_equal(loaded.tree._tree, per.tree._tree)
    assert loaded.tree.max_priority == per.tree.max_priority
    for _ in range(3):
        a, b = loaded.sample(16), per.sample(16)
        for name, x, y in zip(a._fields, a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)
        loaded.update_priorities(a.indices, np.arange(16.0))
        per.update_priorities(b.indices, np.arange(16.0))


def test_load_state_dict_rejects_other_alpha_and_bad_leaves() -> None:
    per = per_with(np.ones(5), alpha=0.6)
    state = per.state_dict()
    other = PrioritizedReplay(5, (2,), alpha=0.5)
    with pytest.raises(ValueError, match="'alpha'"):
        other.load_state_dict(state)
    same = PrioritizedReplay(5, (2,), alpha=0.6)
    bad = dict(state, tree_leaves=state["tree_leaves"][:2])
    with pytest.raises(ValueError, match="'tree_leaves'"):
        same.load_state_dict(bad)
    bad = dict(state, tree_leaves=-state["tree_leaves"])
    with pytest.raises(ValueError, match="'tree_leaves'"):
        same.load_state_dict(bad)
    missing = {k: v for k, v in state.items() if k != "max_priority"}
    with pytest.raises(ValueError, match="'max_priority'"):
        same.load_state_dict(missing)
    uniform = ReplayMemory(5, (2,))
    with pytest.raises(ValueError, match="'kind'"):
        uniform.load_state_dict(state)
