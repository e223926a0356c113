"""DQN (Mnih et al. 2015) with double Q-learning, a dueling head and prioritized replay as
options. One file, backend-neutral: every framework call goes through ``self.backend``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition, schedule_value
from harness.data import PrioritizedReplay, ReplayBatch, ReplayMemory
from harness.numpy_nets import Argmax, Op, PolicyProgram, layers_of
from harness.policy import ActingParts, State
from harness_algos.bound_policy import BoundPolicy
from harness_algos.offpolicy import check_replay


def check_q(loss: str, batch_size: int, target_update_interval: int) -> None:
    """Refuse the Q update's keys (every config that runs it declares them): a known ``loss``,
    ``batch_size`` and ``target_update_interval`` >= 1."""
    if loss not in ("huber", "mse"):
        raise ValueError(f"loss = {loss!r} must be 'huber' or 'mse'")
    if batch_size < 1 or target_update_interval < 1:
        raise ValueError("batch_size and target_update_interval must be >= 1")


@dataclass
class DQNConfig:
    """DQN hyper-parameters ([algo] section): the Q update's, plus the replay, its schedule and
    the exploration. Defaults follow the RL Zoo's CartPole-v1 entry."""

    learning_rate: float = 2.3e-3
    """Adam step size."""
    batch_size: int = 64
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    target_update_interval: int = 128
    """Gradient steps between hard target-network copies."""
    tau: float = 1.0
    """Target update rate (1.0 = hard copy every interval, <1 = Polyak averaging)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the Q-network."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    double: bool = True
    """Double Q-learning: the online net picks the next action, the target net scores it."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A) over a shared trunk."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    loss: str = "huber"
    """TD loss: 'huber' or 'mse'."""
    buffer_size: int = 100_000
    """Replay capacity in transitions."""
    learning_starts: int = 1_000
    """Env steps collected before the first update."""
    train_freq: int = 256
    """Env steps (summed over envs) between update bursts."""
    gradient_steps: int = 128
    """Gradient steps per update burst."""
    exploration_fraction: float = 0.16
    """Fraction of the run over which epsilon decays linearly."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start."""
    exploration_final_eps: float = 0.04
    """Epsilon after the decay."""
    prioritized: bool = False
    """Prioritized experience replay (proportional, sum tree)."""
    per_alpha: float = 0.6
    """Priority exponent for prioritized replay."""
    per_beta: float = 0.4
    """Initial importance-sampling exponent, annealed to 1 over the run."""

    def __post_init__(self) -> None:
        check_replay(self.train_freq, self.gradient_steps, self.batch_size)
        check_q(self.loss, self.batch_size, self.target_update_interval)


class QUpdateConfig(Protocol):
    """The ``[algo]`` keys the Q update (:class:`DQN`) reads. :class:`DQNConfig` declares them
    (with their docs), and so does the config of any algorithm that runs this update with keys
    of its own (an offline one's dataset keys), without this module knowing it."""

    learning_rate: float
    gamma: float
    tau: float
    hidden: list[int]
    activation: str
    double: bool
    dueling: bool
    max_grad_norm: float
    loss: str


