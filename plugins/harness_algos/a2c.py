"""A2C (Mnih et al. 2016), synchronous advantage actor-critic as in Stable-Baselines3: short
rollouts over vectorized envs, GAE (lambda 1 by default: plain n-step returns), one update per
rollout on policy loss + value loss - entropy bonus. Discrete (categorical) and box (diagonal
Gaussian) actions. Backend-neutral; the policy plumbing and rollouts are in onpolicy.py.

On an actor farm (``run.actors > 0``) the rollouts stay synchronous: the agent is on-policy, so
every actor steps with the newest weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import RolloutBatch
from harness_algos.moments import check_normalization
from harness_algos.onpolicy import ActorCritic, RolloutAgent, actor_critic_mlp


@dataclass
class A2CConfig:
    """A2C hyper-parameters ([algo] section). Defaults are SB3's, except the optimiser: SB3
    uses RMSprop (alpha 0.99, eps 1e-5), the backends offer Adam, so this is Adam with eps 1e-5
    (it reaches the same CartPole scores; see competitions/cartpole/a2c.toml)."""

    normalize_obs: bool = False
    """Standardise observations by their running mean and variance (per feature). The
    statistics are part of the policy: they change only at an update (from the observations of
    the rollout just learned from), travel to farm actors with the weights and are saved in
    checkpoints, so acting, storing and learning use one set; evaluation uses them frozen."""
    normalize_reward: bool = False
    """Scale the rewards the learner stores by the running standard deviation of the
    discounted return (VecNormalize's ``norm_reward``; returns in logs stay the env's)."""
    clip_obs: float = 10.0
    """Normalised observations are clipped to [-clip_obs, clip_obs]."""
    clip_reward: float = 10.0
    """Scaled rewards are clipped to [-clip_reward, clip_reward]."""
    learning_rate: float = 7e-4
    """Adam step size (annealed linearly to 0 when anneal_lr)."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over the run."""
    n_steps: int = 5
    """Vector steps per rollout (per env); one update per rollout of n_steps * num_envs samples."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the classic n-step returns of A2C."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantage: bool = False
    """Standardise the advantages of each rollout (off in SB3's A2C)."""
    adam_eps: float = 1e-5
    """Adam epsilon (SB3's RMSprop epsilon)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the (separate) actor and critic networks."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    log_std_init: float = 0.0
    """Initial log standard deviation for box actions."""

    def __post_init__(self) -> None:
        check_normalization(self.clip_obs, self.clip_reward)
        if self.n_steps < 1:
            raise ValueError("n_steps must be >= 1")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda = {self.gae_lambda} must be in [0, 1]")


class A2C(ActorCritic):
    """The actor-critic loss and its single gradient step per rollout."""

    def __init__(self, backend: Backend, info: EnvInfo, config: A2CConfig) -> None:
        super().__init__(backend, info, config.log_std_init)
        self.config = config
        self.net = actor_critic_mlp(backend, info, config.hidden, config.activation)
        self.optimizer = backend.optimizer(
            *self.trainable(self.net), lr=config.learning_rate, eps=config.adam_eps
        )
        self.refresh_policy()

    def acting_model(self) -> Any:
        return self.net

    def checkpoint_parts(self) -> dict[str, Any]:
        return {"net": self.net, "optimizer": self.optimizer}

    def act(
        self,
        x: np.ndarray,
        rnn: np.ndarray | None,
        rng: np.random.Generator | None,
        noise: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Actions sampled with ``rng`` (greedy without one) and, exploring, the unclipped
        actions (what the Gaussian's log-probability is taken of) and the state values as
        extras, from one numpy forward pass of both networks (feed-forward: no state)."""
        out, value = self._policy(x)
        actions = self.sample_actions(out, rng)
        return actions, {} if rng is None else {"action": actions, "value": value[:, 0]}, None

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(obs)[1][:, 0], np.float32)

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """One step on ``-mean(A * log pi(a|s)) + vf_coef * mse(V, R) - ent_coef * H``."""
        bk, c = self.backend, self.config
        obs = bk.tensor(batch.obs)
        actions = bk.tensor(batch.actions, self.action_dtype)
        adv, returns = bk.tensor(batch.advantages), bk.tensor(batch.returns)
        with bk.autocast():
            out, value = self.net(obs)
            dist = self.distribution(out)
            pg_loss = -bk.mean(adv * dist.log_prob(actions))
            v_loss = bk.mean(bk.mse(value[:, 0], returns))
            entropy = bk.mean(dist.entropy())
            loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * entropy
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        return {
            "losses/policy_loss": bk.item(pg_loss),
            "losses/value_loss": bk.item(v_loss),
            "losses/entropy": bk.item(entropy),
            "losses/grad_norm": grad_norm,
        }


class A2CAgent(RolloutAgent):
    """GAE and the one update per rollout around :class:`A2C` (rollout collection and
    truncation bootstrapping: :class:`~harness_algos.onpolicy.RolloutAgent`)."""

    name = "a2c"
    algorithm: A2C
    config: A2CConfig

    def __init__(
        self, algorithm: A2C, info: EnvInfo, config: A2CConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(
            algorithm, info, config, config.n_steps, seed=seed, total_steps=total_steps
        )

    def learn_rollout(self, next_obs: np.ndarray) -> dict[str, float]:
        c = self.config
        self.buffer.compute_gae(self.algorithm.values(next_obs), c.gamma, c.gae_lambda)
        metrics = self.algorithm.learn(self.whole_rollout(c.normalize_advantage))
        self.updates += 1
        return metrics


def make_agent(
    info: EnvInfo, backend: Backend, config: A2CConfig, *, seed: int = 0, total_steps: int = 1
) -> A2CAgent:
    return A2CAgent(A2C(backend, info, config), info, config, seed=seed, total_steps=total_steps)
