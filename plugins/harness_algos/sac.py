"""SAC (Haarnoja et al. 2018, the version with automatic entropy tuning): a tanh-squashed
Gaussian actor, twin critics with the smaller soft target, and a learned entropy coefficient
that holds the policy's entropy near a target. Backend-neutral; the replay and schedule are in
offpolicy.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from harness.api import Backend, EnvInfo, Tensor
from harness.data import ReplayBatch
from harness.policy import ActingParts
from harness_algos import offpolicy
from harness_algos.offpolicy import (
    ContinuousActorCritic,
    OffPolicyAgent,
    check_actor_critic,
    check_replay,
    flat,
)

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def check_soft(ent_coef: float, target_update_interval: int) -> None:
    """Refuse SAC's own keys (every config of :class:`SoftUpdateConfig` declares them):
    ``ent_coef`` > 0, ``target_update_interval`` >= 1."""
    if ent_coef <= 0:
        raise ValueError(f"ent_coef = {ent_coef} must be > 0")
    if target_update_interval < 1:
        raise ValueError("target_update_interval must be >= 1")


@dataclass
class SACConfig:
    """SAC hyper-parameters ([algo] section); defaults are SB3's except the learning rate."""

    learning_rate: float = 1e-3
    """Adam step size of every network (and of SAC's entropy coefficient)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks (1.0 = hard copy)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
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
    autotune: bool = True
    """Learn the entropy coefficient (alpha) towards ``target_entropy``."""
    ent_coef: float = 1.0
    """Initial entropy coefficient (its fixed value when autotune is off)."""
    target_entropy: float | None = None
    """Entropy the tuning aims for; None = -(action dimensions)."""
    target_update_interval: int = 1
    """Gradient steps between soft target-critic updates."""

    def __post_init__(self) -> None:
        check_soft(self.ent_coef, self.target_update_interval)
        check_replay(self.train_freq, self.gradient_steps, self.batch_size)
        check_actor_critic(self.batch_size, self.tau)


class SoftUpdateConfig(Protocol):
    """The ``[algo]`` keys SAC's update (:class:`SAC`) reads. :class:`SACConfig` declares them
    (with their docs), and so does the config of any algorithm that runs this update with keys
    of its own (an offline one's dataset keys), without this module knowing it."""

    learning_rate: float
    gamma: float
    tau: float
    hidden: list[int]
    activation: str
    autotune: bool
    ent_coef: float
    target_entropy: float | None
    target_update_interval: int


class SAC(ContinuousActorCritic):
    """Soft Q regression, the reparameterised actor update and the entropy-coefficient step."""

    saved: tuple[str, ...] = (
        "actor",
        "critics",
        "critics_target",
        "log_alpha",
        "actor_opt",
        "critic_opt",
        "alpha_opt",
    )
    counters = ("steps",)

    def __init__(self, backend: Backend, info: EnvInfo, config: SoftUpdateConfig) -> None:
        super().__init__(backend)
        self.config = config
        obs_dim, self.act_dim = info.observation.flat_dim, info.action.flat_dim
        hidden, act = config.hidden, config.activation
        self.actor = backend.mlp(obs_dim, hidden, 2 * self.act_dim, activation=act)  # mean, log std
        self.critics, self.critics_target = (
            backend.parallel_mlp(obs_dim + self.act_dim, hidden, [1, 1], activation=act)
            for _ in range(2)
        )
        backend.copy_weights(self.critics_target, self.critics)
        self.log_alpha = backend.parameter(np.array([math.log(config.ent_coef)], np.float32))
        self.target_entropy = (
            -float(self.act_dim) if config.target_entropy is None else config.target_entropy
        )
        lr = config.learning_rate
        self.actor_opt = backend.optimizer(self.actor, lr=lr)
        self.critic_opt = backend.optimizer(self.critics, lr=lr)
        self.alpha_opt = backend.optimizer(self.log_alpha, lr=lr)
        self.steps = 0

    # -- acting (numpy) ----------------------------------------------------------------------
    def _mean_log_std(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.numpy_actor()(obs)
        return out[:, : self.act_dim], np.clip(out[:, self.act_dim :], LOG_STD_MIN, LOG_STD_MAX)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(np.tanh(self._mean_log_std(obs)[0]))

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mean, log_std = self._mean_log_std(obs)
        return np.asarray(np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape)))

    # -- learning ----------------------------------------------------------------------------
    def _sample_policy(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Reparameterised squashed actions and their log-probabilities (tanh-corrected)."""
        bk = self.backend
        out = self.actor(obs)
        mean, log_std = (
            out[:, : self.act_dim],
            bk.clip(out[:, self.act_dim :], LOG_STD_MIN, LOG_STD_MAX),
        )
        dist = bk.normal(mean, log_std)
        u = dist.sample()
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|
        correction = bk.sum(2.0 * (math.log(2.0) - u - bk.softplus(-2.0 * u)), axis=-1)
        return bk.tanh(u), dist.log_prob(u) - correction

    def critic_penalty(
        self, obs: Tensor, next_obs: Tensor, q1: Tensor, q2: Tensor
    ) -> Tensor | None:
        """A term added to the critics' loss on this batch (``q1``, ``q2``: their values of the
        batch's actions); SAC adds none, CQL its conservative penalty (cql.py)."""
        return None

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        obs, next_obs = bk.tensor(flat(batch.obs)), bk.tensor(flat(batch.next_obs))
        actions = bk.tensor(flat(batch.actions))
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        with bk.no_grad():
            alpha = bk.exp(self.log_alpha)
        with bk.autocast():
            pi_actions, log_pi = self._sample_policy(obs)  # for the actor and alpha losses
            with bk.no_grad():
                next_actions, next_log_pi = self._sample_policy(next_obs)
                q1_next, q2_next = self.critics_target(bk.concat([next_obs, next_actions]))
                soft_next = bk.minimum(q1_next, q2_next)[:, 0] - alpha * next_log_pi
                target = rewards + c.gamma * (1.0 - dones) * soft_next
                entropy_gap = bk.mean(log_pi) + self.target_entropy
            q1, q2 = self.critics(bk.concat([obs, actions]))
            critic_loss = 0.5 * (
                bk.mean(bk.mse(q1[:, 0], target)) + bk.mean(bk.mse(q2[:, 0], target))
            )
            penalty = self.critic_penalty(obs, next_obs, q1, q2)
            if penalty is not None:
                critic_loss = critic_loss + penalty
        bk.update(self.critic_opt, critic_loss)
        with bk.autocast(), bk.frozen(self.critics):
            q1_pi, q2_pi = self.critics(bk.concat([obs, pi_actions]))
            actor_loss = bk.mean(alpha * log_pi - bk.minimum(q1_pi, q2_pi)[:, 0])
        bk.update(self.actor_opt, actor_loss)
        self._policy = None
        if c.autotune:
            alpha_loss = -bk.sum(self.log_alpha * entropy_gap)
            bk.update(self.alpha_opt, alpha_loss)
        self.steps += 1
        if self.steps % c.target_update_interval == 0:
            bk.copy_weights(self.critics_target, self.critics, tau=c.tau)
        if not diagnostics:
            return {}
        return {
            "losses/critic_loss": bk.item(critic_loss),
            "losses/actor_loss": bk.item(actor_loss),
            "losses/q_values": bk.item(bk.mean(q1)),
            "losses/alpha": bk.item(alpha[0]),
            "losses/entropy": -bk.item(bk.mean(log_pi)),
        }


def make_policy(parts: ActingParts) -> offpolicy.OffPolicyPolicy:
    """SAC's policy made from ``parts`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`)."""
    return offpolicy.make_policy(parts, "sac")


def make_agent(
    info: EnvInfo, backend: Backend, config: SACConfig, *, seed: int = 0, total_steps: int = 1
) -> OffPolicyAgent:
    return OffPolicyAgent(
        SAC(backend, info, config), info, config, name="sac", seed=seed, total_steps=total_steps
    )
