"""What the offline algorithms (BCQ, CQL, discrete CQL) share around their updates: the dataset
they learn from, and an agent that learns from it without stepping an env.

* The dataset is a Minari dataset on local disk (``harness collect`` writes one), named by the
  ``dataset`` key: a path, or a dataset id under ``dataset_root``. harness_offline reads it and
  refuses one whose spaces do not fit the env; here its transitions fill the same
  :class:`harness.data.ReplayMemory` the online agents sample from.
* ``Agent.offline`` tells the runner to step no env for training: one run step is one gradient
  update, ``updates_per_iteration`` of them per ``learn``. Evaluations run episodes as usual.
* The dataset is read by :meth:`OfflineAgent.load_data` (the runner calls it at start-up), not
  when the agent is built: ``harness eval`` of a checkpoint needs no dataset.
* Box actions are stored in [-1, 1] (:class:`harness_algos.offpolicy.BoxScale`), as the online
  actor-critics store them.
* The agent acts through :class:`OfflinePolicy`: the greedy policy, also while "exploring".
  :func:`make_policy` makes it from the algorithm and the env alone (what an agentless actor
  holds: ``AlgorithmSpec.make_algorithm`` / ``make_policy``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Tensor, Transition
from harness.data import ReplayBatch, ReplayMemory
from harness.errors import ConfigError
from harness.numpy_nets import PolicyProgram
from harness.policy import ActingParts, State
from harness_algos.bound_policy import BoundPolicy
from harness_algos.offpolicy import BoxScale

DEPENDS_ON = ("harness_offline",)
"""First-party plugins this module imports (docs/plugins.md, "What a plugin may import"): the
Minari reader of harness_offline (``load_transitions``), imported when a dataset is loaded."""


class OfflineConfig:
    """Marks an offline algorithm's config (``issubclass(spec.config_cls, OfflineConfig)``: the
    conformance suite gives such an algorithm a dataset), and holds no key: each such config
    declares, with their docs, the dataset's ``[algo]`` keys ``dataset``, ``dataset_root`` and
    ``updates_per_iteration`` that :class:`OfflineAgent` reads, and checks them with
    :func:`check_offline`."""


def check_offline(updates_per_iteration: int) -> None:
    """Refuse an offline config's dataset keys that cannot run: ``updates_per_iteration`` >=
    1."""
    if updates_per_iteration < 1:
        raise ValueError(f"updates_per_iteration = {updates_per_iteration} must be >= 1")


def per_state(bk: Backend, x: Tensor, b: int) -> Tensor:
    """``(k * b,)`` values laid out as ``concat([obs] * k)`` lays out their states (row
    ``j * b + i`` belongs to state ``i``) as a ``(b, k)`` matrix with one row per state: for a
    max or a log-sum-exp over each state's ``k`` candidate actions."""
    k = int(x.shape[0]) // b
    return bk.concat([x[j * b : (j + 1) * b][:, None] for j in range(k)], axis=1)


class OfflineLearner(Protocol):
    """What :class:`OfflineAgent` needs from its algorithm."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions: in [-1, 1] for a box, indices for a discrete space."""
        ...

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]: ...


class OfflinePolicy(BoundPolicy):
    """How an offline agent acts (:class:`~harness.policy.Policy`): the algorithm's greedy
    ``act`` (box actions mapped from [-1, 1] onto the env's box by ``to_env``; None: discrete
    indices as they are), exploring or not: an offline agent never explores (``harness collect
    --noise`` adds noise of its own), so it draws nothing, returns no extras and keeps no
    per-env state. ``load`` loads weights into the algorithm (``ActingParts.set_weights``);
    ``program`` (None: not exportable, the offline algorithms' case) gives the greedy policy
    as data."""

    def __init__(
        self,
        learner: OfflineLearner,
        to_env: Callable[[np.ndarray], np.ndarray] | None,
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None] | None = None,
    ) -> None:
        self.learner, self.to_env = learner, to_env
        super().__init__(load, program)

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        actions = self.learner.act(obs)
        return (actions if self.to_env is None else self.to_env(actions)), {}, state


