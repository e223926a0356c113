"""REINFORCE (Williams 1992) with a learned value baseline, written against harness's Backend
interface: every framework call goes through ``self.backend``, so it runs on any backend plugin.

The agent collects complete episodes from every env and updates once it has
``episodes_per_update`` of them (one gradient step on ``-log pi(a|s) * (G - V(s))`` plus the
baseline's regression loss). Monte Carlo returns only: an episode cut by the time limit is
treated as finished, and a partly collected episode is not checkpointed (the runner resets its
envs on resume anyway). Discrete actions only.

Acting is a :class:`harness.policy.Policy` (:class:`ReinforcePolicy`) made by
:func:`make_policy` from :class:`harness.policy.ActingParts`: the agent (``Agent.policy()``
is ``make_policy(self)``) or, in a farm actor, the algorithm alone (the plugin declares
``make_algorithm`` and ``make_policy``: no agent in the actor). It issues no framework
operation, sampling from the logits of a numpy copy of the policy network
(``backend.inference``) with the parts' generator (the agent's is checkpointed). That copy
does not follow the network, so the algorithm takes a new one whenever the weights change:
after an update, ``load_state`` (resume, evaluation) and ``set_policy_weights`` (a farm
actor's ``Policy.load``). It keeps no per-env state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.errors import IncompatibleError
from harness.policy import ActingParts, Policy, State


@dataclass
class ReinforceConfig:
    """REINFORCE hyper-parameters ([algo] section)."""

    learning_rate: float = 0.01
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor for the returns-to-go."""
    episodes_per_update: int = 16
    """Complete episodes per gradient step."""
    rollout_len: int = 16
    """Vector steps between two learn() calls (one runner iteration)."""
    hidden: list[int] = field(default_factory=lambda: [32])
    """Hidden widths of the policy and baseline networks."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    vf_coef: float = 0.5
    """Weight of the baseline's squared-error loss."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        if self.episodes_per_update < 1 or self.rollout_len < 1:
            raise ValueError("episodes_per_update and rollout_len must be >= 1")


class EpisodeBatch(NamedTuple):
    obs: np.ndarray
    actions: np.ndarray
    returns: np.ndarray


class Reinforce(Algorithm):
    """The policy-gradient update with a value baseline."""

    def __init__(self, backend: Backend, info: EnvInfo, config: ReinforceConfig) -> None:
        super().__init__(backend)
        self.config = config
        obs_dim, act = info.observation.flat_dim, config.activation
        self.policy = backend.mlp(
            obs_dim, config.hidden, info.action.n, activation=act, out_gain=0.01
        )
        self.baseline = backend.mlp(obs_dim, config.hidden, 1, activation=act)
        self.net = backend.group(policy=self.policy, baseline=self.baseline)
        self.optimizer = backend.optimizer(self.net, lr=config.learning_rate)
        self.refresh_policy()

    def refresh_policy(self) -> None:
        """Take the numpy copy that acting uses; after every change of the policy weights."""
        self.acting = self.backend.inference(self.policy)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self.acting(obs), np.float64)

    def learn(self, batch: EpisodeBatch) -> dict[str, float]:
        bk, c = self.backend, self.config
        obs, returns = bk.tensor(batch.obs), bk.tensor(batch.returns)
        with bk.no_grad():
            baseline = bk.numpy(self.baseline(obs)[:, 0])
        advantages = bk.tensor(batch.returns - baseline)
        dist = bk.categorical(self.policy(obs))
        log_prob = dist.log_prob(bk.tensor(batch.actions, "int64"))
        policy_loss = -bk.mean(log_prob * advantages)
        value_loss = bk.mean(bk.mse(self.baseline(obs)[:, 0], returns))
        entropy = bk.mean(dist.entropy())
        loss = policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        self.refresh_policy()
        return {
            "losses/policy_loss": bk.item(policy_loss),
            "losses/value_loss": bk.item(value_loss),
            "losses/entropy": bk.item(entropy),
            "losses/grad_norm": grad_norm,
        }

    def state(self) -> dict[str, Any]:
        return {
            "net": self.backend.state(self.net),
            "optimizer": self.backend.state(self.optimizer),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.backend.load_state(self.net, state["net"])
        self.backend.load_state(self.optimizer, state["optimizer"])
        self.refresh_policy()

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.policy)

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.policy, weights)
        self.refresh_policy()


