"""Recurrent actor-critics: PPO and IMPALA with ``algo.recurrent = "lstm" | "gru"``.

The network is the observation -> one recurrent layer (``backend.recurrent``, ``rnn_hidden``
units) -> separate actor and critic heads (``backend.parallel_mlp`` with the algorithm's
``hidden`` widths) on the layer's output: one shared memory, as CleanRL's LSTM PPO, so acting
steps one layer per env step and a stored state is one ``(S,)`` array per env.

How the state travels (docs/recurrent.md):

* **Acting** (serially and in every farm actor): the state is the policy's state row ``rnn``
  per env (:class:`harness_algos.rollout_policy.RolloutPolicy`), kept by whoever steps the
  envs and zeroed where an episode ends. Each exploratory step runs the layer's numpy copy
  once and returns the state it *started from* as the extra ``rnn_state``, so it travels with
  the chunk like the behaviour log-probabilities do.
* **Central inference** (``run.inference = "central"``): the policy server keeps the state
  rows of every env of the farm in one shared array and acts for only the rows of the actors
  in a batch; ended episodes and a replaced actor's fresh envs zero their rows. The
  ``rnn_state`` extras are the same as an actor's own stepper gives.
* **Learning**: a rollout is ``T`` steps of every env, each env's column one sequence. The
  learner keeps the ``rnn_state`` of each column's first step (the state the actor had there,
  whatever weights made it) and replays the sequence from it with the fused op, zeroing the
  state where an episode starts inside (:func:`episode_starts`). Gradients flow through the whole
  chunk (truncated BPTT over ``T`` steps); PPO's minibatches are whole sequences (envs).
* A lost farm actor is replaced by one with fresh envs: its first chunk starts new episodes
  from zero states, never from a state the learner has not seen.
* **Evaluation** acts greedily from its own state rows, zeroed at every episode start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from harness.api import Backend, EnvInfo
from harness.numpy_nets import Op, Recurrent, layers_of
from harness.sequences import state_dim

RECURRENT_CHOICES = ("none", "lstm", "gru")
"""Values of ``algo.recurrent``."""


def check_recurrent(recurrent: str, rnn_hidden: int) -> None:
    """Config checks of ``recurrent`` / ``rnn_hidden`` (``__post_init__``)."""
    if recurrent not in RECURRENT_CHOICES:
        raise ValueError(f"recurrent = {recurrent!r} must be one of {', '.join(RECURRENT_CHOICES)}")
    if rnn_hidden < 1:
        raise ValueError(f"rnn_hidden = {rnn_hidden} must be >= 1")


def recurrent_actor_critic(
    backend: Backend,
    info: EnvInfo,
    kind: str,
    rnn_hidden: int,
    hidden: list[int],
    activation: str,
) -> Any:
    """The recurrent layer (``core``) and the actor and critic heads on its output
    (``heads``, evaluated together: policy head then value)."""
    act_dim = info.action.n if info.action.kind == "discrete" else info.action.flat_dim
    return backend.group(
        core=backend.recurrent(kind, info.observation.flat_dim, rnn_hidden),
        heads=backend.parallel_mlp(
            rnn_hidden, hidden, [act_dim, 1], activation=activation, out_gains=[0.01, 1.0]
        ),
    )


class RecurrentPolicy:
    """The acting copy of :func:`recurrent_actor_critic`'s network: ``(obs (B, ...), state (B,
    S)) -> ([policy head, values (B, 1)], next state)``, one step, in numpy."""

    def __init__(self, step: Callable[..., Any], heads: Callable[..., Any]) -> None:
        self.step = step
        """The recurrent layer's copy: ``(x, state) -> (out, state)``."""
        self.heads = heads
        """The heads' copy: ``out -> [policy head, values]``."""

    def __call__(self, obs: np.ndarray, state: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        out, state = self.step(np.asarray(obs, np.float32).reshape(len(obs), -1), state)
        return self.heads(out), state

    def policy_layers(self) -> tuple[Op, ...] | None:
        """The recurrent layer and the policy head's layers as policy-program ops (the very
        objects acting steps); None when a copy is not a numpy network."""
        head = layers_of(self.heads, 0)
        if not isinstance(self.step, Recurrent) or head is None:
            return None
        return (self.step, *head)


def numpy_recurrent_policy(backend: Backend, net: Any) -> RecurrentPolicy:
    """The acting copy of :func:`recurrent_actor_critic`'s network (:class:`RecurrentPolicy`)."""
    return RecurrentPolicy(backend.inference(net["core"]), backend.inference(net["heads"]))


def episode_starts(dones: np.ndarray) -> np.ndarray:
    """Episode-start flags ``(T, N)`` of a rollout's done flags ``(T, N)``: an episode starts at
    step ``t`` when one ended at ``t - 1``. The first step's flag is false: the stored state
    already is a fresh episode's zeros where one started there (the actor reset it)."""
    starts = np.zeros(dones.shape, bool)
    starts[1:] = dones[:-1] > 0
    return starts


def starts_through_next(dones: np.ndarray) -> np.ndarray:
    """:func:`episode_starts` ``(T + 1, N)`` of a rollout and the step after it (the bootstrap
    observations: an episode starts there where one ended at the last step)."""
    return episode_starts(np.concatenate([dones, np.zeros((1, dones.shape[1]), dones.dtype)]))


def with_next(steps: np.ndarray, after: np.ndarray) -> np.ndarray:
    """``(T, N, ...)`` rollout observations with the observations after the last step appended:
    ``(T + 1, N, ...)``, one sequence per env through the bootstrap step."""
    return np.concatenate([steps, np.asarray(after, steps.dtype)[None]], axis=0)


class SequenceBatch(NamedTuple):
    """A PPO minibatch of whole sequences: ``obs`` time-major ``(T, B, ...)``, the per-step
    arrays flattened time-major (``T * B``, row ``t * B + b``), the episode starts and the
    state every sequence started from."""

    obs: np.ndarray
    actions: np.ndarray
    log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    values: np.ndarray
    starts: np.ndarray
    """``(T, B)`` bool (:func:`episode_starts`)."""
    state: np.ndarray
    """``(B, S)`` float32: the acting state at each sequence's first step."""


def sequence_minibatches(
    buffer: Any,
    state: np.ndarray,
    envs_per_batch: int,
    rng: np.random.Generator,
    *,
    normalize_advantages: bool,
) -> Iterator[SequenceBatch]:
    """One shuffled pass over a full rollout buffer (after GAE) in minibatches of
    ``envs_per_batch`` whole env sequences; advantages standardised per minibatch as
    :meth:`harness.data.RolloutBuffer.minibatches` does."""
    steps, n = buffer.num_steps, buffer.num_envs
    starts = episode_starts(buffer.dones)
    order = rng.permutation(n)
    for first in range(0, n, envs_per_batch):
        cols = np.sort(order[first : first + envs_per_batch])
        rows = steps * len(cols)

        def flat(a: np.ndarray, cols: np.ndarray = cols, rows: int = rows) -> np.ndarray:
            return a[:, cols].reshape(rows, *a.shape[2:])

        adv = flat(buffer.advantages)
        if normalize_advantages:
            adv = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)
        yield SequenceBatch(
            obs=buffer.obs[:, cols],
            actions=flat(buffer.actions),
            log_probs=flat(buffer.log_probs),
            advantages=adv,
            returns=flat(buffer.returns),
            values=flat(buffer.values),
            starts=starts[:, cols],
            state=state[cols],
        )


