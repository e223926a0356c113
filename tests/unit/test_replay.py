"""Tests for harness.data.replay.ReplayMemory: ring buffer, sampling and checkpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.data import PrioritizedReplay, ReplayBatch, ReplayMemory

# (obs_shape, obs_dtype, action_shape, action_dtype): discrete CartPole-like, Atari-like uint8
# frames, continuous actions, scalar observations.
LAYOUTS = [
    pytest.param((4,), np.float32, (), np.int64, id="vector-obs-discrete"),
    pytest.param((4, 84, 84), np.uint8, (), np.int64, id="uint8-frames"),
    pytest.param((3,), np.float64, (3,), np.float32, id="continuous-actions"),
    pytest.param((), np.float32, (2,), np.float32, id="scalar-obs"),
]


def transition(
    i: int,
    obs_shape: tuple[int, ...],
    obs_dtype: Any,
    action_shape: tuple[int, ...],
    action_dtype: Any,
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, bool]:
    """Transition number ``i``: every field encodes ``i`` so rows can be identified."""
    obs = np.full(obs_shape, i % 200, dtype=obs_dtype)
    next_obs = np.full(obs_shape, i % 200 + 1, dtype=obs_dtype)
    action = np.full(action_shape, i, dtype=action_dtype)
    return obs, action, float(i), next_obs, i % 3 == 0


def batch_of(ids: list[int], *layout: Any) -> tuple[np.ndarray, ...]:
    rows = [transition(i, *layout) for i in ids]
    return (
        np.stack([r[0] for r in rows]),
        np.stack([r[1] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.float32),
        np.stack([r[3] for r in rows]),
        np.array([r[4] for r in rows], dtype=np.float32),
    )


def make(capacity: int, layout: tuple[Any, ...], seed: int = 0) -> ReplayMemory:
    obs_shape, obs_dtype, action_shape, action_dtype = layout
    return ReplayMemory(
        capacity,
        obs_shape,
        action_shape,
        obs_dtype=obs_dtype,
        action_dtype=action_dtype,
        seed=seed,
    )


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def assert_same_batch(a: ReplayBatch, b: ReplayBatch) -> None:
    for name, x, y in zip(a._fields, a, b, strict=True):
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


# --------------------------------------------------------------------------- ring buffer
@pytest.mark.parametrize(("obs_shape", "obs_dtype", "action_shape", "action_dtype"), LAYOUTS)
def test_single_adds_wrap_around(
    obs_shape: tuple[int, ...], obs_dtype: Any, action_shape: tuple[int, ...], action_dtype: Any
) -> None:
    layout = (obs_shape, obs_dtype, action_shape, action_dtype)
    capacity = 5
    mem = make(capacity, layout)
    for i in range(12):
        mem.add(*transition(i, *layout))
        assert len(mem) == min(i + 1, capacity)
    state = mem.state_dict()
    assert int(state["pos"]) == 12 % capacity
    # Slot i % capacity holds transition i for the newest `capacity` transitions.
    for i in range(12 - capacity, 12):
        obs, action, reward, next_obs, done = transition(i, *layout)
        slot = i % capacity
        np.testing.assert_array_equal(state["obs"][slot], obs)
        np.testing.assert_array_equal(state["next_obs"][slot], next_obs)
        np.testing.assert_array_equal(state["actions"][slot], action)
        assert state["rewards"][slot] == reward
        assert state["dones"][slot] == float(done)
    assert state["obs"].dtype == np.dtype(obs_dtype)
    assert state["actions"].dtype == np.dtype(action_dtype)


@pytest.mark.parametrize(("obs_shape", "obs_dtype", "action_shape", "action_dtype"), LAYOUTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_adds_match_sequential_adds(
    obs_shape: tuple[int, ...],
    obs_dtype: Any,
    action_shape: tuple[int, ...],
    action_dtype: Any,
    seed: int,
) -> None:
    """Batches of random sizes (including wrapping ones and ones > capacity) == one-by-one."""
    layout = (obs_shape, obs_dtype, action_shape, action_dtype)
    rng = np.random.default_rng(seed)
    capacity = 7
    batched, sequential = make(capacity, layout), make(capacity, layout)
    next_id = 0
    for _ in range(12):
        n = int(rng.integers(0, 2 * capacity + 2))
        ids = list(range(next_id, next_id + n))
        next_id += n
        if n:
            batched.add(*batch_of(ids, *layout))
        else:  # an empty batch is a no-op
            empty = batch_of([0], *layout)
            batched.add(*(x[:0] for x in empty))
        for i in ids:
            sequential.add(*transition(i, *layout))
        assert len(batched) == len(sequential)
        assert_same_state(batched.state_dict(), sequential.state_dict())


def test_batch_add_that_wraps_uses_both_ends() -> None:
    layout = ((2,), np.float32, (), np.int64)
    mem = make(6, layout)
    mem.add(*batch_of([0, 1, 2, 3], *layout))
    mem.add(*batch_of([4, 5, 6, 7], *layout))  # slots 4, 5 then 0, 1
    state = mem.state_dict()
    np.testing.assert_array_equal(state["rewards"], [6, 7, 2, 3, 4, 5])
    assert int(state["pos"]) == 2
    assert len(mem) == 6


def test_batch_larger_than_capacity_keeps_newest() -> None:
    layout = ((2,), np.float32, (), np.int64)
    mem = make(4, layout)
    mem.add(*batch_of([0], *layout))
    mem.add(*batch_of(list(range(1, 11)), *layout))  # 10 rows into capacity 4
    state = mem.state_dict()
    # Sequential adds 0..10 leave 7..10 at slots 3, 0, 1, 2 and pos 11 % 4 == 3.
    np.testing.assert_array_equal(state["rewards"], [8, 9, 10, 7])
    assert int(state["pos"]) == 3


def test_capacity_one() -> None:
    layout = ((3,), np.float32, (), np.int64)
    mem = make(1, layout)
    for i in range(3):
        mem.add(*transition(i, *layout))
        assert len(mem) == 1
    mem.add(*batch_of([3, 4], *layout))
    assert len(mem) == 1
    batch = mem.sample(8)
    np.testing.assert_array_equal(batch.rewards, np.full(8, 4.0, dtype=np.float32))
    np.testing.assert_array_equal(batch.indices, np.zeros(8, dtype=np.int64))
    assert mem.capacity == 1


def test_sample_on_empty_raises() -> None:
    mem = make(10, ((4,), np.float32, (), np.int64))
    with pytest.raises(ValueError, match="empty"):
        mem.sample(4)


def test_invalid_arguments() -> None:
    layout = ((4,), np.float32, (), np.int64)
    with pytest.raises(ValueError, match="capacity"):
        make(0, layout)
    mem = make(10, layout)
    obs, action, reward, next_obs, done = transition(0, *layout)
    with pytest.raises(ValueError, match="obs"):
        mem.add(np.zeros(5, np.float32), action, reward, next_obs, done)
    with pytest.raises(ValueError, match="obs"):
        mem.add(np.zeros((2, 2, 4), np.float32), action, reward, next_obs, done)
    with pytest.raises(ValueError, match="next_obs"):
        mem.add(obs, action, reward, np.zeros(3, np.float32), done)
    b_obs, b_act, b_rew, b_next, b_done = batch_of([0, 1, 2], *layout)
    with pytest.raises(ValueError, match="reward"):
        mem.add(b_obs, b_act, b_rew[:2], b_next, b_done)
    with pytest.raises(ValueError, match="done"):
        mem.add(b_obs, b_act, b_rew, b_next, b_done[:1])
    with pytest.raises(ValueError, match="action"):
        mem.add(b_obs, b_act[:, None], b_rew, b_next, b_done)
    assert len(mem) == 0  # nothing was written by the failed calls
    mem.add(obs, action, reward, next_obs, done)
    with pytest.raises(ValueError, match="batch_size"):
        mem.sample(0)


@pytest.mark.parametrize(("obs_shape", "obs_dtype", "action_shape", "action_dtype"), LAYOUTS)
def test_samples_contain_only_written_rows(
    obs_shape: tuple[int, ...], obs_dtype: Any, action_shape: tuple[int, ...], action_dtype: Any
) -> None:
    layout = (obs_shape, obs_dtype, action_shape, action_dtype)
    capacity = 10
    mem = make(capacity, layout, seed=3)
    for i in range(4):
        mem.add(*transition(i, *layout))
    batch = mem.sample(500)
    assert set(batch.indices.tolist()) == {0, 1, 2, 3}  # never an unwritten slot
    for i in range(4, 25):
        mem.add(*transition(i, *layout))
    batch = mem.sample(2000)
    assert batch.obs.shape == (2000, *obs_shape)
    assert batch.actions.shape == (2000, *action_shape)
    assert batch.obs.dtype == np.dtype(obs_dtype)
    assert batch.actions.dtype == np.dtype(action_dtype)
    for name in ("rewards", "dones", "weights"):
        arr = getattr(batch, name)
        assert arr.shape == (2000,) and arr.dtype == np.float32, name
    assert batch.indices.dtype == np.int64
    np.testing.assert_array_equal(batch.weights, 1.0)
    # Only the newest 10 transitions (15..24) are present, each at slot id % capacity, and all
    # fields of a sampled row come from the same transition.
    ids = batch.rewards.astype(np.int64)
    assert set(ids.tolist()) == set(range(15, 25))
    np.testing.assert_array_equal(ids % capacity, batch.indices)
    obs_ids = batch.obs.reshape(2000, -1)[:, 0] if obs_shape else batch.obs
    np.testing.assert_array_equal(obs_ids, (ids % 200).astype(obs_dtype))
    next_ids = batch.next_obs.reshape(2000, -1)[:, 0] if obs_shape else batch.next_obs
    np.testing.assert_array_equal(next_ids, (ids % 200 + 1).astype(obs_dtype))
    act_ids = batch.actions.reshape(2000, -1)[:, 0] if action_shape else batch.actions
    np.testing.assert_array_equal(act_ids, ids.astype(action_dtype))
    np.testing.assert_array_equal(batch.dones, (ids % 3 == 0).astype(np.float32))


def test_sampling_is_uniform() -> None:
    """Chi-square check of the slot frequencies (fixed seed, 10 slots, 200k draws)."""
    layout = ((1,), np.float32, (), np.int64)
    mem = make(10, layout, seed=7)
    mem.add(*batch_of(list(range(10)), *layout))
    draws = np.concatenate([mem.sample(1000).indices for _ in range(200)])
    counts = np.bincount(draws, minlength=10)
    expected = draws.size / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30.0  # df = 9: p(chi2 > 30) ~ 4e-4 for a uniform sampler


def test_same_seed_same_samples_different_seed_different() -> None:
    layout = ((2,), np.float32, (), np.int64)
    a, b, c = make(50, layout, seed=1), make(50, layout, seed=1), make(50, layout, seed=2)
    for mem in (a, b, c):
        mem.add(*batch_of(list(range(50)), *layout))
    assert_same_batch(a.sample(32), b.sample(32))
    assert not np.array_equal(a.sample(32).indices, c.sample(32).indices)


# ----------------------------------------------------------------------- checkpointing
def filled(seed: int = 0) -> ReplayMemory:
    layout = ((3, 2), np.float32, (2,), np.float32)
    mem = make(20, layout, seed=seed)
    mem.add(*batch_of(list(range(13)), *layout))
    for i in range(13, 37):  # wraps
        mem.add(*transition(i, *layout))
    mem.sample(5)  # advance the RNG past its initial state
    return mem


@pytest.mark.parametrize("as_pathlib", [False, True])
def test_save_load_round_trip_is_exact(tmp_path: Path, as_pathlib: bool) -> None:
    mem = filled()
    path = tmp_path / "replay.npz"
    mem.save(path if as_pathlib else str(path))
    loaded = ReplayMemory.load(path if as_pathlib else str(path))
    assert type(loaded) is ReplayMemory
    assert len(loaded) == len(mem) and loaded.capacity == mem.capacity
    assert loaded.obs_shape == mem.obs_shape and loaded.action_shape == mem.action_shape
    assert loaded.obs_dtype == mem.obs_dtype and loaded.action_dtype == mem.action_dtype
    assert_same_state(loaded.state_dict(), mem.state_dict())
    # The resumed buffer draws exactly what the original draws next, also after more adds.
    assert_same_batch(loaded.sample(16), mem.sample(16))
    extra = transition(99, (3, 2), np.float32, (2,), np.float32)
    loaded.add(*extra)
    mem.add(*extra)
    assert_same_batch(loaded.sample(16), mem.sample(16))


def test_save_uses_exact_path_and_leaves_no_temp_files(tmp_path: Path) -> None:
    mem = filled()
    path = tmp_path / "checkpoint.replay"  # no .npz suffix: must not be appended
    mem.save(path)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.replay"]
    assert ReplayMemory.load(path).state_dict()["size"] == len(mem)


def test_state_dict_round_trip_into_fresh_buffer() -> None:
    mem = filled(seed=0)
    other = make(20, ((3, 2), np.float32, (2,), np.float32), seed=123)
    other.load_state_dict(mem.state_dict())
    assert_same_batch(other.sample(8), mem.sample(8))


def test_state_dict_is_a_snapshot() -> None:
    mem = filled()
    state = mem.state_dict()
    before = {k: v.copy() for k, v in state.items()}
    for i in range(100, 130):
        mem.add(*transition(i, (3, 2), np.float32, (2,), np.float32))
    mem.sample(4)
    assert_same_state(state, before)


def test_partially_filled_checkpoint_stores_only_written_rows(tmp_path: Path) -> None:
    layout = ((84, 84), np.uint8, (), np.int64)
    mem = make(1000, layout)
    mem.add(*batch_of([1, 2, 3], *layout))
    mem.save(tmp_path / "small.npz")
    assert os.path.getsize(tmp_path / "small.npz") < 100_000  # not 2 * 1000 * 84 * 84 bytes
    loaded = ReplayMemory.load(tmp_path / "small.npz")
    assert loaded.capacity == 1000 and len(loaded) == 3
    assert_same_batch(loaded.sample(10), mem.sample(10))


def test_empty_buffer_round_trip(tmp_path: Path) -> None:
    mem = make(8, ((2,), np.float32, (), np.int64), seed=5)
    mem.save(tmp_path / "empty.npz")
    loaded = ReplayMemory.load(tmp_path / "empty.npz")
    assert len(loaded) == 0
    with pytest.raises(ValueError, match="empty"):
        loaded.sample(1)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("obs", lambda v: v.astype(np.float64)),
        ("obs", lambda v: v[:, :, :1]),
        ("next_obs", lambda v: v[:-1]),
        ("actions", lambda v: v.astype(np.int64)),
        ("rewards", lambda v: v.astype(np.float64)),
        ("dones", lambda v: v[:3]),
        ("capacity", lambda v: np.array(21)),
        ("size", lambda v: np.array(25)),
        ("pos", lambda v: np.array(-1)),
        ("kind", lambda v: np.array("PrioritizedReplay")),
        ("format", lambda v: np.array("something-else")),
        ("rng_state", lambda v: np.array("{not json")),
    ],
)
def test_load_state_dict_names_mismatching_field(field: str, change: Any) -> None:
    mem = filled()
    state = mem.state_dict()
    state[field] = change(state[field])
    fresh = make(20, ((3, 2), np.float32, (2,), np.float32))
    with pytest.raises(ValueError, match=repr(field)):
        fresh.load_state_dict(state)
    assert len(fresh) == 0  # validation happens before anything is applied


def test_load_state_dict_missing_field() -> None:
    state = filled().state_dict()
    del state["dones"]
    with pytest.raises(ValueError, match="'dones'"):
        make(20, ((3, 2), np.float32, (2,), np.float32)).load_state_dict(state)


def test_failed_save_leaves_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "replay.npz"
    old = filled(seed=0)
    old.save(path)
    newer = filled(seed=1)
    for i in range(200, 210):
        newer.add(*transition(i, (3, 2), np.float32, (2,), np.float32))

    real_savez = np.savez

    def exploding_savez(file: Any, *args: Any, **kwargs: Any) -> None:
        real_savez(file, *args, **kwargs)  # write a complete archive first ...
        file.write(b"garbage")  # ... then corrupt it and die mid-way
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", exploding_savez)
    with pytest.raises(OSError, match="disk full"):
        newer.save(path)
    monkeypatch.undo()

    assert sorted(os.listdir(tmp_path)) == ["replay.npz"]  # temp file cleaned up
    assert_same_state(ReplayMemory.load(path).state_dict(), old.state_dict())


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ReplayMemory.load(tmp_path / "missing.npz")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a replay file"):
        ReplayMemory.load(text)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    with pytest.raises(ValueError, match="not a replay file"):
        ReplayMemory.load(other)
    npy = tmp_path / "array.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(ValueError, match="not a replay file"):
        ReplayMemory.load(npy)


def test_prioritized_file_is_not_loaded_as_uniform(tmp_path: Path) -> None:
    per = PrioritizedReplay(4, (2,), seed=0)
    per.add(
        np.zeros((2, 2), np.float32), np.zeros(2, np.int64), np.zeros(2), np.zeros((2, 2)), [0, 0]
    )
    per.save(tmp_path / "per.npz")
    with pytest.raises(ValueError, match="'kind'"):
        ReplayMemory.load(tmp_path / "per.npz")


# ------------------------------------------------------------- large-batch recycling
def big_memory() -> ReplayMemory:
    """Observations large enough (256 rows * 4 KiB = 1 MiB) for recycled output arrays."""
    layout = ((4, 32, 32), np.uint8, (), np.int64)
    mem = make(300, layout, seed=0)
    mem.add(*batch_of(list(range(300)), *layout))
    return mem


def check_rows(mem: ReplayMemory, batch: ReplayBatch) -> None:
    ids = batch.rewards.astype(np.int64)
    np.testing.assert_array_equal(ids, batch.indices)
    np.testing.assert_array_equal(batch.obs[:, 0, 0, 0], (ids % 200).astype(np.uint8))
    np.testing.assert_array_equal(batch.next_obs[:, 0, 0, 0], (ids % 200 + 1).astype(np.uint8))
    assert np.all(batch.obs == batch.obs[:, :1, :1, :1])  # whole rows, not just corners


def test_large_batches_are_never_overwritten_while_referenced() -> None:
    mem = big_memory()
    kept = [mem.sample(256) for _ in range(6)]  # all alive at once: no reuse possible
    copies = [(b.obs.copy(), b.next_obs.copy()) for b in kept]
    view = kept[0].obs[:10]
    memview = memoryview(kept[1].next_obs)
    first_view = view.copy()
    first_memview = np.asarray(memview).copy()
    del kept[:2]  # only the view / memoryview keep those two alive now
    for _ in range(10):
        check_rows(mem, mem.sample(256))
    for batch, (obs, next_obs) in zip(kept, copies[2:], strict=True):
        np.testing.assert_array_equal(batch.obs, obs)
        np.testing.assert_array_equal(batch.next_obs, next_obs)
    np.testing.assert_array_equal(view, first_view)
    np.testing.assert_array_equal(np.asarray(memview), first_memview)
    ids = {id(b.obs) for b in kept}
    assert len(ids) == len(kept)


def test_large_batch_memory_is_reused_once_released() -> None:
    mem = big_memory()
    batch = mem.sample(256)
    address = batch.obs.ctypes.data
    del batch
    again = mem.sample(256)
    assert again.obs.ctypes.data == address  # recycled, not freshly allocated
    check_rows(mem, again)
    # The usual loop `batch = sample()` keeps the previous batch alive during the call:
    previous = again
    for _ in range(5):
        current = mem.sample(256)
        assert not np.shares_memory(current.obs, previous.obs)
        check_rows(mem, current)
        check_rows(mem, previous)
        previous = current


def test_large_batch_converted_to_torch_is_not_overwritten() -> None:
    """torch.as_tensor shares memory with the batch; the tensor alone must keep it safe."""
    torch = pytest.importorskip("torch")
    mem = big_memory()
    batch = mem.sample(256)
    tensor = torch.as_tensor(batch.obs)
    expected = batch.obs.copy()
    del batch
    for _ in range(5):
        mem.sample(256)
    np.testing.assert_array_equal(tensor.numpy(), expected)
