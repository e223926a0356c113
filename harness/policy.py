"""The thing that acts: :class:`Policy`, beside Model / Algorithm / Agent.

An :class:`~harness.api.Agent` learns; a :class:`Policy` only acts: observations in, actions
out, with no replay, optimiser or counters of its own. Whatever acts in a run acts through one:
the serial stepper and a farm actor's stepper (``harness.runtime.EnvStepper``), the
evaluation loop (``harness eval``, evaluations during training, videos) and whatever exports
the greedy policy. ``Agent.policy()`` makes it.

Per-env state (a recurrent policy's hidden state, an exploration perturbation held for an
episode) is explicit and belongs to whoever steps the envs: one numpy array per state key, one
row per env (:data:`State`). The caller keeps it between calls, passes it in, takes the new one
back, and resets the rows of envs whose episodes ended with :meth:`Policy.reset`, so the same
policy can act for any rows of any envs (the policy server's batches) without a word of
bookkeeping in the policy itself. A policy without per-env state returns ``{}`` and ignores it.

This module is step one of the migration (issue 49): every agent gets a policy through
:class:`AgentPolicy`, the adapter over the acting hooks :class:`~harness.api.Agent` has had
(``sample``, ``predict``, ``episodes_ended``, ``predict_episodes_ended``), which keeps such a
policy's state inside the agent as before. An algorithm moves to a policy of its own by
overriding ``Agent.policy()``; the acting hooks then stop being called.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

if TYPE_CHECKING:
    from harness.api import EnvInfo
    from harness.numpy_nets import PolicyProgram

__all__ = [
    "Acting",
    "ActingHooks",
    "ActingParts",
    "AgentPolicy",
    "HeldActing",
    "Policy",
    "State",
    "as_policy",
    "held_acting",
    "hooks_policy",
    "own_policy",
]

State = dict[str, np.ndarray]
"""A policy's per-env state: one array per key, its first axis the rows (envs) it acts for."""


class Policy(abc.ABC):
    """Acts for rows of envs: numpy in and out (a device engine's policy: the backend's
    tensors), per-env state explicit (:data:`State`).

    ``explore`` picks the exploratory policy (training rollouts: a sample, epsilon-greedy,
    noise; ``extras`` such as ``log_prob`` and ``value`` for the learner) or the greedy one
    (evaluation, export: no extras). ``rng`` is the caller's generator for exploration
    (None: the policy's own, what :class:`AgentPolicy` does)."""

    version: int = -1
    """The weights' version (:meth:`load`); -1 before any were loaded."""

    def initial_state(self, rows: int) -> State:
        """The state of ``rows`` envs at the start of their episodes (``{}``: no state)."""
        return {}

    @abc.abstractmethod
    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        """Actions for a batch of observations (one row per env), the per-step ``extras``
        (exploratory acting: what the learner needs back) and the rows' next state. The
        result for a row depends on that row's observation and state only: acting for any
        subset of rows gives those rows' actions (``harness.testing.check_algorithm``)."""

    def reset(self, state: State, mask: np.ndarray, *, explore: bool) -> State:
        """The state after the episodes of the rows in boolean ``mask`` ended (or those rows
        are new envs): their rows set to :meth:`Policy.initial_state`'s. Called by whoever steps the
        envs, after the step that ended them and before the next :meth:`act`."""
        if not state or not np.any(mask):
            return state
        fresh = self.initial_state(len(mask))
        rows = np.asarray(mask, bool)
        out = {}
        for key, value in state.items():
            value = np.array(value, copy=True)
            value[rows] = fresh[key][rows]
            out[key] = value
        return out

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Act with ``weights`` (what ``Agent.weights()`` gives) from now on, as version
        ``version`` (a farm actor, each broadcast)."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights")

    def program(self) -> PolicyProgram | None:
        """The greedy policy as data for ``harness export`` (``Agent.policy_program``'s
        contract), or None when it cannot be exported."""
        return None