class AgentMemory:
    """What a recurrent actor-critic's learner keeps of the states: the state each rollout
    column started from, and the final observations of truncated episodes whose bootstrap
    values wait for the learner's sequence pass (acting states are the policy's rows). The
    sequence side of :class:`harness_algos.memory.RolloutMemory`; ``scorer`` is the algorithm
    (its ``sequence_values``)."""

    def __init__(self, kind: str, hidden: int, num_envs: int, scorer: Any = None) -> None:
        self.width = state_dim(kind, hidden)
        """One env's state width (an LSTM's ``(h, c)`` side by side)."""
        self.scorer = scorer
        self.rollout_start = np.zeros((num_envs, self.width), np.float32)
        """The ``rnn_state`` of the current rollout's first step, per env."""
        self.truncations: list[tuple[int, np.ndarray, np.ndarray]] = []
        """``(step, envs, final policy observations)`` of episodes a time limit cut in the
        current rollout."""

    def begin(self, extras: Mapping[str, Any], envs: int, name: str) -> None:
        """Keep the ``rnn_state`` extra of the rollout's first step (the state each column
        starts from)."""
        state = extras.get("rnn_state")
        if state is None or np.shape(state) != (envs, self.width):
            raise ValueError(
                f"a recurrent {name} agent observed a transition without its "
                f"(envs, {self.width}) 'rnn_state' extra (got "
                f"{None if state is None else np.shape(state)}): the experience must come from "
                "the same agent's sample() with the same algo.recurrent and algo.rnn_hidden."
            )
        self.rollout_start = np.array(state, np.float32)

    def truncated(
        self, step: int, envs: np.ndarray, final: np.ndarray, rewards: np.ndarray, gamma: float
    ) -> None:
        """V(final obs) needs the state after the step: scored with the rollout's sequences
        (:meth:`add_truncation_values`)."""
        self.truncations.append((step, envs, final))

    def score(self, buffer: Any, next_obs: np.ndarray, gamma: float) -> np.ndarray:
        """Each env's sequence scored through the bootstrap step from its first step's state,
        after the truncated episodes' bootstrap values are added to their rewards."""
        buf = buffer
        self.add_truncation_values(buf, gamma)
        values = self.scorer.sequence_values(
            with_next(buf.obs, next_obs), starts_through_next(buf.dones), self.rollout_start
        )
        buf.values[:] = values[:-1]
        return np.asarray(values[-1])

    def learn_inputs(self, buffer: Any, gamma: float) -> dict[str, np.ndarray]:
        """The truncation bootstrap added to the rewards; the episode starts through the
        bootstrap step and the state each column started from."""
        self.add_truncation_values(buffer, gamma)
        return {"starts": starts_through_next(buffer.dones), "state": self.rollout_start}

    def minibatches(
        self, buffer: Any, batch_size: int, rng: np.random.Generator, *, normalize: bool
    ) -> list[SequenceBatch]:
        """Whole env sequences, ``batch_size // T`` of them (at least one)."""
        return list(
            sequence_minibatches(
                buffer,
                self.rollout_start,
                max(1, batch_size // buffer.num_steps),
                rng,
                normalize_advantages=normalize,
            )
        )

    def clear(self) -> None:
        self.truncations.clear()

    def add_truncation_values(self, buffer: Any, gamma: float) -> None:
        """``gamma * V(final obs)`` onto the rewards of the steps where a time limit cut an
        episode, V in the state after that step, from one batched pass over sequences ending
        in the final observations (:meth:`final_columns`)."""
        columns = self.final_columns(buffer.obs, episode_starts(buffer.dones))
        if columns is None:
            return
        obs, starts, states, where = columns
        values = self.scorer.sequence_values(obs, starts, states)
        for j, (t, e) in enumerate(where):
            buffer.rewards[t, e] += gamma * values[t + 1, j]

    def final_columns(
        self, obs: np.ndarray, starts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]] | None:
        """Sequences that end in the truncated episodes' final observations, for one batched
        value pass: env ``e`` cut at step ``t`` gives the column ``obs[:t + 1, e]`` then its
        final observation (padded to the longest), with ``e``'s episode starts and initial
        state. Returns ``(obs, starts, states, [(t, e) per column])``, or None without
        truncations."""
        if not self.truncations:
            return None
        cols = [
            (t, int(e), final)
            for t, envs, finals in self.truncations
            for e, final in zip(envs, finals, strict=True)
        ]
        length = max(t for t, _, _ in cols) + 2
        x = np.zeros((length, len(cols), *obs.shape[2:]), obs.dtype)
        flags = np.zeros((length, len(cols)), bool)
        for j, (t, e, final) in enumerate(cols):
            x[: t + 1, j] = obs[: t + 1, e]
            x[t + 1, j] = final
            flags[: t + 1, j] = starts[: t + 1, e]
        states = self.rollout_start[[e for _, e, _ in cols]]
        return x, flags, states, [(t, e) for t, e, _ in cols]
