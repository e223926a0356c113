"""The on-policy family's feed-forward / recurrent split, decided once (``algo.recurrent``).

PPO, A2C, PG, IMPALA and MAPPO learn the same way whether their network is feed-forward or has
an LSTM/GRU in front of its heads, except in a handful of places. Those places are the methods
of two strategy objects, so that the algorithm and agent code call them without asking which
network they have:

* :class:`Memory` (the algorithm's, ``ActorCritic.memory``), made by :func:`memory_for` from
  ``algo.recurrent`` when the algorithm is built: the network (:meth:`~Memory.network`), its
  numpy acting copy, outputs and policy-program layers, the inputs of a learn pass, and the
  checkpoint's record of the recurrent setting. :class:`FeedForward` or :class:`Sequences`.
* :class:`RolloutMemory` (the agent's, ``RolloutAgent.memory``), made by the algorithm's
  :meth:`Memory.rollouts`: what the learner keeps of a rollout beside the buffer, and what it
  does with it. :class:`FlatRollouts` scores samples one by one (the truncation bootstrap at
  once in ``observe``, flat shuffled minibatches); :class:`~harness_algos.recurrent.AgentMemory`
  keeps the state each rollout column started from and the truncated episodes' final
  observations, scores whole sequences and cuts minibatches of whole sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import RolloutBatch
from harness.errors import ConfigError
from harness.numpy_nets import Op, layers_of
from harness.sequences import state_dim
from harness_algos.recurrent import (
    AgentMemory,
    RecurrentPolicy,
    SequenceBatch,
    numpy_recurrent_policy,
    recurrent_actor_critic,
    with_next,
)


class Scorer(Protocol):
    """What a rollout memory asks of the algorithm (``ActorCritic``): its value functions."""

    def values(self, obs: np.ndarray) -> np.ndarray:
        """State values of a batch of observations (feed-forward networks)."""
        ...

    def sequence_values(self, obs: np.ndarray, starts: np.ndarray, state: np.ndarray) -> Any:
        """State values ``(T, B)`` of time-major sequences (recurrent networks)."""
        ...


class RolloutMemory(Protocol):
    """What an on-policy learner keeps of a rollout beside its buffer (module docstring)."""

    width: int
    """One env's acting state width (0: no state)."""

    def begin(self, extras: Mapping[str, Any], envs: int, name: str) -> None:
        """The rollout's first step was observed, with the policy's ``extras``."""
        ...

    def truncated(
        self, step: int, envs: np.ndarray, final: np.ndarray, rewards: np.ndarray, gamma: float
    ) -> None:
        """A time limit cut the episodes of ``envs`` at rollout step ``step``: ``gamma * V(final
        policy observations)`` belongs on their ``rewards`` (now, or when the rollout is
        scored)."""
        ...

    def score(self, buffer: Any, next_obs: np.ndarray, gamma: float) -> np.ndarray:
        """Fill ``buffer.values`` with V of every stored observation and return V of
        ``next_obs`` (after the last step)."""
        ...

    def learn_inputs(self, buffer: Any, gamma: float) -> dict[str, np.ndarray]:
        """What a learn pass over the whole rollout needs besides the buffer (IMPALA)."""
        ...

    def minibatches(
        self, buffer: Any, batch_size: int, rng: np.random.Generator, *, normalize: bool
    ) -> list[RolloutBatch] | list[SequenceBatch]:
        """One shuffled pass over the full rollout (after GAE) in minibatches of about
        ``batch_size`` samples (PPO)."""
        ...

    def clear(self) -> None:
        """The rollout was learned from."""
        ...


