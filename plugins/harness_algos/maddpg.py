"""MADDPG (Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive
Environments", arXiv:1706.02275): centralised training, decentralised execution.

* Each agent has a deterministic actor that sees only its own observation (what it can use when
  acting alone), and a critic that sees every agent's observation and action: from the critic's
  point of view the other agents' learning no longer makes the environment non-stationary.
* Each critic regresses on its own agent's reward, ``r_i + gamma * Q'_i(x', mu'_1(o'_1), ...,
  mu'_N(o'_N))``; only ``terminated`` stops the bootstrap (a time limit does not: ``next_obs``
  is the true final observation there).
* Actor ``i`` climbs ``Q_i(x, a_1, ..., mu_i(o_i), ..., a_N)`` with the other agents' actions
  taken from the replay, as in the paper.
* Discrete actions use the Gumbel-softmax relaxation (straight-through: a hard one-hot forward,
  the soft sample's gradient), for the actor update and for the target actions; the env gets
  the sample's index, so exploration is the policy's own sampling. Box actions use a tanh actor
  mapped onto the box, with Gaussian exploration noise clipped into the bounds.
* All agents' actors are one :meth:`Backend.parallel_mlp` (observations zero-padded to the
  largest size: padded inputs meet weights that never get a gradient, so each member is an
  ordinary MLP on its own observation), and all critics another one (the same joint input):
  one batched product per layer instead of one small network per agent, which is what small
  networks' update time is made of.

Per-agent replay rows are stored side by side in one ring buffer (the joint observation and
action the critics read anyway), so ``observe`` takes rows from any envs and a farm streams
rollouts to it (``independent_transitions``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from harness.api import Backend, EnvInfo, Obs, SpaceInfo, Tensor, Transition, batch_size
from harness.errors import ConfigError
from harness.numpy_nets import PolicyProgram
from harness.policy import ActingParts, State
from harness_algos.bound_policy import BoundPolicy
from harness_algos.offpolicy import BurstAlgorithm, ReplayRatioAgent


@dataclass
class MADDPGConfig:
    """MADDPG hyper-parameters ([algo] section). Defaults follow the paper and its code
    (openai/maddpg: lr 1e-2, gamma 0.95, tau 0.01, 64x64 ReLU networks, one update per 100
    env steps, gradient norm 0.5) except ``batch_size`` and ``learning_starts``, which are
    smaller so that a CPU run learns within minutes."""

    lr_actor: float = 1e-2
    """Adam step size of the actors."""
    lr_critic: float = 1e-2
    """Adam step size of the critics."""
    gamma: float = 0.95
    """Discount factor."""
    tau: float = 0.01
    """Polyak rate of the target networks (1.0 = hard copy)."""
    batch_size: int = 1024
    """Transitions per gradient step."""
    buffer_size: int = 1_000_000
    """Replay capacity in (joint) transitions."""
    learning_starts: int = 1024
    """Env steps of uniformly random actions before the first update."""
    train_freq: int = 100
    """Env steps (summed over envs) per ``gradient_steps`` updates of every agent."""
    gradient_steps: int = 1
    """Updates per ``train_freq`` env steps (the replay ratio is their quotient)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of every actor and critic."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    gumbel_temperature: float = 1.0
    """Temperature of the Gumbel-softmax relaxation of discrete actions (lower: closer to
    one-hot, higher-variance gradients)."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise on box actions, in [-1, 1] units of the box."""
    max_grad_norm: float | None = 0.5
    """Gradient-norm clip of each agent's actor and critic update (None: no clipping). The
    agents update together, so the clip applies to the joint norm scaled by sqrt(agents),
    which equals the per-agent clip when the agents' norms are alike."""
    actor_reg: float = 1e-3
    """Weight of the squared actor output (logits or pre-tanh) in the actor loss, as in the
    paper's code: keeps logits from running away before the critic is meaningful."""

    def __post_init__(self) -> None:
        if self.lr_actor <= 0 or self.lr_critic <= 0:
            raise ValueError("lr_actor and lr_critic must be > 0")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma = {self.gamma} must be in [0, 1]")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau = {self.tau} must be in (0, 1]")
        if self.batch_size < 1 or self.buffer_size < 1 or self.train_freq < 1:
            raise ValueError("batch_size, buffer_size and train_freq must be >= 1")
        if self.gradient_steps < 0 or self.learning_starts < 0:
            raise ValueError("gradient_steps and learning_starts must be >= 0")
        if not self.hidden or any(w < 1 for w in self.hidden):
            raise ValueError(f"hidden = {self.hidden} needs at least one width >= 1")
        if self.gumbel_temperature <= 0:
            raise ValueError(f"gumbel_temperature = {self.gumbel_temperature} must be > 0")
        if self.exploration_noise < 0 or self.actor_reg < 0:
            raise ValueError("exploration_noise and actor_reg must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm = {self.max_grad_norm} must be > 0 (or None)")