class ActingParts(Protocol):
    """What a policy is made from (``AlgorithmSpec.make_policy``): the algorithm (its acting
    networks: a policy acts on their numpy copies and loads weights through
    :meth:`set_weights`), the env, the ``[algo]`` config, the exploration generator and the
    learner's env-step count that exploration schedules read (epsilon, a warm-up). An
    :class:`~harness.api.Agent` has every one of these, so a family's ``make_policy(agent)``
    is its ``Agent.policy()``; a process that only acts (a farm actor) makes an
    :class:`Acting` of the algorithm alone: no agent, replay or optimiser state."""

    algorithm: Any
    """The :class:`~harness.api.Algorithm` whose networks the policy acts on."""
    env_info: EnvInfo
    """The envs acted for (:class:`~harness.api.EnvInfo`)."""
    config: Any
    """The ``[algo]`` config."""
    rng: np.random.Generator
    """The exploration generator (``act`` given no ``rng``)."""
    total_steps: int
    """``[run] total_steps``, the horizon of schedules."""
    env_steps: int
    """The learner's env steps as the acting process knows them (schedules read it)."""

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load the learner's policy weights (``Agent.weights()``) into the algorithm."""
        ...


@dataclass
class Acting:
    """:class:`ActingParts` without an agent: what a farm actor acts with when its algorithm
    declares ``AlgorithmSpec.make_policy``. Whoever steps the envs keeps :attr:`env_steps` at
    the learner's count (set with each broadcast, advanced by each rollout)."""

    algorithm: Any
    """The algorithm (``AlgorithmSpec.make_algorithm``'s)."""
    env_info: EnvInfo
    """The envs acted for."""
    config: Any
    """The ``[algo]`` config."""
    rng: np.random.Generator
    """The exploration generator."""
    total_steps: int = 1
    """``[run] total_steps`` (schedules)."""
    env_steps: int = 0
    """The learner's env steps as this process knows them."""

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """``Algorithm.set_policy_weights`` (what ``Agent.set_weights`` does by default)."""
        self.algorithm.set_policy_weights(weights)


class ActingHooks(Protocol):
    """What :class:`AgentPolicy` calls: an agent's acting hooks (or the central-inference
    client's, which has only the exploratory half)."""

    def sample(self, obs: Any) -> tuple[Any, Mapping[str, np.ndarray]]:
        """Exploratory actions for a batch and their extras (``Agent.sample``)."""
        ...

    def episodes_ended(self, mask: np.ndarray) -> None:
        """The episodes of the rows in ``mask`` ended (``Agent.episodes_ended``)."""
        ...


class AgentPolicy(Policy):
    """The policy of an agent that acts through its own hooks, today's ``Agent`` API:
    ``sample`` / ``episodes_ended`` when exploring, ``predict`` / ``predict_episodes_ended``
    when greedy, ``set_weights`` to load and ``policy_program`` to export. Per-env state stays
    inside the agent (the ``state`` passed in and out is ``{}``), and the exploration RNG is
    the agent's own (``rng`` is ignored): the same calls in the same order as before, so a run
    acts exactly as it did. ``hooks`` may be any object with ``sample`` and
    ``episodes_ended`` (a farm actor's central-inference client)."""

    def __init__(self, hooks: ActingHooks) -> None:
        self.hooks = hooks

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if explore:
            actions, extras = self.hooks.sample(obs)
            return actions, cast(dict[str, np.ndarray], extras), state  # (not copied)
        return self.hooks.predict(obs), {}, state  # type: ignore[attr-defined]

    def reset(self, state: State, mask: np.ndarray, *, explore: bool) -> State:
        if explore:
            self.hooks.episodes_ended(mask)
        else:
            ended = getattr(self.hooks, "predict_episodes_ended", None)  # (agents only)
            if ended is not None:
                ended(mask)
        return state

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.hooks.set_weights(weights)  # type: ignore[attr-defined]
        self.version = version

    def program(self) -> PolicyProgram | None:
        program: PolicyProgram | None = self.hooks.policy_program()  # type: ignore[attr-defined]
        return program


