"""On-policy rollout storage with GAE(lambda), for PPO/A2C-style agents.

Everything is preallocated with shape ``(num_steps, num_envs, ...)``: one rollout is filled one
vector step at a time, advantages are computed once backwards over the steps (vectorised over
the environments), and the data is then consumed as shuffled minibatches over the flattened
``num_steps * num_envs`` samples.

Convention for ``dones``: ``dones[t, e] == 1`` means the episode of env ``e`` *ended at step t*
(terminated or truncated), i.e. ``obs[t + 1, e]`` belongs to a new episode and must not be
bootstrapped from.  For truncations the agent has already added ``gamma * V(final_obs)`` to the
reward, so a single flag is enough here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

__all__ = ["RolloutBatch", "RolloutBuffer"]

Array = npt.NDArray[Any]
F32 = npt.NDArray[np.float32]


class RolloutBatch(NamedTuple):
    """A minibatch of on-policy samples, flattened over steps and environments."""

    obs: Array
    actions: Array
    log_probs: F32
    advantages: F32
    returns: F32
    values: F32


class RolloutBuffer:
    """Fixed-size on-policy buffer of ``num_steps`` vector steps from ``num_envs`` environments."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...] = (),
        *,
        obs_dtype: npt.DTypeLike = np.float32,
        action_dtype: npt.DTypeLike = np.int64,
    ) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"num_steps and num_envs must be >= 1, got {num_steps}, {num_envs}")
        self.num_steps = int(num_steps)
        self.num_envs = int(num_envs)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.action_shape = tuple(int(d) for d in action_shape)
        t, n = self.num_steps, self.num_envs
        self.obs = np.zeros((t, n, *self.obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((t, n, *self.action_shape), dtype=action_dtype)
        self.rewards = np.zeros((t, n), dtype=np.float32)
        self.dones = np.zeros((t, n), dtype=np.float32)
        self.values = np.zeros((t, n), dtype=np.float32)
        self.log_probs = np.zeros((t, n), dtype=np.float32)
        self.advantages = np.zeros((t, n), dtype=np.float32)
        self.returns = np.zeros((t, n), dtype=np.float32)
        self._pos = 0
        self._gae_ready = False

    @property
    def full(self) -> bool:
        """True once ``num_steps`` vector steps have been added."""
        return self._pos == self.num_steps

    @property
    def size(self) -> int:
        """Number of samples (steps * envs) stored so far."""
        return self._pos * self.num_envs

    def __len__(self) -> int:
        return self.size

    def reset(self) -> None:
        """Start a new rollout (storage is reused, not cleared)."""
        self._pos = 0
        self._gae_ready = False

    def add(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        dones: Any,
        values: Any,
        log_probs: Any,
    ) -> None:
        """Store one vector step: every argument has leading dimension ``num_envs``."""
        if self.full:
            raise RuntimeError("rollout buffer is full: call compute_gae/minibatches, then reset()")
        n = self.num_envs
        checks = (
            ("obs", obs, (n, *self.obs_shape)),
            ("actions", actions, (n, *self.action_shape)),
            ("rewards", rewards, (n,)),
            ("dones", dones, (n,)),
            ("values", values, (n,)),
            ("log_probs", log_probs, (n,)),
        )
        for name, value, shape in checks:
            got = np.shape(value)
            if got != shape:
                raise ValueError(f"{name} has shape {got}, expected {shape}")
        t = self._pos
        self.obs[t] = obs
        self.actions[t] = actions
        self.rewards[t] = rewards
        self.dones[t] = dones
        self.values[t] = values
        self.log_probs[t] = log_probs
        self._pos = t + 1
        self._gae_ready = False

    def compute_gae(self, last_values: Any, gamma: float, gae_lambda: float) -> None:
        """Generalised advantage estimation, backwards over steps, vectorised over envs.

        ``delta_t = r_t + gamma * (1 - done_t) * V_{t+1} - V_t`` and
        ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}``, where ``V_T`` is
        ``last_values`` (the value of the observation after the final step).  The recursion is
        accumulated in float64 to keep long rollouts precise, and ``returns = advantages +
        values`` is the critic's regression target.
        """
        if not self.full:
            raise RuntimeError(f"compute_gae needs a full rollout ({self._pos}/{self.num_steps})")
        next_values = np.asarray(last_values, dtype=np.float64)
        if next_values.shape != (self.num_envs,):
            raise ValueError(
                f"last_values has shape {next_values.shape}, expected ({self.num_envs},)"
            )
        not_done = 1.0 - self.dones.astype(np.float64)
        rewards = self.rewards.astype(np.float64)
        values = self.values.astype(np.float64)
        gae = np.zeros(self.num_envs, dtype=np.float64)
        for t in range(self.num_steps - 1, -1, -1):
            delta = rewards[t] + gamma * not_done[t] * next_values - values[t]
            gae = delta + (gamma * gae_lambda) * not_done[t] * gae
            self.advantages[t] = gae
            next_values = values[t]
        self.returns[:] = self.advantages + self.values
        self._gae_ready = True

    def minibatches(
        self,
        batch_size: int,
        rng: np.random.Generator,
        *,
        normalize_advantages: bool = True,
    ) -> Iterator[RolloutBatch]:
        """One shuffled pass over all ``num_steps * num_envs`` samples.

        Every sample appears in exactly one minibatch; the last minibatch is smaller when
        ``batch_size`` does not divide the total.  With ``normalize_advantages`` each
        minibatch's advantages are standardised (mean 0, std 1, eps 1e-8).
        """
        if not self._gae_ready:
            raise RuntimeError("call compute_gae() on a full rollout before minibatches()")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        total = self.num_steps * self.num_envs
        obs = self.obs.reshape(total, *self.obs_shape)
        actions = self.actions.reshape(total, *self.action_shape)
        log_probs = self.log_probs.reshape(total)
        advantages = self.advantages.reshape(total)
        returns = self.returns.reshape(total)
        values = self.values.reshape(total)
        order = rng.permutation(total)
        for start in range(0, total, batch_size):
            idx = order[start : start + batch_size]
            adv = advantages[idx]
            if normalize_advantages:
                adv = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)
            yield RolloutBatch(
                obs=obs[idx],
                actions=actions[idx],
                log_probs=log_probs[idx],
                advantages=adv,
                returns=returns[idx],
                values=values[idx],
            )