class Memory(Protocol):
    """The algorithm's side of the split (module docstring)."""

    width: int
    """One env's acting state width (0: no state)."""

    def network(
        self,
        backend: Backend,
        info: EnvInfo,
        hidden: list[int],
        activation: str,
        feed_forward: Callable[[], Any],
    ) -> Any:
        """The acting network: ``feed_forward()``, or the recurrent layer and heads."""
        ...

    def numpy_policy(self, backend: Backend, net: Any) -> Callable[..., Any]:
        """A numpy copy of ``net`` with its current weights."""
        ...

    def outputs(
        self, policy: Callable[..., Any], obs: np.ndarray, state: np.ndarray | None
    ) -> tuple[Any, np.ndarray | None]:
        """The numpy copy's outputs on ``obs`` and the state after the step (None: no state)."""
        ...

    def policy_layers(self, policy: Callable[..., Any]) -> tuple[Op, ...] | None:
        """The numpy copy's policy path as policy-program ops; None when it is no numpy
        network."""
        ...

    def net_outputs(self, net: Any, obs: Any, sequences: tuple[Any, Any] | None) -> Any:
        """``net``'s outputs on an observation tensor (sequences: ``(state, starts)``)."""
        ...

    def unroll(
        self, backend: Backend, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, tuple[Any, Any] | None]:
        """IMPALA: the observations of a batch of unrolls and their bootstrap step as one
        network input, and the ``sequences`` argument of :meth:`net_outputs`."""
        ...

    def rollouts(self, scorer: Scorer, num_envs: int) -> RolloutMemory:
        """The agent's :class:`RolloutMemory` for ``num_envs`` envs."""
        ...

    def mark(self, state: dict[str, Any]) -> None:
        """Record the recurrent setting in a checkpoint's algorithm state."""
        ...

    def check(self, state: Mapping[str, Any]) -> None:
        """Refuse a checkpoint whose network is recurrent in another way than this."""
        ...


def memory_for(recurrent: str, rnn_hidden: int) -> Memory:
    """The :class:`Memory` of ``algo.recurrent`` (``none``, ``lstm`` or ``gru``)."""
    if recurrent == "none":
        return FeedForward()
    return Sequences(recurrent, rnn_hidden)


def check_spec(saved: str, wanted: str) -> None:
    """Refuse a checkpoint recorded as ``saved`` (``none`` or ``kind:hidden``) under a config
    that wants ``wanted``."""
    if saved == wanted:
        return

    def words(spec: str) -> str:
        if spec == "none":
            return 'algo.recurrent = "none" (feed-forward)'
        kind, hidden = spec.split(":")
        return f'algo.recurrent = "{kind}", algo.rnn_hidden = {hidden}'

    raise ConfigError(
        f"This checkpoint holds a policy trained with {words(saved)}, but the config asks "
        f"for {words(wanted)}: set the config's keys to the checkpoint's ({words(saved)})."
    )


# --- feed-forward ------------------------------------------------------------------------------
class FlatRollouts:
    """A feed-forward learner's rollout memory: nothing beyond the buffer."""

    width = 0

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def begin(self, extras: Mapping[str, Any], envs: int, name: str) -> None:
        return None

    def truncated(
        self, step: int, envs: np.ndarray, final: np.ndarray, rewards: np.ndarray, gamma: float
    ) -> None:
        rewards[envs] += gamma * self.scorer.values(final)

    def score(self, buffer: Any, next_obs: np.ndarray, gamma: float) -> np.ndarray:
        buf = buffer
        flat_obs = buf.obs.reshape(buf.num_steps * buf.num_envs, *buf.obs_shape)
        buf.values[:] = self.scorer.values(flat_obs).reshape(buf.num_steps, buf.num_envs)
        return self.scorer.values(next_obs)

    def learn_inputs(self, buffer: Any, gamma: float) -> dict[str, np.ndarray]:
        return {}

    def minibatches(
        self, buffer: Any, batch_size: int, rng: np.random.Generator, *, normalize: bool
    ) -> list[RolloutBatch]:
        return list(buffer.minibatches(batch_size, rng, normalize_advantages=normalize))

    def clear(self) -> None:
        return None


