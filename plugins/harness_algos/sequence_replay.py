"""R2D2's sequence replay (plugins/harness_algos/r2d2.py): every env's steps cut into
overlapping sequences that never cross an episode end, stored with the recurrent state their
first step was acted from and sampled by priority, and the n-step targets over them (with the
paper's optional value rescaling). Numpy only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.data import SumTree
from harness.errors import ConfigError


def rescale(x: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """The paper's value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x."""
    out: np.ndarray = np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + eps * x
    return out


def unrescale(x: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """The inverse of :func:`rescale` (Pohlen et al. 2018, proposition A.2)."""
    root = np.sqrt(1.0 + 4.0 * eps * (np.abs(x) + 1.0 + eps))
    out: np.ndarray = np.sign(x) * (((root - 1.0) / (2.0 * eps)) ** 2 - 1.0)
    return out


def n_step_targets(
    rewards: np.ndarray,
    lengths: np.ndarray,
    terminated: np.ndarray,
    next_values: np.ndarray,
    gamma: float,
    n: int,
    value_rescale: bool = False,
) -> np.ndarray:
    """n-step targets ``(L, B)`` of time-major sequences: step ``t`` of a sequence of
    ``lengths[b]`` steps sums ``m = min(n, length - t)`` rewards and bootstraps from
    ``next_values[t + m]`` (the value of the observation ``t + m``; ``next_values`` is ``(L + 1,
    B)``, index ``length`` the observation after the last step), unless that is the end of a
    ``terminated`` sequence. With ``value_rescale`` the values are h-rescaled (see
    :func:`rescale`). Padded steps (``t >= length``) get arbitrary values."""
    steps, width = rewards.shape
    t = np.arange(steps)[:, None]
    cols = np.arange(width)[None]
    m = np.clip(lengths[None] - t, 1, n)
    total = np.zeros((steps, width), np.float64)
    for k in range(n):
        taken = k < m
        total += np.where(taken, gamma**k * rewards[np.minimum(t + k, steps - 1), cols], 0.0)
    ahead = np.minimum(t + m, steps)
    value = next_values[ahead, cols].astype(np.float64)
    if value_rescale:
        value = unrescale(value)
    ends = (t + m == lengths[None]) & (terminated[None] > 0)
    target = total + np.where(ends, 0.0, gamma**m * value)
    if value_rescale:
        target = rescale(target)
    return target.astype(np.float32)


class SequenceReplay:
    """Fixed-length sequences ``(capacity, ...)`` with their lengths, first states and
    priorities (a :class:`harness.data.SumTree`), filled circularly."""

    FIELDS = ("obs", "actions", "rewards", "state", "length", "terminated", "train_from")

    def __init__(
        self, capacity: int, seq_len: int, obs_dim: int, width: int, *, alpha: float
    ) -> None:
        cap, length = capacity, seq_len
        self.capacity = capacity
        self.alpha = alpha
        self.obs = np.zeros((cap, length + 1, obs_dim), np.float32)
        """Each step's observation and, at index ``length``, the one after the last step."""
        self.actions = np.zeros((cap, length), np.int64)
        self.rewards = np.zeros((cap, length), np.float32)
        self.state = np.zeros((cap, width), np.float32)
        """The acting state before the first step (the ``rnn_state`` extra)."""
        self.length = np.zeros(cap, np.int64)
        self.terminated = np.zeros(cap, np.float32)
        """1: the episode reached a terminal state at the last step (no bootstrap)."""
        self.train_from = np.zeros(cap, np.int64)
        """0 for a sequence that starts an episode, else ``burn_in``."""
        self.tree = SumTree(cap)
        self.pos = 0
        self.size = 0

    def add(self, **sequence: Any) -> None:
        """Store one sequence (arrays no longer than the slots: the rest is zeroed) at the
        largest priority given so far."""
        i = self.pos
        for name in self.FIELDS:
            value, slot = np.asarray(sequence[name]), getattr(self, name)
            if slot.ndim == 1:
                slot[i] = value
            else:
                slot[i] = 0
                slot[i, : len(value)] = value
        self.tree.update(np.array([i]), np.array([self.tree.max_priority]))
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, prioritized: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Indices of ``batch_size`` sequences and their importance weights: stratified
        proportional draws, or uniform ones (weights 1)."""
        if not prioritized:
            return rng.integers(0, self.size, batch_size), np.ones(batch_size, np.float32)
        total = self.tree.total
        values = (rng.random(batch_size) + np.arange(batch_size)) * (total / batch_size)
        indices = self.tree.find(values)
        priorities = self.tree[indices]
        weights = (priorities.min() / priorities) ** beta
        return indices, weights.astype(np.float32)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.tree.update(indices, (np.asarray(priorities, np.float64) + 1e-6) ** self.alpha)

    def batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The sequences ``indices``, time-major where they have a time axis."""
        return {
            "obs": self.obs[indices].swapaxes(0, 1),
            "actions": self.actions[indices].T,
            "rewards": self.rewards[indices].T,
            "state": self.state[indices],
            "length": self.length[indices],
            "terminated": self.terminated[indices],
            "train_from": self.train_from[indices],
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {f"replay/{name}": getattr(self, name)[: self.size] for name in self.FIELDS}
        out["replay/priorities"] = self.tree.leaves()[: self.size]
        out["replay/counters"] = np.array([self.pos, self.size], np.int64)
        out["replay/max_priority"] = np.array(self.tree.max_priority, np.float64)
        return out

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.pos, self.size = (int(v) for v in state["replay/counters"])
        if self.size > self.capacity:
            raise ConfigError(
                f"the checkpoint's replay holds {self.size} sequences, more than algo.buffer_size "
                f"= {self.capacity}: set algo.buffer_size >= {self.size} to resume it."
            )
        for name in self.FIELDS:
            slot, saved = getattr(self, name), np.asarray(state[f"replay/{name}"])
            if saved.shape[1:] != slot.shape[1:]:
                raise ConfigError(
                    f"the checkpoint's replay field {name!r} has shape {saved.shape[1:]} per "
                    f"sequence, this config's {slot.shape[1:]} (algo.seq_len, the observation "
                    f"or the recurrent state differ): resume with the checkpoint's config."
                )
            slot[: self.size] = saved
        self.tree.set_leaves(state["replay/priorities"], float(state["replay/max_priority"]))


class SequenceAssembler:
    """Every env's steps, in time order, cut into sequences of ``seq_len`` steps, adjacent
    ones sharing ``overlap`` steps, none crossing an episode end, each stored in a
    :class:`SequenceReplay` as it completes (plugins/harness_algos/r2d2.py's module doc). A
    sequence that starts an episode trains from its first step, one that continues it from
    ``burn_in``. An env whose next observation is not the one its last step led to, or whose
    next step was acted from a zero state without an episode end, was reset (a replaced farm
    actor, a resumed run): its sequence is stored cut there. Either sign alone can miss (a
    reset observation equal to the last one, in a discrete-state env; a zero state
    mid-episode, from zero inputs to zero-bias weights), and a false alarm costs only an
    early cut, still exact: the cut sequence bootstraps from its real last observation and
    the next starts from the state its first step was acted from."""

    ARRAYS = (
        "obs",
        "actions",
        "rewards",
        "states",
        "last_next",
        "length",
        "carried",
        "starts_episode",
        "expect",
    )

    def __init__(
        self,
        replay: SequenceReplay,
        num_envs: int,
        obs_dim: int,
        width: int,
        *,
        seq_len: int,
        overlap: int,
        burn_in: int,
    ) -> None:
        n, length = num_envs, seq_len
        self.replay = replay
        self.seq_len, self.overlap, self.burn_in = seq_len, overlap, burn_in
        self.obs = np.zeros((n, length + 1, obs_dim), np.float32)
        self.actions = np.zeros((n, length), np.int64)
        self.rewards = np.zeros((n, length), np.float32)
        self.states = np.zeros((n, length, width), np.float32)
        """The ``rnn_state`` before each step (a carried-over part starts from one of them)."""
        self.last_next = np.zeros((n, obs_dim), np.float32)
        """The observation each env's last step led to."""
        self.length = np.zeros(n, np.int64)
        self.carried = np.zeros(n, np.int64)
        """Steps at the front carried over from the previous sequence (stored already)."""
        self.starts_episode = np.ones(n, bool)
        self.expect = np.zeros(n, bool)
        """The env's next observation must be ``last_next`` (its episode goes on)."""

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        states: np.ndarray,
    ) -> None:
        """One vector step (flat float32 observations, one row per env)."""
        n = len(obs)
        if n != len(self.length):
            raise ValueError(
                f"r2d2 assembles one sequence per env and was built for {len(self.length)} envs, "
                f"but a step of {n} rows arrived"
            )
        # an env reset without an episode end (a replaced farm actor, a resumed run): its
        # sequence ends there, cut (see the class doc)
        moved = np.any(obs != self.last_next, axis=1)
        fresh = ~np.any(states != 0.0, axis=1)
        jumped = self.expect & (moved | fresh)
        for i in np.flatnonzero(jumped):
            self._store(int(i), terminated=False)
            self._restart(int(i))
        rows, pos = np.arange(n), self.length
        self.obs[rows, pos] = obs
        self.obs[rows, pos + 1] = next_obs
        self.actions[rows, pos] = actions
        self.rewards[rows, pos] = rewards
        self.states[rows, pos] = states
        self.length += 1
        done = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        for i in np.flatnonzero(done):
            self._store(int(i), terminated=bool(terminated[i]))
            self._restart(int(i))
        for i in np.flatnonzero(~done & (self.length == self.seq_len)):
            self._store(int(i), terminated=False)
            self._carry(int(i))
        self.last_next[:] = next_obs
        self.expect = ~done

    def _store(self, i: int, *, terminated: bool) -> None:
        length = int(self.length[i])
        if length <= self.carried[i]:  # nothing new since the last stored sequence
            return
        self.replay.add(
            obs=self.obs[i, : length + 1],
            actions=self.actions[i, :length],
            rewards=self.rewards[i, :length],
            state=self.states[i, 0],
            length=length,
            terminated=float(terminated),
            train_from=0 if self.starts_episode[i] else self.burn_in,
        )

    def _restart(self, i: int) -> None:
        """Env ``i``'s next step starts an episode."""
        self.length[i] = self.carried[i] = 0
        self.starts_episode[i] = True

    def _carry(self, i: int) -> None:
        """Start env ``i``'s next sequence with the last ``overlap`` steps of the full one."""
        o, length = self.overlap, self.seq_len
        self.obs[i, : o + 1] = self.obs[i, length - o :].copy()
        for name in ("actions", "rewards", "states"):
            buf = getattr(self, name)
            buf[i, :o] = buf[i, length - o :].copy()
        self.length[i] = self.carried[i] = o
        self.starts_episode[i] = False

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"current/{name}": getattr(self, name) for name in self.ARRAYS}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        for name in self.ARRAYS:
            own, saved = getattr(self, name), np.asarray(state[f"current/{name}"])
            if saved.shape != own.shape:
                raise ConfigError(
                    f"the checkpoint's sequence assembly {name!r} has shape {saved.shape}, this "
                    f"config's {own.shape} (run.num_envs, algo.seq_len, the observation or the "
                    f"recurrent state differ): resume with the checkpoint's config."
                )
            setattr(self, name, saved.astype(own.dtype))
