"""Vanilla policy gradient: REINFORCE (Williams 1992) with a learned state-value baseline.
Discrete (categorical) and box (diagonal Gaussian) actions. Backend-neutral; the policy
plumbing and rollouts are in onpolicy.py.

Experience comes in fixed-length rollouts of ``n_steps`` per env, like the other on-policy
algorithms, rather than whole episodes: the return-to-go of each step is the discounted sum of
the rewards after it, cut at episode ends and completed with ``V`` only where the rollout (or a
time limit) cuts an episode short. The advantage ``G_t - V(s_t)`` drives one policy-gradient
step per rollout; the baseline is then fitted to the returns with its own optimiser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import RolloutBatch
from harness_algos.moments import check_normalization
from harness_algos.onpolicy import ActorCritic, RolloutAgent, annealed


@dataclass
class PGConfig:
    """Policy-gradient hyper-parameters ([algo] section); defaults solve CartPole-v1."""

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
    learning_rate: float = 1e-3
    """Adam step size of the policy (annealed linearly to 0 when anneal_lr)."""
    vf_learning_rate: float = 1e-3
    """Adam step size of the value baseline."""
    anneal_lr: bool = False
    """Anneal both learning rates linearly to 0 over the run."""
    n_steps: int = 128
    """Vector steps per rollout (per env); one policy step per rollout of n_steps * num_envs
    samples."""
    gamma: float = 0.99
    """Discount factor."""
    value_steps: int = 5
    """Gradient steps of the baseline on each rollout's returns (whole-rollout batches)."""
    normalize_advantage: bool = True
    """Standardise the advantages of each rollout."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (policy and baseline steps alike)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the policy and of the (separate) value network."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    log_std_init: float = 0.0
    """Initial log standard deviation for box actions."""

    def __post_init__(self) -> None:
        check_normalization(self.clip_obs, self.clip_reward)
        if self.n_steps < 1 or self.value_steps < 0:
            raise ValueError("n_steps must be >= 1 and value_steps >= 0")


class PG(ActorCritic):
    """The policy-gradient step and the baseline's regression steps."""

    def __init__(self, backend: Backend, info: EnvInfo, config: PGConfig) -> None:
        super().__init__(backend, info, config.log_std_init)
        self.config = config
        obs_dim = info.observation.flat_dim
        # two networks with two optimisers: the baseline's extra steps leave the policy alone
        self.policy = backend.mlp(
            obs_dim, config.hidden, self.act_dim, activation=config.activation, out_gain=0.01
        )
        self.critic = backend.mlp(obs_dim, config.hidden, 1, activation=config.activation)
        self.pi_optimizer = backend.optimizer(*self.trainable(self.policy), lr=config.learning_rate)
        self.vf_optimizer = backend.optimizer(self.critic, lr=config.vf_learning_rate)
        self.refresh_policy()

    def acting_model(self) -> Any:
        """The policy only: actors never need the baseline."""
        return self.policy

    def checkpoint_parts(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "critic": self.critic,
            "pi_optimizer": self.pi_optimizer,
            "vf_optimizer": self.vf_optimizer,
        }

    def refresh_policy(self) -> None:
        """Take the numpy copies of the networks (after any weight change)."""
        super().refresh_policy()
        self._critic = self.backend.inference(self.critic)

    def act(
        self,
        x: np.ndarray,
        rnn: np.ndarray | None,
        rng: np.random.Generator | None,
        noise: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Actions sampled with ``rng`` (greedy without one) on the numpy copy of the policy,
        exploring with the unclipped actions as the extra (the learner scores the values)."""
        actions = self.sample_actions(self._policy(x), rng)
        return actions, {} if rng is None else {"action": actions}, None

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._critic(obs)[:, 0], np.float32)

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """One policy step on ``-mean(A * log pi(a|s)) - ent_coef * H``, then ``value_steps``
        baseline steps on ``mse(V(s), G)``."""
        bk, c = self.backend, self.config
        obs = bk.tensor(batch.obs)
        actions = bk.tensor(batch.actions, self.action_dtype)
        adv, returns = bk.tensor(batch.advantages), bk.tensor(batch.returns)
        with bk.autocast():
            dist = self.distribution(self.policy(obs))
            pg_loss = -bk.mean(adv * dist.log_prob(actions))
            entropy = bk.mean(dist.entropy())
            loss = pg_loss - c.ent_coef * entropy
        grad_norm = bk.update(self.pi_optimizer, loss, max_grad_norm=c.max_grad_norm)
        metrics = {
            "losses/policy_loss": bk.item(pg_loss),
            "losses/entropy": bk.item(entropy),
            "losses/grad_norm": grad_norm,
        }
        for _ in range(c.value_steps):
            with bk.autocast():
                v_loss = bk.mean(bk.mse(self.critic(obs)[:, 0], returns))
            bk.update(self.vf_optimizer, v_loss, max_grad_norm=c.max_grad_norm)
            metrics["losses/value_loss"] = bk.item(v_loss)  # (before the last step)
        return metrics

    def set_schedule(self, progress: float) -> float:
        """Anneal the learning rates; ``progress`` in [0, 1]. Returns the policy's lr."""
        c = self.config
        lr = annealed(c.learning_rate, progress, c.anneal_lr)
        self.backend.set_lr(self.pi_optimizer, lr)
        self.backend.set_lr(self.vf_optimizer, annealed(c.vf_learning_rate, progress, c.anneal_lr))
        return lr


class PGAgent(RolloutAgent):
    """The returns-to-go and the one update per rollout around :class:`PG` (rollout
    collection and truncation bootstrapping: :class:`~harness_algos.onpolicy.RolloutAgent`)."""

    name = "pg"
    algorithm: PG
    config: PGConfig

    def __init__(
        self, algorithm: PG, info: EnvInfo, config: PGConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(
            algorithm, info, config, config.n_steps, seed=seed, total_steps=total_steps
        )

    def learn_rollout(self, next_obs: np.ndarray) -> dict[str, float]:
        c = self.config
        # (sample() leaves the values out; log-probs are not needed)
        last_values = self.score_rollout(next_obs)
        # GAE with lambda = 1 is exactly the discounted return-to-go, cut at episode ends and
        # bootstrapped from V(last obs) where the rollout cuts an episode, minus V(s_t)
        self.buffer.compute_gae(last_values, c.gamma, 1.0)
        metrics = self.algorithm.learn(self.whole_rollout(c.normalize_advantage))
        self.updates += 1
        return metrics


def make_agent(
    info: EnvInfo, backend: Backend, config: PGConfig, *, seed: int = 0, total_steps: int = 1
) -> PGAgent:
    return PGAgent(PG(backend, info, config), info, config, seed=seed, total_steps=total_steps)