class JointBatch(NamedTuple):
    """Sampled joint transitions: ``obs`` / ``next_obs`` every agent's observation side by
    side ``(B, sum of obs sizes)``, ``actions`` the critics' action encoding side by side
    (one-hot for discrete, [-1, 1] for box), ``rewards`` ``(B, agents)``, ``dones`` 1.0 where
    the episode terminated, and the Gumbel noise of each discrete agent's current and next
    policy sample (drawn by the agent, whose generator is checkpointed)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray
    noise: list[np.ndarray | None]
    next_noise: list[np.ndarray | None]


class JointReplay:
    """A ring buffer of joint transitions: one row per env step holds every agent's data.

    Rows are written in slices (at most two per batch, where the ring wraps), storage is
    preallocated (the OS commits pages as rows are first written), and the checkpoint holds
    only the filled rows."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "dones")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, agents: int) -> None:
        self.capacity = capacity
        self.data = {
            "obs": np.zeros((capacity, obs_dim), np.float32),
            "actions": np.zeros((capacity, act_dim), np.float32),
            "rewards": np.zeros((capacity, agents), np.float32),
            "next_obs": np.zeros((capacity, obs_dim), np.float32),
            "dones": np.zeros(capacity, np.float32),
        }
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, rows: Mapping[str, np.ndarray]) -> None:
        n = len(rows["dones"])
        if n > self.capacity:  # only the newest rows survive anyway
            rows = {k: v[-self.capacity :] for k, v in rows.items()}
            n = self.capacity
        first = min(n, self.capacity - self.pos)
        for name in self.FIELDS:
            buf, value = self.data[name], rows[name]
            buf[self.pos : self.pos + first] = value[:first]
            if first < n:
                buf[: n - first] = value[first:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, batch)
        return {name: self.data[name][idx] for name in self.FIELDS}

    def state_dict(self) -> dict[str, np.ndarray]:
        # rows [0, size) in storage order, plus the write position: enough to rebuild the ring
        state = {name: self.data[name][: self.size] for name in self.FIELDS}
        state["pos"] = np.asarray(self.pos)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        size = len(state["dones"])
        if size > self.capacity:
            raise ConfigError(
                f"the checkpoint's MADDPG replay holds {size} rows, more than buffer_size = "
                f"{self.capacity}; resume with a buffer_size of at least {size}"
            )
        for name in self.FIELDS:
            if state[name].shape[1:] != self.data[name].shape[1:]:
                raise ConfigError(
                    f"the checkpoint's MADDPG replay field {name!r} has rows of shape "
                    f"{state[name].shape[1:]}, this env's are {self.data[name].shape[1:]}"
                )
            self.data[name][:size] = state[name]
        self.size = size
        self.pos = int(state["pos"]) % self.capacity


