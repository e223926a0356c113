"""What DDPG, TD3 and SAC share around their updates (each algorithm's config, every key
written out, and its loss live in its own file; the checks of the keys they share are here).

* The replay memory lives on the learner; actors (farm processes) only act, so the agent takes
  rows from any envs in any batch size (``independent_transitions``) and a farm streams
  rollouts to it as they arrive.
* The networks work in ``[-1, 1]`` (a tanh-squashed actor); the env's box is mapped onto it
  when acting and back when storing, so one config fits every action scale.
* Uniform random actions until ``learning_starts`` env steps (as SB3 does).
* :class:`OffPolicyPolicy` acts (the agent's :class:`~harness.policy.Policy`): the greedy
  actor, or exploration drawn from the agent's own generator, on the algorithm's numpy copy.
* The replay ratio is exact however experience arrives: every env step owes
  ``gradient_steps / train_freq`` updates, paid at the next ``learn`` (a serial run with
  ``train_freq = 1`` updates after every step; a farm chunk of 64 rows pays 64 at once).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from harness.api import Agent, Algorithm, EnvInfo, Transition
from harness.data import ReplayBatch, ReplayMemory
from harness.errors import ConfigError
from harness.numpy_nets import Activation, Columns, Dense, Op, PolicyProgram, Rescale, layers_of
from harness.policy import ActingParts, State
from harness_algos.bound_policy import BoundPolicy


def check_actor_critic(batch_size: int, tau: float) -> None:
    """Refuse update keys every actor-critic here declares, online or offline (DDPG, TD3,
    SAC; BCQ, CQL): ``batch_size`` >= 1, ``tau`` in (0, 1]."""
    if batch_size < 1:
        raise ValueError(f"batch_size = {batch_size} must be >= 1")
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau = {tau} must be in (0, 1]")


def check_replay(train_freq: int, gradient_steps: int, batch_size: int) -> None:
    """Refuse a replay schedule (DDPG, TD3, SAC; DQN) that cannot run: ``train_freq`` and
    ``batch_size`` >= 1, ``gradient_steps`` >= 0."""
    if train_freq < 1 or gradient_steps < 0 or batch_size < 1:
        raise ValueError("train_freq and batch_size must be >= 1, gradient_steps >= 0")


class ReplayConfig(Protocol):
    """The ``[algo]`` keys :class:`OffPolicyAgent` reads; DDPG's, TD3's and SAC's configs
    declare them (with their docs)."""

    buffer_size: int
    learning_starts: int
    train_freq: int
    gradient_steps: int
    batch_size: int


def gaussian_explore(actions: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """Greedy ``actions`` in [-1, 1] plus N(0, std) noise, clipped back into [-1, 1]."""
    return np.clip(actions + rng.normal(0.0, std, actions.shape), -1.0, 1.0)


class BurstAlgorithm(Algorithm):
    """An algorithm whose updates come in bursts (a replay ratio paid at once): ``learn`` can
    leave its losses unread (``diagnostics=False``), so only a burst's last update pays for
    the read-back."""

    @abc.abstractmethod
    def learn(self, batch: Any, *, diagnostics: bool = True) -> dict[str, float]:
        """One update from ``batch``; metrics only when ``diagnostics``."""


class ContinuousActorCritic(BurstAlgorithm):
    """The acting and learning surface :class:`OffPolicyAgent` drives. Actions are in [-1, 1].

    Checkpoints hold the backend state of every attribute in ``saved`` (models, optimisers)
    and the ints in ``counters``; actors get the weights of ``self.actor``. A subclass keeps
    its numpy acting copy in ``_policy`` (dropped whenever the weights change)."""

    saved: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()
    actor: Any = None
    act_dim: int = 0
    """Values in one action (set by the subclass)."""
    _policy: Any = None

    def numpy_actor(self) -> Any:
        """The numpy copy of ``self.actor`` (taken after the weights last changed)."""
        if self._policy is None:
            self._policy = self.backend.inference(self.actor)
        return self._policy

    def state(self) -> dict[str, Any]:
        state = {name: self.backend.state(getattr(self, name)) for name in self.saved}
        return state | {name: getattr(self, name) for name in self.counters}

    def load_state(self, state: Mapping[str, Any]) -> None:
        for name in self.saved:
            self.backend.load_state(getattr(self, name), state[name])
        for name in self.counters:
            setattr(self, name, int(state[name]))
        self._policy = None

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.actor)

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.actor, weights)
        self._policy = None

    def actor_layers(self) -> tuple[Op, ...] | None:
        """:meth:`act` as policy-program ops (actions in [-1, 1]) on the numpy copy acting
        uses, or None when it cannot be described. The default describes how SAC and TD3 act:
        ``tanh`` of the first ``act_dim`` outputs of ``self.actor`` (SAC's means before its
        log-stds; all of TD3's), for an actor that reads the observation alone
        (:class:`~harness.numpy_nets.PolicyProgram` checks its input width). An algorithm
        that acts otherwise overrides it."""
        if self.actor is None or not self.act_dim:  # (DDPG's ensemble of actors)
            return None
        layers = layers_of(self.numpy_actor())
        if layers is None:
            return None
        last = layers[-1]
        wider = isinstance(last, Dense) and last.w.shape[1] > self.act_dim
        return (*layers, *([Columns(0, self.act_dim)] if wider else []), Activation("tanh"))

    @abc.abstractmethod
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions (numpy in, numpy out)."""

    @abc.abstractmethod
    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Exploratory actions drawn with ``rng``."""

    @abc.abstractmethod
    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        """One update; without ``diagnostics`` the losses need not be read back."""


def box_bounds(info: EnvInfo, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """The action box as arrays; a clear error when it is unbounded (a tanh actor needs it)."""
    low = np.asarray(info.action.low, np.float32).reshape(info.action.shape)
    high = np.asarray(info.action.high, np.float32).reshape(info.action.shape)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ConfigError(
            f"{algo} maps its tanh actor onto the action box, but {info.env_id!r} has action "
            f"bounds low={low.tolist()} high={high.tolist()}. Give the env finite bounds (e.g. "
            f"gymnasium.wrappers.RescaleAction), or use ppo, which needs none."
        )
    return low, high


class BoxScale:
    """The env's action box mapped onto [-1, 1], where the tanh actors work, and back: one
    config fits every action scale (online and offline agents share it)."""

    def __init__(self, info: EnvInfo, algo: str) -> None:
        low, high = box_bounds(info, algo)
        self.centre = (high + low) / 2
        self.half = (high - low) / 2

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        env_actions: np.ndarray = (self.centre + self.half * actions).astype(np.float32)
        return env_actions

    def from_env(self, actions: np.ndarray) -> np.ndarray:
        scaled: np.ndarray = np.clip((actions - self.centre) / self.half, -1.0, 1.0)
        return scaled


class ReplayRatioAgent(Agent):
    """The replay-ratio schedule and the replay's checkpointing, shared by every agent whose
    replay memory lives on the learner (DDPG, TD3, SAC; MADDPG): each env step owes
    ``gradient_steps / train_freq`` updates, paid at the next :meth:`learn` on batches from
    :meth:`replay_batch`. A subclass sets ``self.replay`` (anything with ``__len__``,
    ``state_dict`` and ``load_state_dict``) and implements :meth:`replay_batch`; its config
    has ``learning_starts``, ``batch_size``, ``gradient_steps`` and ``train_freq``."""

    replay: Any
    algorithm: BurstAlgorithm

    def __init__(
        self, algorithm: BurstAlgorithm, info: EnvInfo, config: Any, **kwargs: Any
    ) -> None:
        super().__init__(algorithm, info, config, **kwargs)
        self.owed = 0.0
        """Updates earned by env steps and not taken yet (a fraction carries over)."""
        self.counted = 0
        """env_steps already converted into owed updates."""

    @abc.abstractmethod
    def replay_batch(self) -> Any:
        """One training batch of ``config.batch_size`` rows for ``algorithm.learn``."""

    def learn(self) -> dict[str, float]:
        c = self.config
        fresh, self.counted = self.env_steps - self.counted, self.env_steps
        if self.env_steps < c.learning_starts or len(self.replay) < c.batch_size:
            return {}
        self.owed += fresh * c.gradient_steps / c.train_freq
        n = int(self.owed)
        self.owed -= n
        metrics: dict[str, float] = {}
        for i in range(n):
            metrics = self.algorithm.learn(self.replay_batch(), diagnostics=i == n - 1)
            self.updates += 1
        return metrics

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "owed": self.owed, "counted": self.counted}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        super().load_extra_state(state)
        self.owed = float(state["owed"])
        self.counted = int(state["counted"])

    def data_state(self) -> dict[str, np.ndarray]:
        return {f"replay.{k}": v for k, v in self.replay.state_dict().items()}

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.replay.load_state_dict(
            {k.removeprefix("replay."): v for k, v in state.items() if k.startswith("replay.")}
        )


class OffPolicyAgent(ReplayRatioAgent):
    """Replay, action scaling, random warm-up and the replay-ratio schedule."""

    independent_transitions = True
    config: ReplayConfig
    algorithm: ContinuousActorCritic

    def __init__(
        self,
        algorithm: ContinuousActorCritic,
        info: EnvInfo,
        config: ReplayConfig,
        *,
        name: str,
        seed: int,
        total_steps: int,
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = name
        self.rollout_len = max(1, config.train_freq // info.num_envs)
        self.scale = BoxScale(info, name)
        self.action_shape = info.action.shape
        self.replay = ReplayMemory(
            config.buffer_size,
            info.observation.shape,
            info.action.shape,
            obs_dtype=np.float32,
            action_dtype=np.float32,
            seed=seed,
        )

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return self.scale.to_env(actions)

    def from_env(self, actions: np.ndarray) -> np.ndarray:
        return self.scale.from_env(actions)

    def policy(self) -> OffPolicyPolicy:
        """:func:`make_policy` of this agent (uniform actions until ``learning_starts`` of
        its env steps)."""
        return make_policy(self, self.name)

    def policy_program(self) -> PolicyProgram | None:
        return actor_program(self.algorithm, self.scale, self.env_info)

    def observe(self, transition: Transition) -> None:
        t = transition
        self.replay.add(t.obs, self.from_env(t.actions), t.rewards, t.next_obs, t.terminated)
        self.env_steps += len(t.obs)

    def replay_batch(self) -> ReplayBatch:
        batch: ReplayBatch = self.replay.sample(self.config.batch_size)
        return batch


class OffPolicyPolicy(BoundPolicy):
    """How DDPG, TD3 and SAC act. Greedy: the algorithm's :meth:`~ContinuousActorCritic.act`.
    Exploring: uniform random actions while the agent has observed fewer than
    ``learning_starts`` env steps (``env_steps()``, read at each step: a farm actor's count is
    the learner's), then :meth:`~ContinuousActorCritic.explore`. Both are mapped from [-1, 1]
    onto the env's box (``scale``); no extras, no per-env state (DDPG's ensemble adds its head
    per env, :class:`harness_algos.ddpg.EnsemblePolicy`). ``rng`` is the agent's own
    generator, drawn from exactly as the agent drew before it had a policy; ``load`` and
    ``program`` are the agent's ``set_weights`` and ``policy_program``."""

    def __init__(
        self,
        algorithm: ContinuousActorCritic,
        rng: np.random.Generator,
        *,
        scale: BoxScale,
        action_shape: tuple[int, ...],
        learning_starts: int,
        env_steps: Callable[[], int],
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None],
    ) -> None:
        self.algorithm, self.rng, self.scale = algorithm, rng, scale
        self.action_shape, self.learning_starts = action_shape, learning_starts
        self.env_steps = env_steps
        super().__init__(load, program)

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if not explore:
            return self.scale.to_env(self.algorithm.act(obs)), {}, state
        rng = self.rng if rng is None else rng
        if self.env_steps() < self.learning_starts:
            actions = rng.uniform(-1.0, 1.0, (len(obs), *self.action_shape))
        else:
            actions = self.explore(obs, state, rng)
        return self.scale.to_env(actions), {}, state

    def explore(self, obs: np.ndarray, state: State, rng: np.random.Generator) -> np.ndarray:
        """Exploratory actions in [-1, 1] after the warm-up (the rows' ``state``: DDPG's
        heads)."""
        return self.algorithm.explore(obs, rng)


