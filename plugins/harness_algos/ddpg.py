"""DDPG (Lillicrap et al. 2016) with the multi-head ensemble of PARL's winning NeurIPS 2018
AI-for-Prosthetics solution (Zeng, Zhou et al., in Kidzinski et al. 2019, arXiv:1902.02441).

``ensemble = K`` trains K actor-critic heads side by side on the same minibatches, each with its
own target networks (evaluated together: one batched matrix product per layer). While
collecting, each env follows one head for a whole episode (drawn again when the episode ends),
plus Gaussian noise, so the heads' disagreement spreads exploration. Greedy acting asks every
head for an action, scores each candidate with every critic and takes the action whose mean
Q-value is highest. ``ensemble = 1`` is plain DDPG. Backend-neutral; the replay and schedule
are in offpolicy.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import ReplayBatch
from harness.errors import IncompatibleError
from harness.numpy_nets import Activation, Op, layers_of
from harness.policy import ActingParts, State
from harness_algos import offpolicy
from harness_algos.offpolicy import (
    ContinuousActorCritic,
    OffPolicyAgent,
    OffPolicyPolicy,
    check_actor_critic,
    check_replay,
    flat,
    gaussian_explore,
)


@dataclass
class DDPGConfig:
    """DDPG hyper-parameters ([algo] section); defaults are SB3's."""

    learning_rate: float = 1e-3
    """Adam step size of every network (and of SAC's entropy coefficient)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks (1.0 = hard copy)."""
    hidden: list[int] = field(default_factory=lambda: [400, 300])
    """Hidden widths of the actor and of each critic."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions."""
    learning_starts: int = 100
    """Env steps of uniformly random actions before the first update."""
    train_freq: int = 1
    """Env steps (summed over envs) per ``gradient_steps`` updates."""
    gradient_steps: int = 1
    """Updates per ``train_freq`` env steps (the replay ratio is their quotient)."""
    exploration_noise: float = 0.1
    """Std of the Gaussian exploration noise (in [-1, 1] action units)."""
    ensemble: int = 1
    """Actor-critic heads (PARL's prosthetics solution); 1 = plain DDPG."""

    def __post_init__(self) -> None:
        check_replay(self.train_freq, self.gradient_steps, self.batch_size)
        check_actor_critic(self.batch_size, self.tau)
        if self.ensemble < 1:
            raise ValueError(f"ensemble = {self.ensemble} must be >= 1")