class DQN(Algorithm):
    """Loss and update: TD regression of Q(s, a) on r + gamma * Q_target(s', a*)."""

    def __init__(self, backend: Backend, info: EnvInfo, config: QUpdateConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.q = self._build(info)
        self.target = self._build(info)
        backend.copy_weights(self.target, self.q)
        self.optimizer = backend.optimizer(self.q, lr=config.learning_rate)
        self._acting: Callable[[np.ndarray], np.ndarray] | None = None
        """:meth:`greedy` on numpy copies of the online network, taken at the first call after
        a change of its weights (an update, a broadcast, a restore)."""

    def _build(self, info: EnvInfo) -> Any:
        bk, c = self.backend, self.config
        obs_dim, n = info.observation.flat_dim, info.action.n
        if not c.dueling:
            return bk.group(q=bk.mlp(obs_dim, c.hidden, n, activation=c.activation))
        width = c.hidden[-1]
        trunk = bk.mlp(obs_dim, c.hidden[:-1], width, activation=c.activation, activate_output=True)
        return bk.group(
            trunk=trunk,
            value=bk.mlp(width, [], 1),
            advantage=bk.mlp(width, [], n),
        )

    def q_values(self, net: Any, obs: Any) -> Any:
        if not self.config.dueling:
            return net["q"](obs)
        features = net["trunk"](obs)
        adv = net["advantage"](features)
        return net["value"](features) + adv - self.backend.mean(adv, axis=-1)[:, None]

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """argmax_a Q(obs, a), on numpy copies of the online network (``Backend.inference``,
        as PPO acts): a farm actor's torch forward cost 728 us of CPU a step (issue 30's
        256-actor DQN farm, tools/bench_farm.py). With a dueling head the trunk then the
        advantage head: ``Q = V + A - mean(A)`` adds the same to every action of a row."""
        if self._acting is None:
            bk = self.backend
            parts = ["trunk", "advantage"] if self.config.dueling else ["q"]
            copies = [bk.inference(self.q[part]) for part in parts]

            def act(x: np.ndarray) -> np.ndarray:
                for copy in copies:
                    x = copy(x)
                return np.asarray(np.argmax(x, axis=-1))

            self._acting = act
        return self._acting(np.asarray(obs, dtype=np.float32))

    def greedy_layers(self) -> tuple[Op, ...] | None:
        """:meth:`greedy` as policy-program ops on numpy copies of the online network:
        the Q-network then the argmax; with a dueling head, the trunk then the advantage
        head (``Q = V + A - mean(A)`` adds the same to every action of a row, so A's argmax
        is Q's). None when a copy is not a numpy network."""
        bk = self.backend
        parts = ["trunk", "advantage"] if self.config.dueling else ["q"]
        layers = [layers_of(bk.inference(self.q[part])) for part in parts]
        if any(chain is None for chain in layers):
            return None
        return (*(op for chain in layers for op in chain or ()), Argmax())

    def learn(self, batch: ReplayBatch) -> dict[str, float]:
        return self.learn_with_td(batch)[0]

    def q_penalty(self, q_all: Any, q_taken: Any) -> Any:
        """A term added to the TD loss (``q_all``: Q(s, .) of the batch, ``q_taken``: Q of its
        actions); DQN adds none, discrete CQL its conservative penalty (cql_discrete.py)."""
        return None

    def learn_with_td(self, batch: ReplayBatch) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step; also returns |TD error| per sample for priority updates."""
        bk, c = self.backend, self.config
        obs, next_obs = bk.tensor(batch.obs), bk.tensor(batch.next_obs)
        actions = bk.tensor(batch.actions, "int64")
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        with bk.autocast():
            with bk.no_grad():
                next_q = self.q_values(self.target, next_obs)
                if c.double:
                    best = bk.argmax(self.q_values(self.q, next_obs), axis=-1)
                    next_v = bk.gather(next_q, best)
                else:
                    next_v = bk.max(next_q, axis=-1)
                target = rewards + c.gamma * (1.0 - dones) * next_v
            q_all = self.q_values(self.q, obs)
            q = bk.gather(q_all, actions)
            per_sample = bk.smooth_l1(q, target) if c.loss == "huber" else bk.mse(q, target)
            loss = bk.mean(bk.tensor(batch.weights) * per_sample)
            penalty = self.q_penalty(q_all, q)
            if penalty is not None:
                loss = loss + penalty
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        self._acting = None  # (the copies acting uses hold the old weights)
        with bk.no_grad():
            td = bk.numpy(q - target)
        metrics = {
            "losses/td_loss": bk.item(loss),
            "losses/q_values": float(bk.item(bk.mean(q))),
            "losses/grad_norm": grad_norm,
        }
        return metrics, np.abs(td)

    def sync_target(self) -> None:
        self.backend.copy_weights(self.target, self.q, tau=self.config.tau)

    def state(self) -> dict[str, Any]:
        bk = self.backend
        return {
            "q": bk.state(self.q),
            "target": bk.state(self.target),
            "optimizer": bk.state(self.optimizer),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk = self.backend
        bk.load_state(self.q, state["q"])
        bk.load_state(self.target, state["target"])
        bk.load_state(self.optimizer, state["optimizer"])
        self._acting = None

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.q)

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.q, weights)
        self._acting = None


class EpsilonPolicy(BoundPolicy):
    """What the epsilon-greedy policies share (DQN's, R2D2's, QMIX's): ``epsilon()``, read
    from the agent's schedule at each act, and the agent's generator, read at each call where
    ``act`` is given none (:meth:`generator`)."""

    def __init__(
        self,
        epsilon: Callable[[], float],
        own_rng: Callable[[], np.random.Generator],
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None] | None = None,
    ) -> None:
        super().__init__(load, program)
        self.epsilon = epsilon
        self.own_rng = own_rng
        """The generator when ``act`` is given none: the agent's ``rng``, read at each call."""

    def generator(self, rng: np.random.Generator | None) -> np.random.Generator:
        """``rng``, or the agent's own generator where it is None."""
        return self.own_rng() if rng is None else rng


def explore_rows(
    actions: np.ndarray, n_actions: int, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """``actions`` with each row replaced by a uniformly random action with probability
    ``epsilon``: one uniform per row, then, when any row explores, one action per row (the
    draws DQN and R2D2 have always made)."""
    rows = len(actions)
    explores = rng.random(rows) < epsilon
    if explores.any():
        actions = np.where(explores, rng.integers(n_actions, size=rows), actions)
    return actions


class EpsilonGreedy(EpsilonPolicy):
    """Acts greedily on Q-values (``greedy``: observations -> argmax actions, the
    algorithm's numpy copies, so always its current weights), or exploring: a uniformly random
    action with probability ``epsilon()`` per row. ``rng`` (None: the agent's own generator)
    draws one uniform per row, then, when any row explores, one action per row: the draws
    DQN has always made. No per-env state."""

    def __init__(
        self,
        greedy: Callable[[np.ndarray], np.ndarray],
        n_actions: int,
        epsilon: Callable[[], float],
        own_rng: Callable[[], np.random.Generator],
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None],
    ) -> None:
        super().__init__(epsilon, own_rng, load=load, program=program)
        self.greedy = greedy
        self.n_actions = n_actions

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        actions = self.greedy(obs)
        if not explore:
            return actions, {}, state
        actions = explore_rows(actions, self.n_actions, self.epsilon(), self.generator(rng))
        return actions, {}, state


class DQNAgent(Agent):
    """Epsilon-greedy acting, replay storage and the update schedule around :class:`DQN`."""

    independent_transitions = True  # one-step replay: a farm may stream rollouts to it
    algorithm: DQN
    config: DQNConfig

    def __init__(
        self, algorithm: DQN, info: EnvInfo, config: DQNConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "dqn"
        self.rollout_len = max(1, config.train_freq // info.num_envs)
        obs_shape = info.observation.shape
        kwargs: dict[str, Any] = {"obs_dtype": np.float32, "action_dtype": np.int64, "seed": seed}
        if config.prioritized:
            self.replay: ReplayMemory = PrioritizedReplay(
                config.buffer_size,
                obs_shape,
                alpha=config.per_alpha,
                beta=config.per_beta,
                **kwargs,
            )
        else:
            self.replay = ReplayMemory(config.buffer_size, obs_shape, **kwargs)

    @property
    def epsilon(self) -> float:
        return epsilon_at(self)

    def policy(self) -> EpsilonGreedy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    def policy_program(self) -> PolicyProgram | None:
        return greedy_program(self.algorithm, self.env_info)

    def observe(self, transition: Transition) -> None:
        t = transition
        self.replay.add(t.obs, t.actions, t.rewards, t.next_obs, t.terminated)
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.env_steps < c.learning_starts or len(self.replay) < c.batch_size:
            return {"charts/epsilon": self.epsilon}
        per = isinstance(self.replay, PrioritizedReplay)
        if isinstance(self.replay, PrioritizedReplay):
            progress = min(1.0, self.env_steps / self.total_steps)
            self.replay.beta = c.per_beta + progress * (1.0 - c.per_beta)
        totals: dict[str, float] = {}
        for _ in range(c.gradient_steps):
            batch = self.replay.sample(c.batch_size)
            metrics, td = self.algorithm.learn_with_td(batch)
            if per:
                self.replay.update_priorities(batch.indices, td)  # type: ignore[attr-defined]
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            self.updates += 1
            if self.updates % c.target_update_interval == 0:
                self.algorithm.sync_target()
        out = {k: v / max(1, c.gradient_steps) for k, v in totals.items()}
        out["charts/epsilon"] = self.epsilon
        return out

    def data_state(self) -> dict[str, np.ndarray]:
        return {f"replay.{k}": v for k, v in self.replay.state_dict().items()}

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.replay.load_state_dict(
            {k.removeprefix("replay."): v for k, v in state.items() if k.startswith("replay.")}
        )


def epsilon_at(parts: ActingParts) -> float:
    """The exploration rate after ``parts.env_steps`` of ``parts.total_steps`` env steps (the
    ``exploration_*`` keys of ``parts.config``)."""
    c = parts.config
    return float(
        schedule_value(
            c.exploration_initial_eps,
            c.exploration_final_eps,
            parts.env_steps / parts.total_steps,
            c.exploration_fraction,
        )
    )


def greedy_program(algorithm: DQN, info: EnvInfo) -> PolicyProgram | None:
    """The greedy policy as data (:meth:`DQN.greedy_layers`)."""
    layers = algorithm.greedy_layers()
    if layers is None:
        return None
    return PolicyProgram(layers, info.observation.flat_dim, info.action.n, discrete=True)


def make_policy(parts: ActingParts) -> EpsilonGreedy:
    """Epsilon-greedy on the online network's numpy copies, epsilon read from ``parts``'
    step count at each act (:func:`epsilon_at`), exploring with ``parts.rng`` (an agent, or a
    farm actor's :class:`~harness.policy.Acting`)."""
    algorithm: DQN = parts.algorithm
    return EpsilonGreedy(
        algorithm.greedy,
        parts.env_info.action.n,
        lambda: epsilon_at(parts),
        lambda: parts.rng,
        load=parts.set_weights,
        program=lambda: greedy_program(algorithm, parts.env_info),
    )


def make_agent(
    info: EnvInfo, backend: Backend, config: DQNConfig, *, seed: int = 0, total_steps: int = 1
) -> DQNAgent:
    return DQNAgent(DQN(backend, info, config), info, config, seed=seed, total_steps=total_steps)