class FeedForward:
    """``algo.recurrent = "none"``: the network maps one observation batch to its outputs."""

    width = 0

    def network(
        self,
        backend: Backend,
        info: EnvInfo,
        hidden: list[int],
        activation: str,
        feed_forward: Callable[[], Any],
    ) -> Any:
        return feed_forward()

    def numpy_policy(self, backend: Backend, net: Any) -> Callable[..., Any]:
        return backend.inference(net)

    def outputs(
        self, policy: Callable[..., Any], obs: np.ndarray, state: np.ndarray | None
    ) -> tuple[Any, np.ndarray | None]:
        return policy(obs), None

    def policy_layers(self, policy: Callable[..., Any]) -> tuple[Op, ...] | None:
        return layers_of(policy, 0)

    def net_outputs(self, net: Any, obs: Any, sequences: tuple[Any, Any] | None) -> Any:
        return net(obs)

    def unroll(
        self, backend: Backend, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, tuple[Any, Any] | None]:
        obs = batch["obs"]
        rows = obs.shape[0] * obs.shape[1]
        return np.concatenate([obs.reshape(rows, *obs.shape[2:]), batch["next_obs"]]), None

    def rollouts(self, scorer: Scorer, num_envs: int) -> FlatRollouts:
        return FlatRollouts(scorer)

    def mark(self, state: dict[str, Any]) -> None:
        return None

    def check(self, state: Mapping[str, Any]) -> None:
        check_spec(str(state.get("recurrent", "none")), "none")


# --- recurrent ---------------------------------------------------------------------------------
class Sequences:
    """``algo.recurrent = "lstm" | "gru"``: a recurrent layer of ``hidden`` units in front of
    the heads (:func:`harness_algos.recurrent.recurrent_actor_critic`), acted one step at a
    time and learned over whole rollout columns."""

    def __init__(self, kind: str, hidden: int) -> None:
        self.kind, self.hidden = kind, hidden
        self.width = state_dim(kind, hidden)

    @property
    def spec(self) -> str:
        """The checkpoint's record: ``kind:hidden``."""
        return f"{self.kind}:{self.hidden}"

    def network(
        self,
        backend: Backend,
        info: EnvInfo,
        hidden: list[int],
        activation: str,
        feed_forward: Callable[[], Any],
    ) -> Any:
        return recurrent_actor_critic(backend, info, self.kind, self.hidden, hidden, activation)

    def numpy_policy(self, backend: Backend, net: Any) -> Callable[..., Any]:
        return numpy_recurrent_policy(backend, net)

    def outputs(
        self, policy: Callable[..., Any], obs: np.ndarray, state: np.ndarray | None
    ) -> tuple[Any, np.ndarray | None]:
        outs, after = policy(obs, state)
        return outs, after

    def policy_layers(self, policy: Callable[..., Any]) -> tuple[Op, ...] | None:
        assert isinstance(policy, RecurrentPolicy)
        return policy.policy_layers()

    def net_outputs(self, net: Any, obs: Any, sequences: tuple[Any, Any] | None) -> Any:
        """The recurrent layer over time-major ``obs`` ``(T, B, ...)`` from ``sequences =
        (state tensor (B, S), starts (T, B))``, and the heads on its ``T * B`` outputs (rows
        in time-major order)."""
        assert sequences is not None, "a recurrent network scores whole sequences"
        state, starts = sequences
        out, _ = net["core"](obs, state, starts, final=False)
        return net["heads"](out.reshape([-1, self.hidden]))

    def unroll(
        self, backend: Backend, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, tuple[Any, Any] | None]:
        # time-major (T + 1, N): the rows in the same order as the feed-forward input's
        every = with_next(batch["obs"], batch["next_obs"])
        return every, (backend.tensor(batch["state"]), batch["starts"])

    def rollouts(self, scorer: Scorer, num_envs: int) -> AgentMemory:
        return AgentMemory(self.kind, self.hidden, num_envs, scorer)

    def mark(self, state: dict[str, Any]) -> None:
        state["recurrent"] = self.spec

    def check(self, state: Mapping[str, Any]) -> None:
        check_spec(str(state.get("recurrent", "none")), self.spec)