class DDPG(ContinuousActorCritic):
    """Critic regression on r + gamma * Q'(s', mu'(s')) and the deterministic policy gradient,
    for every head at once."""

    saved = ("actors", "actors_target", "critics", "critics_target", "actor_opt", "critic_opt")

    def __init__(self, backend: Backend, info: EnvInfo, config: DDPGConfig) -> None:
        super().__init__(backend)
        self.config = config
        k = self.heads = config.ensemble
        obs_dim, self.act_dim = info.observation.flat_dim, info.action.flat_dim
        hidden, act = config.hidden, config.activation
        self.actors, self.actors_target = (
            backend.parallel_mlp(obs_dim, hidden, [self.act_dim] * k, activation=act)
            for _ in range(2)
        )
        self.critics, self.critics_target = (
            backend.parallel_mlp(obs_dim + self.act_dim, hidden, [1] * k, activation=act)
            for _ in range(2)
        )
        backend.copy_weights(self.actors_target, self.actors)
        backend.copy_weights(self.critics_target, self.critics)
        self.actor_opt = backend.optimizer(self.actors, lr=config.learning_rate)
        self.critic_opt = backend.optimizer(self.critics, lr=config.learning_rate)
        self._actors: Any = None  # numpy copies, taken when acting needs them
        self._critics: Any = None

    def head_actions(self, obs: np.ndarray) -> np.ndarray:
        """Every head's greedy action: ``(K, B, act_dim)`` in [-1, 1]."""
        if self._actors is None:
            self._actors = self.backend.inference(self.actors)
        return np.asarray(np.tanh(np.stack(self._actors(obs))))

    def actor_layers(self) -> tuple[Op, ...] | None:
        """One actor (``algo.ensemble = 1``) as policy-program ops: ``tanh`` of its output.
        An ensemble picks each action by its critics' scores, which is not exported."""
        if self.heads > 1:
            raise IncompatibleError(
                f"ddpg with algo.ensemble = {self.heads} picks each action by its critics' "
                f"scores; harness export needs algo.ensemble = 1."
            )
        if self._actors is None:
            self._actors = self.backend.inference(self.actors)
        layers = layers_of(self._actors, 0)
        return None if layers is None else (*layers, Activation("tanh"))

    def act(self, obs: np.ndarray) -> np.ndarray:
        candidates = self.head_actions(obs)
        if self.heads == 1:
            return np.asarray(candidates[0])
        if self._critics is None:
            self._critics = self.backend.inference(self.critics)
        o = flat(np.asarray(obs, np.float32))
        # mean over critics of Q(s, candidate j), for each candidate j: (K candidates, B)
        scores = np.stack(
            [np.mean(self._critics(np.concatenate([o, a], -1)), axis=0)[:, 0] for a in candidates]
        )
        best = scores.argmax(0)
        return np.asarray(candidates[best, np.arange(len(o))])

    def explore(
        self, obs: np.ndarray, rng: np.random.Generator, heads: np.ndarray | None = None
    ) -> np.ndarray:
        """Head ``heads[i]``'s action for row ``i`` (head 0 without ``heads``) plus noise."""
        candidates = self.head_actions(obs)
        rows = np.arange(len(obs))
        actions = candidates[np.zeros(len(obs), np.int64) if heads is None else heads, rows]
        return gaussian_explore(actions, self.config.exploration_noise, rng)

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        obs, next_obs = bk.tensor(flat(batch.obs)), bk.tensor(flat(batch.next_obs))
        actions = bk.tensor(flat(batch.actions))
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        with bk.autocast():
            with bk.no_grad():
                next_actions = [bk.tanh(a) for a in self.actors_target(next_obs)]
                next_q = self.critics_target([bk.concat([next_obs, a]) for a in next_actions])
                targets = [rewards + c.gamma * (1.0 - dones) * q[:, 0] for q in next_q]
            qs = self.critics(bk.concat([obs, actions]))
            critic_loss = sum(
                (bk.mean(bk.mse(q[:, 0], t)) for q, t in zip(qs, targets, strict=True)), 0.0
            )
        bk.update(self.critic_opt, critic_loss)
        with bk.autocast(), bk.frozen(self.critics):
            own = [bk.concat([obs, bk.tanh(a)]) for a in self.actors(obs)]
            actor_loss = -sum((bk.mean(q) for q in self.critics(own)), 0.0)
        bk.update(self.actor_opt, actor_loss)
        bk.copy_weights(self.actors_target, self.actors, tau=c.tau)
        bk.copy_weights(self.critics_target, self.critics, tau=c.tau)
        self._actors = self._critics = None
        if not diagnostics:
            return {}
        return {
            "losses/critic_loss": bk.item(critic_loss) / self.heads,
            "losses/actor_loss": bk.item(actor_loss) / self.heads,
            "losses/q_values": bk.item(bk.mean(qs[0])),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self._actors = self._critics = None

    def policy_weights(self) -> dict[str, np.ndarray]:
        # greedy acting with several heads also needs the critics
        weights = {f"actors.{k}": v for k, v in self.backend.get_weights(self.actors).items()}
        if self.heads > 1:
            critics = self.backend.get_weights(self.critics)
            weights.update({f"critics.{k}": v for k, v in critics.items()})
        return weights

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for prefix in ("actors", "critics"):
            part = {k.split(".", 1)[1]: v for k, v in weights.items() if k.startswith(prefix + ".")}
            if part:
                self.backend.set_weights(getattr(self, prefix), part)
        self._actors = self._critics = None


class EnsemblePolicy(OffPolicyPolicy):
    """DDPG's :class:`~harness_algos.offpolicy.OffPolicyPolicy` with ``heads`` > 1: each env
    explores with one head for a whole episode, its per-env state ``head`` (-1: not drawn
    yet). An exploratory step first draws the head of every row without one (the rows of a
    fresh state: ``initial_state``), and :meth:`reset` draws new heads for the rows whose
    episodes ended, from the agent's generator, as the agent drew them before it had a policy
    (its first heads when it was made, then at each episode end). Greedy acting scores every
    head's action and ignores the state."""

    algorithm: DDPG

    def __init__(self, algorithm: DDPG, rng: np.random.Generator, **parts: Any) -> None:
        super().__init__(algorithm, rng, **parts)
        self.heads = algorithm.heads

    def initial_state(self, rows: int) -> State:
        return {"head": np.full(rows, -1, np.int64)}

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if explore:
            state = self._drawn(state, self.rng if rng is None else rng)
        return super().act(obs, state, rng, explore=explore)

    def explore(self, obs: np.ndarray, state: State, rng: np.random.Generator) -> np.ndarray:
        return self.algorithm.explore(obs, rng, state["head"])

    def reset(self, state: State, mask: np.ndarray, *, explore: bool) -> State:
        if not explore:
            return super().reset(state, mask, explore=explore)
        ended = np.flatnonzero(mask)
        if not len(ended):
            return state
        head = np.array(state["head"], copy=True)
        head[ended] = self.rng.integers(self.heads, size=len(ended))
        return {"head": head}

    def _drawn(self, state: State, rng: np.random.Generator) -> State:
        """``state`` with a head drawn for every row that has none."""
        undrawn = state["head"] < 0
        if not undrawn.any():
            return state
        head = np.array(state["head"], copy=True)
        head[undrawn] = rng.integers(self.heads, size=int(undrawn.sum()))
        return {"head": head}


class DDPGAgent(OffPolicyAgent):
    """The shared off-policy agent; with an ensemble, its policy keeps a head per env
    (:class:`EnsemblePolicy`)."""

    algorithm: DDPG

    def __init__(
        self, algorithm: DDPG, info: EnvInfo, config: DDPGConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, name="ddpg", seed=seed, total_steps=total_steps)

    def policy(self) -> OffPolicyPolicy:
        return make_policy(self)


def make_policy(parts: ActingParts) -> OffPolicyPolicy:
    """DDPG's policy made from ``parts`` (an agent or a farm actor's
    :class:`~harness.policy.Acting`): with one head, :class:`OffPolicyPolicy` (no state, as
    TD3's); with more, :class:`EnsemblePolicy`."""
    if parts.algorithm.heads == 1:
        return offpolicy.make_policy(parts, "ddpg")
    return EnsemblePolicy(parts.algorithm, parts.rng, **offpolicy.policy_parts(parts, "ddpg"))


def make_agent(
    info: EnvInfo, backend: Backend, config: DDPGConfig, *, seed: int = 0, total_steps: int = 1
) -> DDPGAgent:
    return DDPGAgent(DDPG(backend, info, config), info, config, seed=seed, total_steps=total_steps)