class OfflineAgent(Agent):
    """Learns from a fixed dataset: replay filled once, updates, greedy acting."""

    offline = True

    def __init__(
        self,
        algorithm: Algorithm,
        info: EnvInfo,
        config: Any,
        *,
        name: str,
        seed: int,
        total_steps: int,
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = name
        self.rollout_len = config.updates_per_iteration
        self.learner: OfflineLearner = algorithm  # type: ignore[assignment]
        self.scale = BoxScale(info, name) if info.action.kind == "box" else None
        self.replay: ReplayMemory | None = None
        self.dataset_returns = np.zeros(0)
        """Returns of the dataset's episodes (the behaviour policy's, for comparison)."""
        self._replay_rng: Any = None  # a restored sampling state, applied once data is loaded

    # -- data ----------------------------------------------------------------------------------
    def load_data(self) -> None:
        c = self.config
        if not c.dataset:
            raise ConfigError(
                f"Algorithm {self.name!r} learns offline from a dataset, but algo.dataset is "
                f"empty. Set it to a Minari dataset path or id (--set algo.dataset=PATH); make "
                f"one with `harness collect RUN_DIR --episodes N --out PATH`."
            )
        try:
            from harness_offline.datasets import load_transitions
        except ImportError as exc:  # (harness_offline imports no Minari at module level)
            raise ConfigError(
                f"Offline algorithms need the harness_offline plugin: {exc}"
            ) from None
        refs = [c.dataset] if isinstance(c.dataset, str) else list(c.dataset)
        data = load_transitions(refs, root=c.dataset_root, info=self.env_info, algo=self.name)
        discrete = self.scale is None
        actions = data.actions if discrete else self.scale.from_env(data.actions)  # type: ignore[union-attr]
        replay = ReplayMemory(
            max(1, len(data.rewards)),
            self.env_info.observation.shape,
            self.env_info.action.shape,
            obs_dtype=np.float32,
            action_dtype=np.int64 if discrete else np.float32,
            seed=int(self.rng.integers(2**31)),
        )
        replay.add(data.obs, actions, data.rewards, data.next_obs, data.terminated)
        if self._replay_rng is not None:
            replay.rng.bit_generator.state = self._replay_rng
        self.replay = replay
        self.dataset_returns = data.episode_returns

    def observe(self, transition: Transition) -> None:
        """Offline agents learn from their dataset only; experience given anyway is counted
        and dropped."""
        self.env_steps += len(transition.obs)

    # -- acting ----------------------------------------------------------------------------------
    def policy(self) -> OfflinePolicy:
        """:func:`make_policy` of this agent."""
        return make_policy(self, self.name)

    # -- learning --------------------------------------------------------------------------------
    def learn(self) -> dict[str, float]:
        if self.replay is None:
            self.load_data()
        replay = self.replay
        assert replay is not None
        batch_size = self.config.batch_size
        n = self.rollout_len
        metrics: dict[str, float] = {}
        for i in range(n):
            metrics = self.learner.learn(replay.sample(batch_size), diagnostics=i == n - 1)
            self.updates += 1
        return metrics

    # -- state -------------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Counters and the replay's sampling state; the dataset itself is not checkpointed
        (it is on disk already)."""
        rng = self.replay.rng.bit_generator.state if self.replay is not None else self._replay_rng
        return {**super().extra_state(), "replay_rng": rng}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        super().load_extra_state(state)
        self._replay_rng = state.get("replay_rng")
        if self.replay is not None and self._replay_rng is not None:
            self.replay.rng.bit_generator.state = self._replay_rng


def make_policy(parts: ActingParts, name: str) -> OfflinePolicy:
    """The :class:`OfflinePolicy` of offline algorithm ``name`` on ``parts.algorithm`` (its
    current weights): box actions mapped onto ``parts.env_info``'s box (:class:`BoxScale`, as
    the agent stores the dataset's), discrete ones as they are; loading is
    ``parts.set_weights``. Greedy always: nothing is read from ``parts.rng`` or the step
    counts. Not exportable (``program`` None), as the offline agents never were."""
    info = parts.env_info
    to_env = BoxScale(info, name).to_env if info.action.kind == "box" else None
    return OfflinePolicy(parts.algorithm, to_env, load=parts.set_weights)
