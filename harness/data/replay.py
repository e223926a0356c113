"""Uniform experience replay: a preallocated numpy ring buffer.

Design notes (the *why*):

* Storage is preallocated once (``capacity`` rows per field) so that adding a transition is a
  plain slice assignment: no Python lists, no per-step allocation, and the memory footprint is
  ``capacity`` times the row size from the start (the OS commits the pages as rows are first
  written).
* ``add`` accepts one transition or a batch from ``N`` vectorised environments.  A batch is
  written with at most two slice copies (the second only when the write wraps around the end of
  the ring), never with a Python loop over rows.
* Sampling uses the buffer's own :class:`numpy.random.Generator`, whose state is part of
  :meth:`ReplayMemory.state_dict`, so a run resumed from a checkpoint draws exactly the batches
  the uninterrupted run would have drawn.
* Sampling large observations (e.g. image stacks) writes into recycled output arrays that no
  caller references any more, instead of fresh multi-megabyte allocations whose page faults
  cost more than the copy (see :meth:`ReplayMemory._take_recycled`).  Returned batches are
  never modified while anything still references them.
* Checkpoints are plain ``.npz`` files (no pickle, loadable with ``allow_pickle=False``) and are
  written atomically (temporary file in the same directory + :func:`os.replace`): a crash while
  saving leaves the previous checkpoint intact.

This module depends on numpy only, so the core package stays importable without torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Self

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

__all__ = ["ReplayBatch", "ReplayMemory"]

Array = npt.NDArray[Any]

#: Value of the ``format`` entry that marks a state dict / ``.npz`` file as ours.
STATE_FORMAT = "harness.replay"
#: Sampled observation batches at least this large are written into recycled arrays (see
#: ReplayMemory._take_recycled); smaller ones are cheap to allocate.
_RECYCLE_MIN_BYTES = 1 << 20
#: Recycled arrays kept per field.
_POOL_SIZE = 3


def _refcount_of_pooled() -> int:
    """Reference count that sys.getrefcount reports for an array held only by a list.

    Measured rather than hard-coded (2 on CPython 3.11) so the recycling check stays right if
    the interpreter counts differently; _take_recycled's loop variable adds one more.
    """
    pool = [np.empty(1)]
    return sys.getrefcount(pool[0])


_UNUSED_REFCOUNT = _refcount_of_pooled()

#: Bumped when the layout of the state dict changes incompatibly.
STATE_VERSION = 1


class ReplayBatch(NamedTuple):
    """A batch of transitions sampled from a replay memory.

    ``dones`` is 1.0 where the episode *terminated* at that transition (no bootstrapping from
    ``next_obs``); truncation by a time limit must not be stored as done.  ``weights`` are the
    importance-sampling weights (all ones for uniform replay) and ``indices`` the buffer slots
    that were sampled, to be passed back to ``update_priorities`` by prioritised agents.
    """

    obs: Array
    actions: Array
    rewards: npt.NDArray[np.float32]
    next_obs: Array
    dones: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]
    indices: npt.NDArray[np.int64]


def _scalar(state: Mapping[str, Array], key: str) -> Any:
    """Return the Python value of a 0-d entry of a state dict."""
    return np.asarray(state[key]).item()


class ReplayMemory:
    """Uniform replay memory over a preallocated ring buffer.

    Args:
        capacity: maximum number of transitions kept; the oldest are overwritten first.
        obs_shape: shape of one observation (e.g. ``(4,)`` or ``(4, 84, 84)``).
        action_shape: shape of one action; ``()`` for discrete actions.
        obs_dtype: storage dtype of observations (``np.uint8`` for images saves 4x memory).
        action_dtype: storage dtype of actions (``np.int64`` discrete, ``np.float32`` continuous).
        seed: seed of the internal generator used by :meth:`sample`.
    """

    #: Name stored in the state dict so a file of one kind is not loaded as another.
    KIND: ClassVar[str] = "ReplayMemory"

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...] = (),
        *,
        obs_dtype: npt.DTypeLike = np.float32,
        action_dtype: npt.DTypeLike = np.int64,
        seed: int | None = None,
    ) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._obs_shape = tuple(int(d) for d in obs_shape)
        self._action_shape = tuple(int(d) for d in action_shape)
        self._obs_ndim = len(self._obs_shape)
        self._obs = np.zeros((capacity, *self._obs_shape), dtype=obs_dtype)
        self._next_obs = np.zeros((capacity, *self._obs_shape), dtype=obs_dtype)
        self._actions = np.zeros((capacity, *self._action_shape), dtype=action_dtype)
        self._rewards = np.zeros(capacity, dtype=np.float32)
        self._dones = np.zeros(capacity, dtype=np.float32)
        self._pos = 0
        self._size = 0
        self._rng = np.random.default_rng(seed)
        # Reusable output arrays for large sampled observations (see _take_recycled).
        self._obs_row_bytes = self._obs.itemsize * int(np.prod(self._obs_shape, dtype=np.int64))
        self._obs_pool: list[Array] = []
        self._next_obs_pool: list[Array] = []
        # Only call the write hook when a subclass overrides it (saves a call per add).
        # (A flag, not a stored bound method: that would make a reference cycle and delay
        # freeing a possibly huge buffer until the cyclic garbage collector runs.)
        self._has_write_hook = type(self)._on_write is not ReplayMemory._on_write
        # Expected argument shapes of the last batch size seen by add() (see _add_batch).
        self._batch_n = -1
        self._batch_shapes: tuple[tuple[int, ...], ...] = ()

    # ------------------------------------------------------------------ basic properties
    @property
    def capacity(self) -> int:
        """Maximum number of transitions held."""
        return self._capacity

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self._obs_shape

    @property
    def action_shape(self) -> tuple[int, ...]:
        return self._action_shape

    @property
    def obs_dtype(self) -> np.dtype[Any]:
        return self._obs.dtype

    @property
    def action_dtype(self) -> np.dtype[Any]:
        return self._actions.dtype

    @property
    def rng(self) -> np.random.Generator:
        """The generator used for sampling (its state is checkpointed)."""
        return self._rng

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self._size}, capacity={self._capacity}, "
            f"obs_shape={self._obs_shape}, obs_dtype={self._obs.dtype}, "
            f"action_shape={self._action_shape}, action_dtype={self._actions.dtype})"
        )

    # ------------------------------------------------------------------------ writing
    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, done: Any) -> None:
        """Store one transition, or a batch of ``N`` transitions.

        A batch is recognised by ``obs`` having one more dimension than ``obs_shape``; then every
        argument carries a leading dimension ``N`` (``reward`` and ``done`` have shape ``(N,)``).
        ``done`` must be the *terminated* flag (not truncation).  Values are cast to the storage
        dtypes with numpy's assignment rules.
        """
        obs_arr = obs if isinstance(obs, np.ndarray) else np.asarray(obs)
        if obs_arr.ndim == self._obs_ndim:
            self._add_one(obs_arr, action, reward, next_obs, done)
        elif obs_arr.ndim == self._obs_ndim + 1:
            self._add_batch(obs_arr, action, reward, next_obs, done)
        else:
            raise ValueError(
                f"obs has shape {obs_arr.shape}; expected {self._obs_shape} for one transition "
                f"or (N, *{self._obs_shape}) for a batch"
            )

    def _add_one(self, obs: Array, action: Any, reward: Any, next_obs: Any, done: Any) -> None:
        if obs.shape != self._obs_shape:
            raise ValueError(f"obs has shape {obs.shape}, expected {self._obs_shape}")
        next_arr = next_obs if isinstance(next_obs, np.ndarray) else np.asarray(next_obs)
        if next_arr.shape != self._obs_shape:
            raise ValueError(f"next_obs has shape {next_arr.shape}, expected {self._obs_shape}")
        self._write_one(obs, action, reward, next_arr, done)

    def _write_one(self, obs: Any, action: Any, reward: Any, next_obs: Any, done: Any) -> None:
        """Write one already validated transition at the write position."""
        pos = self._pos
        self._obs[pos] = obs
        self._next_obs[pos] = next_obs
        self._actions[pos] = action
        self._rewards[pos] = reward
        self._dones[pos] = done
        self._pos = pos + 1 if pos + 1 < self._capacity else 0
        if self._size < self._capacity:
            self._size += 1
        if self._has_write_hook:
            self._on_write(pos, 1)

    def _add_batch(self, obs: Array, action: Any, reward: Any, next_obs: Any, done: Any) -> None:
        # isinstance checks instead of unconditional np.asarray, and expected shapes cached per
        # batch size: this runs once per env step and per-call overhead is what dominates for
        # small observations.
        n = obs.shape[0]
        if n != self._batch_n:
            self._batch_n = n
            obs_shape = (n, *self._obs_shape)
            self._batch_shapes = (obs_shape, obs_shape, (n, *self._action_shape), (n,), (n,))
        next_arr = next_obs if isinstance(next_obs, np.ndarray) else np.asarray(next_obs)
        actions = action if isinstance(action, np.ndarray) else np.asarray(action)
        rewards = reward if isinstance(reward, np.ndarray) else np.asarray(reward)
        dones = done if isinstance(done, np.ndarray) else np.asarray(done)
        shapes = (obs.shape, next_arr.shape, actions.shape, rewards.shape, dones.shape)
        if shapes != self._batch_shapes:  # one comparison on the happy path
            for name, got, want in zip(
                ("obs", "next_obs", "action", "reward", "done"),
                shapes,
                self._batch_shapes,
                strict=True,
            ):
                if got != want:
                    raise ValueError(f"{name} has shape {got}, expected {want}")
        if n == 1:
            # One env: integer-indexed writes of row views/scalars are markedly cheaper than
            # five slice assignments (numpy's per-call overhead dominates at this size).
            self._write_one(obs[0], actions[0], rewards[0], next_arr[0], dones[0])
            return
        cap = self._capacity
        start = self._pos
        end = start + n
        if n > 0 and end <= cap:
            # Common case: one contiguous slice per field.
            self._obs[start:end] = obs
            self._next_obs[start:end] = next_arr
            self._actions[start:end] = actions
            self._rewards[start:end] = rewards
            self._dones[start:end] = dones
            self._pos = end if end < cap else 0
            if self._size < cap:
                self._size = min(self._size + n, cap)
            if self._has_write_hook:
                self._on_write(start, n)
            return
        if n == 0:
            return
        if n > cap:
            # Only the newest `cap` rows survive; write them where a sequential add would have.
            skip = n - cap
            obs, next_arr, actions = obs[skip:], next_arr[skip:], actions[skip:]
            rewards, dones = rewards[skip:], dones[skip:]
            start = (start + skip) % cap
            count = cap
        else:
            count = n
        # Wrap-around: two slice copies per field.
        first = cap - start
        rest = count - first
        for dst, src in (
            (self._obs, obs),
            (self._next_obs, next_arr),
            (self._actions, actions),
            (self._rewards, rewards),
            (self._dones, dones),
        ):
            dst[start:] = src[:first]
            dst[:rest] = src[first:]
        self._pos = rest % cap
        self._size = min(self._size + n, cap)
        if self._has_write_hook:
            self._on_write(start, count)

    def _on_write(self, start: int, count: int) -> None:
        """Subclass hook: ``count`` slots from ``start`` (mod capacity) were just written."""

    # ----------------------------------------------------------------------- sampling
    def sample(self, batch_size: int) -> ReplayBatch:
        """Sample ``batch_size`` transitions uniformly, with replacement."""
        if self._size == 0:
            raise ValueError(f"cannot sample from an empty {type(self).__name__}: add data first")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        # floor(u * size) instead of Generator.integers: same distribution for any realistic
        # size (bias ~size / 2**53) at less than half the call overhead, which matters at
        # one sample per environment step.
        indices = (self._rng.random(batch_size) * self._size).astype(np.int64)
        return self._gather(indices, np.ones(batch_size, dtype=np.float32))

    def _gather(
        self, indices: npt.NDArray[np.int64], weights: npt.NDArray[np.float32]
    ) -> ReplayBatch:
        # ndarray.take along axis 0 is measurably faster than fancy indexing for small batches.
        if indices.size * self._obs_row_bytes >= _RECYCLE_MIN_BYTES:
            obs = self._take_recycled(self._obs, indices, self._obs_pool)
            next_obs = self._take_recycled(self._next_obs, indices, self._next_obs_pool)
        else:
            obs = self._obs.take(indices, axis=0)
            next_obs = self._next_obs.take(indices, axis=0)
        return ReplayBatch(
            obs=obs,
            actions=self._actions.take(indices, axis=0),
            rewards=self._rewards.take(indices),
            next_obs=next_obs,
            dones=self._dones.take(indices),
            weights=weights,
            indices=indices,
        )

    @staticmethod
    def _take_recycled(source: Array, indices: npt.NDArray[np.int64], pool: list[Array]) -> Array:
        """``source.take(indices, axis=0)`` into an array from ``pool`` that nobody uses any more.

        Why: a batch of image observations is megabytes, and a fresh allocation that size comes
        from the OS as new pages that must be faulted in and zeroed on every sample; profiling
        showed that costing several times the copy itself.  An array whose only references are
        the pool's own can be overwritten without anyone noticing: every way to keep using it
        (the ReplayBatch, a view, a torch tensor made with torch.as_tensor/from_numpy, a
        memoryview) holds a reference.  Busy arrays are simply skipped, and the pool keeps at
        most _POOL_SIZE arrays, so e.g. ``batch = memory.sample(n)`` (where the previous batch
        is still alive during the call) alternates between two buffers.
        """
        shape = (indices.size, *source.shape[1:])
        out = None
        for candidate in pool:
            if sys.getrefcount(candidate) <= _UNUSED_REFCOUNT + 1 and candidate.shape == shape:
                out = candidate
                break
        if out is None:
            out = np.empty(shape, dtype=source.dtype)
            pool.append(out)
            if len(pool) > _POOL_SIZE:
                del pool[0]
        # Indices are in range by construction; mode="clip" also stops numpy from buffering
        # `out` through a temporary copy, which it does for the default mode="raise".
        np.take(source, indices, axis=0, out=out, mode="clip")
        return out

    # ------------------------------------------------------------------ checkpointing
    def _state_arrays(self) -> dict[str, Array]:
        """State without copying the (possibly huge) storage: only the filled rows, as views.

        Rows ``[0, size)`` are exactly the written ones (before the first wrap ``pos == size``),
        so saving just those keeps checkpoints of a partly filled buffer small.
        """
        size = self._size
        return {
            "format": np.array(STATE_FORMAT),
            "version": np.array(STATE_VERSION, dtype=np.int64),
            "kind": np.array(self.KIND),
            "capacity": np.array(self._capacity, dtype=np.int64),
            "pos": np.array(self._pos, dtype=np.int64),
            "size": np.array(size, dtype=np.int64),
            "obs": self._obs[:size],
            "next_obs": self._next_obs[:size],
            "actions": self._actions[:size],
            "rewards": self._rewards[:size],
            "dones": self._dones[:size],
            "rng_state": np.array(json.dumps(self._rng.bit_generator.state)),
        }

    def state_dict(self) -> dict[str, Array]:
        """Everything needed to resume exactly: data, write position, size and RNG state.

        All values are numpy arrays (scalars as 0-d arrays, the RNG state as a JSON string in a
        0-d unicode array) so the dict can be stored with :func:`numpy.savez` without pickle.
        The arrays are copies: later adds do not change a state dict taken earlier.
        """
        return {k: np.array(v, copy=True) for k, v in self._state_arrays().items()}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` against this buffer; raise ValueError naming the bad field."""
        for key in self._state_arrays():
            if key not in state:
                raise ValueError(f"replay state is missing field {key!r}")
        fmt = str(_scalar(state, "format"))
        if fmt != STATE_FORMAT:
            raise ValueError(f"field 'format' is {fmt!r}, expected {STATE_FORMAT!r}")
        version = int(_scalar(state, "version"))
        if version != STATE_VERSION:
            raise ValueError(f"field 'version' is {version}, this code reads {STATE_VERSION}")
        kind = str(_scalar(state, "kind"))
        if kind != self.KIND:
            raise ValueError(f"field 'kind' is {kind!r}, expected {self.KIND!r}")
        capacity = int(_scalar(state, "capacity"))
        if capacity != self._capacity:
            raise ValueError(f"field 'capacity' is {capacity}, expected {self._capacity}")
        size = int(_scalar(state, "size"))
        if not 0 <= size <= capacity:
            raise ValueError(f"field 'size' is {size}, expected 0..{capacity}")
        pos = int(_scalar(state, "pos"))
        if not 0 <= pos < capacity or (size < capacity and pos != size):
            raise ValueError(f"field 'pos' is {pos}, inconsistent with size {size}")
        expected = {
            "obs": ((size, *self._obs_shape), self._obs.dtype),
            "next_obs": ((size, *self._obs_shape), self._obs.dtype),
            "actions": ((size, *self._action_shape), self._actions.dtype),
            "rewards": ((size,), np.dtype(np.float32)),
            "dones": ((size,), np.dtype(np.float32)),
        }
        for key, (shape, dtype) in expected.items():
            arr = np.asarray(state[key])
            if arr.shape != shape:
                raise ValueError(f"field {key!r} has shape {arr.shape}, expected {shape}")
            if arr.dtype != dtype:
                raise ValueError(f"field {key!r} has dtype {arr.dtype}, expected {dtype}")
        try:
            rng_state = json.loads(str(_scalar(state, "rng_state")))
            name = rng_state["bit_generator"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"field 'rng_state' is not a generator state: {exc}") from exc
        own = self._rng.bit_generator.state["bit_generator"]
        if name != own:
            raise ValueError(f"field 'rng_state' is for {name!r}, expected {own!r}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (validated first, then applied)."""
        self._check_state(state)
        self._apply_state(state)

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        size = int(_scalar(state, "size"))
        self._obs[:size] = state["obs"]
        self._next_obs[:size] = state["next_obs"]
        self._actions[:size] = state["actions"]
        self._rewards[:size] = state["rewards"]
        self._dones[:size] = state["dones"]
        self._size = size
        self._pos = int(_scalar(state, "pos"))
        self._rng.bit_generator.state = json.loads(str(_scalar(state, "rng_state")))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state to ``path`` (exactly that name) as an uncompressed ``.npz``, atomically.

        The data goes to a temporary file in the same directory, is flushed to disk, and only
        then renamed over ``path`` with :func:`os.replace`; a failure at any point leaves an
        existing file at ``path`` untouched.
        """
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
        )
        try:
            with os.fdopen(fd, "wb") as fh:
                # Looser type: numpy's stub types ``allow_pickle`` as a keyword, which makes
                # ``**arrays`` unacceptable to mypy (object arrays are never stored anyway).
                savez: Callable[..., None] = np.savez
                savez(fh, **self._state_arrays())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        try:  # make the rename itself durable; not possible on every platform
            dir_fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)
        logger.debug("saved %s with %d transitions to %s", self.KIND, self._size, path)

    @classmethod
    def _read_state(cls, path: str | os.PathLike[str]) -> dict[str, Array]:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"replay file {path!r} does not exist")
        try:
            data = np.load(path, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with data:
                state = {key: data[key] for key in data.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{path!r} is not a replay file: {exc}") from exc
        if "format" not in state or str(_scalar(state, "format")) != STATE_FORMAT:
            raise ValueError(f"{path!r} is not a replay file (no {STATE_FORMAT!r} marker)")
        return state

    @classmethod
    def _init_kwargs(cls, state: Mapping[str, Array]) -> dict[str, Any]:
        """Constructor arguments that recreate a buffer matching ``state``."""
        for key in ("capacity", "obs", "actions"):
            if key not in state:
                raise ValueError(f"replay state is missing field {key!r}")
        obs = np.asarray(state["obs"])
        actions = np.asarray(state["actions"])
        return {
            "capacity": int(_scalar(state, "capacity")),
            "obs_shape": tuple(obs.shape[1:]),
            "action_shape": tuple(actions.shape[1:]),
            "obs_dtype": obs.dtype,
            "action_dtype": actions.dtype,
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Create a buffer from a file written by :meth:`save` (shapes/dtypes taken from it)."""
        state = cls._read_state(path)
        kwargs = cls._init_kwargs(state)
        capacity = kwargs.pop("capacity")
        obs_shape = kwargs.pop("obs_shape")
        memory = cls(capacity, obs_shape, **kwargs)
        memory.load_state_dict(state)
        logger.debug("loaded %s with %d transitions from %s", cls.KIND, len(memory), path)
        return memory