class MADDPG(BurstAlgorithm):
    """The networks and the update of every agent at once (see the module docstring)."""

    saved = ("actors", "critics", "actors_target", "critics_target", "actor_opt", "critic_opt")

    def __init__(self, backend: Backend, info: EnvInfo, config: MADDPGConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.agents = info.agents
        self.obs_spaces = [info.observations[a] for a in self.agents]
        self.act_spaces = [info.actions[a] for a in self.agents]
        self.obs_dims = [s.flat_dim for s in self.obs_spaces]
        # critic encoding of each agent's action: one-hot (discrete) or the box in [-1, 1]
        self.act_dims = [s.n if s.kind == "discrete" else s.flat_dim for s in self.act_spaces]
        self.obs_slices = _slices(self.obs_dims)
        self.act_slices = _slices(self.act_dims)
        self.max_obs = max(self.obs_dims)
        joint = sum(self.obs_dims) + sum(self.act_dims)
        k = len(self.agents)
        hidden, act = config.hidden, config.activation
        # small output layer: near-uniform discrete policies and centred box actions at first
        self.actors, self.actors_target = (
            backend.parallel_mlp(
                self.max_obs, hidden, self.act_dims, activation=act, out_gains=[0.01] * k
            )
            for _ in range(2)
        )
        self.critics, self.critics_target = (
            backend.parallel_mlp(joint, hidden, [1] * k, activation=act) for _ in range(2)
        )
        backend.copy_weights(self.actors_target, self.actors)
        backend.copy_weights(self.critics_target, self.critics)
        self.actor_opt = backend.optimizer(self.actors, lr=config.lr_actor)
        self.critic_opt = backend.optimizer(self.critics, lr=config.lr_critic)
        self.clip = None if config.max_grad_norm is None else config.max_grad_norm * math.sqrt(k)
        self.steps = 0
        self._policy: Any = None  # numpy copy of the actors, taken when acting needs it

    # -- acting (numpy) ----------------------------------------------------------------------
    def padded(self, obs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Each agent's observations flattened and zero-padded to the largest size."""
        out = []
        for agent, dim in zip(self.agents, self.obs_dims, strict=True):
            x = np.asarray(obs[agent], np.float32)
            x = x.reshape(len(x), -1)
            if dim < self.max_obs:
                x = np.concatenate([x, np.zeros((len(x), self.max_obs - dim), np.float32)], 1)
            out.append(x)
        return out

    def outputs(self, obs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Every actor's raw output (logits, or pre-tanh box actions) on its observations."""
        if self._policy is None:
            self._policy = self.backend.inference(self.actors)
        outs: list[np.ndarray] = self._policy(self.padded(obs))
        return outs

    # -- learning ----------------------------------------------------------------------------
    def _relaxed(self, out: Tensor, noise: Tensor | None, space: SpaceInfo) -> Tensor:
        """The critic-input action of an actor output: for a discrete agent a straight-through
        Gumbel-softmax sample (forward: the one-hot of argmax(logits + noise); backward: the
        softmax's gradient), for a box agent tanh(out)."""
        bk = self.backend
        if space.kind != "discrete":
            return bk.tanh(out)
        y = (out + noise) / self.config.gumbel_temperature
        z = bk.exp(y - bk.max(y, axis=-1)[:, None])
        soft = z / bk.sum(z, axis=-1)[:, None]
        with bk.no_grad():
            # one-hot of the row maxima without a device round trip: 1 where y equals its row
            # maximum (gap 0), 0 where the gap is any representable negative number
            gap = y - bk.max(y, axis=-1)[:, None]
            hard = bk.clip(gap * 1e30 + 1.0, 0.0, 1.0)
            shift = hard - soft
        return soft + shift

    def learn(self, batch: JointBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        k = len(self.agents)
        obs, next_obs = bk.tensor(batch.obs), bk.tensor(batch.next_obs)
        actions = bk.tensor(batch.actions)
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        own = [bk.tensor(x) for x in self._pad_joint(batch.obs)]
        next_own = [bk.tensor(x) for x in self._pad_joint(batch.next_obs)]
        noise = [None if g is None else bk.tensor(g) for g in batch.noise]
        next_noise = [None if g is None else bk.tensor(g) for g in batch.next_noise]
        replay_actions = [actions[:, s:e] for s, e in self.act_slices]
        with bk.no_grad():
            next_out = self.actors_target(next_own)
            next_actions = [
                self._relaxed(next_out[j], next_noise[j], self.act_spaces[j]) for j in range(k)
            ]
            q_next = self.critics_target(bk.concat([next_obs, *next_actions]))
            targets = [rewards[:, j] + c.gamma * (1.0 - dones) * q_next[j][:, 0] for j in range(k)]
        q = self.critics(bk.concat([obs, actions]))
        critic_loss = sum(
            (bk.mean(bk.mse(q[j][:, 0], targets[j])) for j in range(k)), start=bk.tensor(0.0)
        )
        critic_norm = bk.update(self.critic_opt, critic_loss, max_grad_norm=self.clip)
        with bk.frozen(self.critics):
            out = self.actors(own)
            inputs = []
            for j in range(k):
                joint_actions = list(replay_actions)
                joint_actions[j] = self._relaxed(out[j], noise[j], self.act_spaces[j])
                inputs.append(bk.concat([obs, *joint_actions]))
            q_pi = self.critics(inputs)
            actor_loss = sum(
                (-bk.mean(q_pi[j]) + c.actor_reg * bk.mean(out[j] * out[j]) for j in range(k)),
                start=bk.tensor(0.0),
            )
        actor_norm = bk.update(self.actor_opt, actor_loss, max_grad_norm=self.clip)
        self._policy = None
        bk.copy_weights(self.actors_target, self.actors, tau=c.tau)
        bk.copy_weights(self.critics_target, self.critics, tau=c.tau)
        self.steps += 1
        if not diagnostics:
            return {}
        metrics = {
            "losses/critic_loss": bk.item(critic_loss) / k,
            "losses/actor_loss": bk.item(actor_loss) / k,
            "losses/critic_grad_norm": critic_norm,
            "losses/actor_grad_norm": actor_norm,
        }
        for j, agent in enumerate(self.agents):
            metrics[f"losses/q_values/{agent}"] = bk.item(bk.mean(q[j]))
        return metrics

    def _pad_joint(self, joint: np.ndarray) -> list[np.ndarray]:
        return self.padded(
            {a: joint[:, s:e] for a, (s, e) in zip(self.agents, self.obs_slices, strict=True)}
        )

    # -- state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        state = {name: self.backend.state(getattr(self, name)) for name in self.saved}
        return state | {"steps": self.steps}

    def load_state(self, state: Mapping[str, Any]) -> None:
        for name in self.saved:
            self.backend.load_state(getattr(self, name), state[name])
        self.steps = int(state["steps"])
        self._policy = None

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.actors)

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.actors, weights)
        self._policy = None


def _slices(dims: list[int]) -> list[tuple[int, int]]:
    ends = np.cumsum(dims).tolist()
    return [(int(e - d), int(e)) for d, e in zip(dims, ends, strict=True)]


def _box(space: SpaceInfo) -> tuple[np.ndarray, np.ndarray]:
    """The centre and half-width of a bounded box (the tanh actor's [-1, 1] maps onto it)."""
    low = np.asarray(space.low, np.float32).reshape(space.shape)
    high = np.asarray(space.high, np.float32).reshape(space.shape)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ConfigError(
            f"maddpg maps its tanh actors onto the action box, but an agent's box has bounds "
            f"low={low.tolist()} high={high.tolist()}; give the env finite bounds"
        )
    return (high + low) / 2, (high - low) / 2


def action_boxes(spaces: list[SpaceInfo]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The centre and half-width of every box agent's actions, by the agent's index (the
    agent's critic encoding and the policy's, one table)."""
    return {j: _box(space) for j, space in enumerate(spaces) if space.kind != "discrete"}


class MADDPGAgent(ReplayRatioAgent):
    """Replay, exploration, random warm-up and the replay-ratio schedule around
    :class:`MADDPG`. Observations, actions and rewards are agent-keyed dicts."""

    independent_transitions = True
    algorithm: MADDPG
    config: MADDPGConfig

    def __init__(
        self,
        algorithm: MADDPG,
        info: EnvInfo,
        config: MADDPGConfig,
        *,
        seed: int = 0,
        total_steps: int = 1,
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        if not info.multi_agent:
            raise ConfigError(f"maddpg is multi-agent, but {info.env_id!r} is a single-agent env")
        self.name = "maddpg"
        self.rollout_len = max(1, config.train_freq // info.num_envs)
        self.agents = info.agents
        self.spaces = algorithm.act_spaces
        self.boxes = action_boxes(self.spaces)
        a = algorithm
        self.replay = JointReplay(
            config.buffer_size, sum(a.obs_dims), sum(a.act_dims), len(self.agents)
        )

    # -- acting ------------------------------------------------------------------------------
    def policy(self) -> MADDPGPolicy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    # -- experience --------------------------------------------------------------------------
    def _critic_actions(self, actions: Any, n: int) -> np.ndarray:
        """Env actions as the critics read them: one-hot, or the box mapped to [-1, 1]."""
        parts = []
        for j, (agent, space) in enumerate(zip(self.agents, self.spaces, strict=True)):
            a = np.asarray(actions[agent])
            if space.kind == "discrete":
                onehot = np.zeros((n, space.n), np.float32)
                onehot[np.arange(n), a.reshape(n).astype(np.int64)] = 1.0
                parts.append(onehot)
            else:
                centre, half = self.boxes[j]
                scaled = np.clip((a.reshape(n, *centre.shape) - centre) / half, -1.0, 1.0)
                parts.append(scaled.reshape(n, -1).astype(np.float32))
        return np.concatenate(parts, axis=1)

    def _joint_obs(self, obs: Any, n: int) -> np.ndarray:
        return np.concatenate(
            [np.asarray(obs[a], np.float32).reshape(n, -1) for a in self.agents], axis=1
        )

    def observe(self, transition: Transition) -> None:
        t = transition
        n = len(t.terminated)
        self.replay.add(
            {
                "obs": self._joint_obs(t.obs, n),
                "actions": self._critic_actions(t.actions, n),
                "rewards": np.stack(
                    [np.asarray(t.rewards[a], np.float32).reshape(n) for a in self.agents], 1
                ),
                "next_obs": self._joint_obs(t.next_obs, n),
                "dones": np.asarray(t.terminated, np.float32).reshape(n),
            }
        )
        self.env_steps += n

    def replay_batch(self) -> JointBatch:
        c = self.config
        rows = self.replay.sample(c.batch_size, self.rng)

        def gumbel() -> list[np.ndarray | None]:
            return [
                self.rng.gumbel(size=(c.batch_size, s.n)).astype(np.float32)
                if s.kind == "discrete"
                else None
                for s in self.spaces
            ]

        return JointBatch(
            rows["obs"],
            rows["actions"],
            rows["rewards"],
            rows["next_obs"],
            rows["dones"],
            gumbel(),
            gumbel(),
        )


class MADDPGPolicy(BoundPolicy):
    """How MADDPG acts (:class:`~harness.policy.Policy`), every agent from its own observation
    (agent-keyed dicts of rows in and out), with no per-env state and no extras. Greedy: a
    discrete agent's argmax, a box agent's tanh actor mapped onto its box (``boxes``: the
    centre and half-width of agent ``j``'s). Exploring: uniform random actions while the agent
    has observed fewer than ``learning_starts`` env steps (``env_steps()``, read at each
    step), then a discrete agent's policy sample (argmax of logits plus Gumbel noise) and a box
    agent's action plus N(0, ``noise``) clipped into the box, drawn agent by agent from
    ``rng()`` (read at each step: the agent's own generator, or a farm actor's, whatever the
    caller gave no generator of its own). ``load`` loads the learner's weights into the
    algorithm; ``program`` describes the greedy policy (None: not exportable). Made by
    :func:`make_policy`."""

    def __init__(
        self,
        algorithm: MADDPG,
        rng: Callable[[], np.random.Generator],
        boxes: Mapping[int, tuple[np.ndarray, np.ndarray]],
        *,
        noise: float,
        learning_starts: int,
        env_steps: Callable[[], int],
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None] | None = None,
    ) -> None:
        self.algorithm, self.rng, self.boxes = algorithm, rng, boxes
        self.agents, self.spaces = algorithm.agents, algorithm.act_spaces
        self.learning_starts, self.env_steps = learning_starts, env_steps
        self.noise = noise
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
            return self._greedy(obs), {}, state
        rng = self.rng() if rng is None else rng
        if self.env_steps() < self.learning_starts:
            return self._uniform(batch_size(obs), rng), {}, state
        outs = self.algorithm.outputs(obs)
        actions = {}
        for j, (agent, space) in enumerate(zip(self.agents, self.spaces, strict=True)):
            if space.kind == "discrete":  # argmax(logits + Gumbel noise): a policy sample
                gumbel = rng.gumbel(size=outs[j].shape)
                actions[agent] = np.argmax(outs[j] + gumbel, axis=-1).astype(np.int64)
            else:
                noise = rng.normal(0.0, self.noise, outs[j].shape)
                actions[agent] = self._to_env(j, np.clip(np.tanh(outs[j]) + noise, -1.0, 1.0))
        return actions, {}, state

    def _greedy(self, obs: Obs) -> dict[str, np.ndarray]:
        outs = self.algorithm.outputs(obs)
        actions = {}
        for j, (agent, space) in enumerate(zip(self.agents, self.spaces, strict=True)):
            if space.kind == "discrete":
                actions[agent] = np.argmax(outs[j], axis=-1).astype(np.int64)
            else:
                actions[agent] = self._to_env(j, np.tanh(outs[j]))
        return actions

    def _uniform(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        actions = {}
        for j, (agent, space) in enumerate(zip(self.agents, self.spaces, strict=True)):
            if space.kind == "discrete":
                actions[agent] = rng.integers(0, space.n, n).astype(np.int64)
            else:
                actions[agent] = self._to_env(j, rng.uniform(-1.0, 1.0, (n, space.flat_dim)))
        return actions

    def _to_env(self, j: int, action: np.ndarray) -> np.ndarray:
        """A box agent's [-1, 1] action in the env's box."""
        centre, half = self.boxes[j]
        env_action: np.ndarray = centre + half * action.reshape(len(action), *centre.shape)
        return env_action.astype(np.float32)


def make_policy(parts: ActingParts) -> MADDPGPolicy:
    """MADDPG's policy made from ``parts`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`): on ``parts.algorithm``'s actors, the warm-up read from
    ``parts.env_steps`` at each step, exploring with ``parts.rng`` (read at each step too) and
    ``parts.config``'s noise, loading through ``parts.set_weights``. MADDPG's actors are not
    exported (agent-keyed batches): no program."""
    algorithm: MADDPG = parts.algorithm
    config: MADDPGConfig = parts.config
    return MADDPGPolicy(
        algorithm,
        lambda: parts.rng,
        action_boxes(algorithm.act_spaces),
        noise=config.exploration_noise,
        learning_starts=config.learning_starts,
        env_steps=lambda: parts.env_steps,
        load=parts.set_weights,
    )


def make_algorithm(backend: Backend, info: EnvInfo, config: MADDPGConfig) -> MADDPG:
    """The networks of every agent (what a farm actor acts with, and the agent's)."""
    if not info.multi_agent:
        raise ConfigError(f"maddpg is multi-agent, but {info.env_id!r} is a single-agent env")
    return MADDPG(backend, info, config)


def make_agent(
    info: EnvInfo, backend: Backend, config: MADDPGConfig, *, seed: int = 0, total_steps: int = 1
) -> MADDPGAgent:
    return MADDPGAgent(
        make_algorithm(backend, info, config), info, config, seed=seed, total_steps=total_steps
    )
