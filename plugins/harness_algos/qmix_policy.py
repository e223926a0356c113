"""QMIX's acting (plugins/harness_algos/qmix.py): :class:`QMIXPolicy`, epsilon-greedy per
agent on numpy copies of the shared agent network, and :func:`agent_inputs`, the network's
inputs, which acting and the learner's sequence batches build alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.api import Obs, schedule_value
from harness.policy import ActingParts, State
from harness_algos.dqn import EpsilonPolicy

if TYPE_CHECKING:
    from harness_algos.qmix import QMIX


def one_hot(index: np.ndarray, n: int) -> np.ndarray:
    """One-hot rows of ``index`` (-1: all zeros)."""
    out: np.ndarray = np.eye(n + 1, dtype=np.float32)[np.asarray(index) + 1][..., 1:]
    return out


def agent_inputs(algorithm: QMIX, stacked: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Network inputs ``(..., A, in_dim)`` of stacked observations ``(..., A, obs_dim)`` and
    the agents' last actions ``(..., A)`` (-1: none; used with ``last_action`` only)."""
    x = algorithm.layout.with_ids(stacked)
    if algorithm.config.last_action:
        x = np.concatenate([x, one_hot(last, algorithm.n_actions)], axis=-1)
    return x


class QMIXPolicy(EpsilonPolicy):
    """Each agent's greedy action of the shared agent network (:class:`QMIX`'s numpy copies,
    always its current weights), or exploring: a random action with probability
    ``epsilon()`` per agent and env, from ``rng`` (None: the agent's own generator), the
    draws QMIX has always made. Per-env state, the same exploring and greedy: each agent's
    GRU state ``hidden`` ``(rows, A, hidden)`` with ``recurrent`` (zeros at an episode's
    start) and its last action ``last`` ``(rows, A)`` with ``last_action`` (-1 at the start);
    with neither, no state. Exploring returns the state each step acted from as the extra
    ``rnn_state`` (recurrent only), which the learner stores with a sequence's first step."""

    def __init__(
        self,
        algorithm: QMIX,
        epsilon: Callable[[], float],
        own_rng: Callable[[], np.random.Generator],
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
    ) -> None:
        super().__init__(epsilon, own_rng, load=load)
        self.algorithm = algorithm
        self.agents = algorithm.layout.agents

    def initial_state(self, rows: int) -> State:
        c, a = self.algorithm.config, len(self.agents)
        state: State = {}
        if c.recurrent:
            state["hidden"] = np.zeros((rows, a, c.hidden), np.float32)
        if c.last_action:
            state["last"] = np.full((rows, a), -1, np.int64)
        return state

    def _q(self, obs: Obs, state: State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q-values ``(n, A, n_actions)``, the hidden state acted from and the next one."""
        algorithm, c = self.algorithm, self.algorithm.config
        stacked = algorithm.layout.stack(obs)
        n, a = stacked.shape[:2]
        if c.recurrent:
            hidden = np.asarray(state["hidden"], np.float32)
        else:  # (a feed-forward memory layer reads no state)
            hidden = np.zeros((n, a, c.hidden), np.float32)
        last = state["last"] if c.last_action else np.full((n, a), -1, np.int64)
        x = agent_inputs(algorithm, stacked, last)
        q, h = algorithm.q_values(x.reshape(n * a, -1), hidden.reshape(n * a, -1))
        return q.reshape(n, a, -1), hidden, h.reshape(n, a, -1)

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        c = self.algorithm.config
        q, before, after = self._q(obs, state)
        actions = q.argmax(-1)
        extras: dict[str, np.ndarray] = {}
        if explore:
            rng = self.generator(rng)
            explores = rng.random(actions.shape) < self.epsilon()
            random = rng.integers(0, self.algorithm.n_actions, actions.shape)
            actions = np.where(explores, random, actions)
            if c.recurrent:
                extras["rnn_state"] = before.copy()
        new_state: State = {}
        if c.recurrent:
            new_state["hidden"] = after
        if c.last_action:
            new_state["last"] = actions
        env_actions = {agent: actions[:, j].copy() for j, agent in enumerate(self.agents)}
        return env_actions, extras, new_state


def epsilon_at(parts: ActingParts) -> float:
    """The exploration rate after ``parts.env_steps`` env steps: linear from ``epsilon_start``
    to ``epsilon_end`` over ``epsilon_anneal_steps`` (PyMARL's schedule, in env steps rather
    than DQN's fraction of the run, :func:`harness_algos.dqn.epsilon_at`)."""
    c = parts.config
    return schedule_value(c.epsilon_start, c.epsilon_end, parts.env_steps, c.epsilon_anneal_steps)


def make_policy(parts: ActingParts) -> QMIXPolicy:
    """Epsilon-greedy per agent on ``parts.algorithm``'s numpy copies, epsilon read from
    ``parts``' step count at each act (:func:`epsilon_at`), exploring with ``parts.rng`` (an
    agent, or a farm actor's :class:`~harness.policy.Acting`)."""
    return QMIXPolicy(
        parts.algorithm, lambda: epsilon_at(parts), lambda: parts.rng, load=parts.set_weights
    )