def actor_program(
    algorithm: ContinuousActorCritic, scale: BoxScale, info: EnvInfo
) -> PolicyProgram | None:
    """The greedy policy as data: the algorithm's :meth:`~ContinuousActorCritic.actor_layers`
    in [-1, 1], then :class:`BoxScale`'s map onto the env's box."""
    layers = algorithm.actor_layers()
    if layers is None:
        return None
    rescale = Rescale(scale.centre.ravel(), scale.half.ravel())
    return PolicyProgram(
        (*layers, rescale), info.observation.flat_dim, info.action.flat_dim, discrete=False
    )


def policy_parts(parts: ActingParts, name: str) -> dict[str, Any]:
    """What an :class:`OffPolicyPolicy` made from ``parts`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`) of algorithm ``name`` is made of besides the algorithm
    and the generator (keyword arguments)."""
    scale = BoxScale(parts.env_info, name)
    return {
        "scale": scale,
        "action_shape": parts.env_info.action.shape,
        "learning_starts": parts.config.learning_starts,
        "env_steps": lambda: parts.env_steps,
        "load": parts.set_weights,
        "program": lambda: actor_program(parts.algorithm, scale, parts.env_info),
    }


def make_policy(parts: ActingParts, name: str) -> OffPolicyPolicy:
    """The :class:`OffPolicyPolicy` of algorithm ``name`` (SAC, TD3, one-head DDPG) on
    ``parts.algorithm`` (its current weights), exploring with ``parts.rng``."""
    return OffPolicyPolicy(parts.algorithm, parts.rng, **policy_parts(parts, name))


def flat(batch: np.ndarray) -> np.ndarray:
    """``(B, *shape)`` as ``(B, prod(shape))`` (critics concatenate observations and actions)."""
    return batch.reshape(len(batch), -1)
