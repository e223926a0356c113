"""The on-policy family's :class:`~harness.policy.Policy` (PPO, A2C, PG, IMPALA, MAPPO).

It acts on the numpy copy of the algorithm's acting model (:class:`ActingNet`, implemented by
:class:`harness_algos.onpolicy.ActorCritic`), so acting issues no framework operation. Its
per-env state is explicit, one array per key and one row per env, kept by whoever steps the
envs (:class:`harness.runtime.EnvStepper`, the evaluation loop, the policy server's shared
arrays):

* ``rnn``: a recurrent network's state (``algo.recurrent``), zeros at an episode's start.
  Each exploratory step returns the state it *started from* as the extra ``rnn_state``: the
  learner replays each rollout column from its first step's state.
* ``noise`` / ``noise_fresh``: with ``algo.noise_correlation`` = rho > 0, each env's last
  Gaussian noise and whether its next draw starts a new AR(1) process (an episode started):
  ``eps_t = rho * eps_{t-1} + sqrt(1 - rho^2) * z_t`` (:mod:`harness_algos.noise`).

Greedy acting takes no noise and leaves the noise rows as they are. The exploration generator
is the agent's own (``rng=None``), so a serial run draws exactly what the agent's ``sample`` drew
before the policy had a class of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from harness.numpy_nets import PolicyProgram
from harness.policy import State
from harness_algos.bound_policy import BoundPolicy
from harness_algos.noise import check_noise_correlation


class ActingNet(Protocol):
    """What the policy asks of the algorithm: one step of its numpy acting copy."""

    def act(
        self,
        x: np.ndarray,
        rnn: np.ndarray | None,
        rng: np.random.Generator | None,
        noise: np.ndarray | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Actions (before the env's transform) for policy inputs ``x``, drawn with ``rng``
        (greedy without one; box actions take ``noise`` as their standard-normal draw when
        given), the learner's extras (exploring only) and a recurrent network's state after
        the step from ``rnn`` (None for a feed-forward one)."""
        ...


class RolloutPolicy(BoundPolicy):
    """Acts for rows of envs on ``net`` (module docstring). ``inputs`` turns env observations
    into the network's (``normalize_obs``'s standardisation), ``to_env`` the network's actions
    into the env's (clipped to the box); ``width`` is a recurrent state's (0: feed-forward),
    ``act_dim`` the box actions' width for correlated noise of correlation ``rho``. ``load``
    and ``program`` are the agent's ``set_weights`` and ``policy_program``."""

    def __init__(
        self,
        net: ActingNet,
        rng: np.random.Generator,
        *,
        inputs: Callable[[Any], np.ndarray],
        to_env: Callable[[np.ndarray], Any],
        width: int = 0,
        rho: float = 0.0,
        act_dim: int = 0,
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None],
    ) -> None:
        check_noise_correlation(rho)
        self.net, self.rng = net, rng
        self.inputs, self.to_env = inputs, to_env
        self.width, self.rho, self.act_dim = width, float(rho), act_dim
        self.keep = float(np.sqrt(1.0 - self.rho * self.rho))
        """The weight of the fresh draw, so that each step's noise is N(0, I)."""
        super().__init__(load, program)

    def initial_state(self, rows: int) -> State:
        state: State = {}
        if self.width:
            state["rnn"] = np.zeros((rows, self.width), np.float32)
        if self.rho > 0:
            state["noise"] = np.zeros((rows, self.act_dim), np.float32)
            state["noise_fresh"] = np.ones(rows, bool)
        return state

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        x = self.inputs(obs)
        rng = (self.rng if rng is None else rng) if explore else None
        after = dict(state)
        noise = None
        if rng is not None and self.rho > 0:
            noise = self._noise(state["noise"], state["noise_fresh"], rng)
            after["noise"], after["noise_fresh"] = noise, np.zeros(len(noise), bool)
        rnn = state["rnn"] if self.width else None
        actions, extras, next_rnn = self.net.act(x, rnn, rng, noise)
        if rnn is not None:
            after["rnn"] = np.asarray(next_rnn, np.float32)
            if rng is not None:  # the state the step started from, first (the extras' order)
                extras = {"rnn_state": rnn, **extras}
        return self.to_env(actions), extras, after

    def _noise(self, held: np.ndarray, fresh: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The next correlated noise of the rows (a fresh process where ``fresh``)."""
        z = rng.standard_normal(held.shape).astype(np.float32)
        return np.where(fresh[:, None], z, self.rho * held + self.keep * z).astype(np.float32)