class ReinforcePolicy(Policy):
    """Samples (exploring) or takes the argmax (greedy) of the algorithm's numpy logits; no
    per-env state. Everything comes from ``parts``, read at each call: the algorithm, the
    generator (an agent's, which checkpoints save and restore) and ``set_weights``."""

    def __init__(self, parts: ActingParts) -> None:
        self.parts = parts

    def act(
        self,
        obs: np.ndarray,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], State]:
        logits = self.parts.algorithm.logits(obs)
        if not explore:
            return logits.argmax(axis=1).astype(np.int64), {}, state
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        u = (self.parts.rng if rng is None else rng).random((len(cdf), 1))  # inverse-CDF
        actions = np.minimum((u > cdf).sum(axis=1), cdf.shape[1] - 1)
        return actions.astype(np.int64), {}, state

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.parts.set_weights(weights)
        self.version = version


def make_policy(parts: ActingParts) -> ReinforcePolicy:
    """The policy of ``parts`` (an agent, or a farm actor's :class:`harness.policy.Acting`
    around ``Reinforce`` alone): what ``AlgorithmSpec.make_policy`` declares."""
    return ReinforcePolicy(parts)


class ReinforceAgent(Agent):
    """Collects complete episodes per env; learns once enough have finished."""

    algorithm: Reinforce
    config: ReinforceConfig

    def __init__(
        self, algorithm: Reinforce, info: EnvInfo, config: ReinforceConfig, *, seed: int = 0
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed)
        self.name = "example_reinforce"
        self.on_policy = True
        self.rollout_len = config.rollout_len
        self.open: list[list[tuple[np.ndarray, int, float]]] = [[] for _ in range(info.num_envs)]
        self.finished: list[list[tuple[np.ndarray, int, float]]] = []

    def policy(self) -> ReinforcePolicy:
        return make_policy(self)

    def observe(self, transition: Transition) -> None:
        t = transition
        self.env_steps += len(t.obs)
        for i in range(len(t.obs)):
            self.open[i].append((t.obs[i], int(t.actions[i]), float(t.rewards[i])))
            if t.terminated[i] or t.truncated[i]:
                self.finished.append(self.open[i])
                self.open[i] = []

    def learn(self) -> dict[str, float]:
        if len(self.finished) < self.config.episodes_per_update:
            return {}
        episodes, self.finished = self.finished, []
        metrics = self.algorithm.learn(self._batch(episodes))
        self.updates += 1
        metrics["charts/update_episodes"] = float(len(episodes))
        return metrics

    def _batch(self, episodes: list[list[tuple[np.ndarray, int, float]]]) -> EpisodeBatch:
        obs, actions, returns = [], [], []
        for episode in episodes:
            g = 0.0
            to_go = []
            for _, _, reward in reversed(episode):
                g = reward + self.config.gamma * g
                to_go.append(g)
            obs += [o for o, _, _ in episode]
            actions += [a for _, a, _ in episode]
            returns += reversed(to_go)
        return EpisodeBatch(
            np.asarray(obs, np.float32),
            np.asarray(actions, np.int64),
            np.asarray(returns, np.float32),
        )


def make_agent(
    info: EnvInfo,
    backend: Backend,
    config: ReinforceConfig,
    *,
    seed: int = 0,
    total_steps: int = 1,
) -> ReinforceAgent:
    """``seed`` seeds the agent's sampling generator; ``total_steps`` is unused (nothing is
    scheduled over the run)."""
    if info.action.kind != "discrete":
        raise IncompatibleError(
            f"example_reinforce needs discrete actions; {info.env_id!r} has a "
            f"{info.action.kind} action space."
        )
    return ReinforceAgent(Reinforce(backend, info, config), info, config, seed=seed)