def as_policy(actor: object) -> Policy:
    """``actor`` as a :class:`Policy`: a policy itself, an agent's ``policy()``, or else an
    object with the old acting hooks (``sample`` / ``episodes_ended`` to explore, ``predict``
    and the optional ``predict_episodes_ended`` to act greedily) wrapped in
    :class:`AgentPolicy`."""
    if isinstance(actor, Policy):
        return actor
    make = getattr(actor, "policy", None)
    if callable(make):
        policy = make()
        if isinstance(policy, Policy):
            return policy
    return AgentPolicy(cast(ActingHooks, actor))


class HeldActing:
    """The old single-caller acting API over a :class:`Policy`: ``Agent.sample`` /
    ``predict`` / ``episodes_ended`` / ``predict_episodes_ended`` of an agent that acts through
    a policy of its own (deprecated callers: tests and scripts that drive an agent directly).
    It keeps one state per mode for one fixed set of envs, here instead of in the caller; a
    batch of another size starts from fresh state."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.states: dict[bool, State] = {}
        """The state of the envs acted for, per mode (``explore`` True / False)."""

    def _state(self, rows: int, explore: bool) -> State:
        state = self.states.get(explore)
        if state is None or any(len(v) != rows for v in state.values()):
            state = self.policy.initial_state(rows)
        return state

    def act(self, obs: Any, *, explore: bool) -> tuple[Any, dict[str, np.ndarray]]:
        """The policy's actions and extras for ``obs``, from and to the kept state."""
        state = self._state(batch_size(obs), explore)
        actions, extras, self.states[explore] = self.policy.act(obs, state, explore=explore)
        return actions, extras

    def ended(self, mask: np.ndarray, *, explore: bool) -> None:
        """The episodes of the rows in ``mask`` ended: the policy resets their state."""
        state = self._state(len(mask), explore)
        self.states[explore] = self.policy.reset(state, np.asarray(mask, bool), explore=explore)


_WARNED: set[type] = set()


def hooks_policy(agent: Any) -> AgentPolicy:
    """The default ``Agent.policy()``: the :class:`AgentPolicy` over an agent written before
    :class:`Policy`, with a ``DeprecationWarning`` (once per class) naming the replacement."""
    cls = type(agent)
    if cls not in _WARNED:
        _WARNED.add(cls)
        warnings.warn(
            f"{cls.__module__}.{cls.__qualname__} acts through its Agent.sample/predict hooks, "
            "deprecated: harness.policy.AgentPolicy adapts them for this release only. Return "
            "a harness.policy.Policy from Agent.policy() instead (docs/plugins.md, 'Acting: "
            "Policy').",
            DeprecationWarning,
            stacklevel=3,
        )
    return AgentPolicy(agent)


def held_acting(agent: Any) -> HeldActing | None:
    """``agent``'s :class:`HeldActing` (made once, kept on the agent), or None when the agent
    acts through its own hooks (its ``policy()`` is the :class:`AgentPolicy` over itself)."""
    held = agent.__dict__.get("_held_acting", False)
    if held is False:
        policy = own_policy(agent)
        held = None if policy is None else HeldActing(policy)
        agent.__dict__["_held_acting"] = held
    return cast(HeldActing | None, held)


def own_policy(agent: Any) -> Policy | None:
    """``agent.policy()`` when it is a policy of the agent's own, None when it is the
    :class:`AgentPolicy` over the agent's acting hooks (an agent written before
    :class:`Policy`)."""
    policy: Policy = agent.policy()
    if isinstance(policy, AgentPolicy) and policy.hooks is agent:
        return None
    return policy


def batch_size(obs: Any) -> int:
    """The number of envs (rows) of an observation batch, single- or multi-agent (also
    ``harness.api.batch_size``)."""
    if isinstance(obs, Mapping):
        return len(next(iter(obs.values())))
    return len(obs)
