"""TD3 (Fujimoto et al. 2018): twin critics with the smaller target, target-policy smoothing
and delayed actor updates. Backend-neutral; the replay and schedule are in offpolicy.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import ReplayBatch
from harness.policy import ActingParts
from harness_algos import offpolicy
from harness_algos.offpolicy import (
    ContinuousActorCritic,
    OffPolicyAgent,
    check_actor_critic,
    check_replay,
    flat,
    gaussian_explore,
)


@dataclass
class TD3Config:
    """TD3 hyper-parameters ([algo] section); defaults are SB3's."""

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
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_policy_noise: float = 0.2
    """Std of the Gaussian noise on the target action (in [-1, 1] action units)."""
    target_noise_clip: float = 0.5
    """Clip of that noise."""

    def __post_init__(self) -> None:
        check_replay(self.train_freq, self.gradient_steps, self.batch_size)
        check_actor_critic(self.batch_size, self.tau)
        if self.policy_delay < 1:
            raise ValueError(f"policy_delay = {self.policy_delay} must be >= 1")


class TD3(ContinuousActorCritic):
    """The critic and (delayed) actor updates."""

    saved = ("actor", "actor_target", "critics", "critics_target", "actor_opt", "critic_opt")
    counters = ("critic_updates",)

    def __init__(self, backend: Backend, info: EnvInfo, config: TD3Config) -> None:
        super().__init__(backend)
        self.config = config
        obs_dim, self.act_dim = info.observation.flat_dim, info.action.flat_dim
        self.actor = backend.mlp(obs_dim, config.hidden, self.act_dim, activation=config.activation)
        self.actor_target = backend.mlp(
            obs_dim, config.hidden, self.act_dim, activation=config.activation
        )
        self.critics, self.critics_target = (
            backend.parallel_mlp(
                obs_dim + self.act_dim, config.hidden, [1, 1], activation=config.activation
            )
            for _ in range(2)
        )
        backend.copy_weights(self.actor_target, self.actor)
        backend.copy_weights(self.critics_target, self.critics)
        self.actor_opt = backend.optimizer(self.actor, lr=config.learning_rate)
        self.critic_opt = backend.optimizer(self.critics, lr=config.learning_rate)
        self.critic_updates = 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(np.tanh(self.numpy_actor()(obs)))

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return gaussian_explore(self.act(obs), self.config.exploration_noise, rng)

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        obs, next_obs = bk.tensor(flat(batch.obs)), bk.tensor(flat(batch.next_obs))
        actions = bk.tensor(flat(batch.actions))
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        with bk.autocast():
            with bk.no_grad():
                smoothing = bk.normal(
                    bk.tensor(np.zeros((len(batch.obs), self.act_dim), np.float32)),
                    bk.tensor(np.full(self.act_dim, np.log(c.target_policy_noise), np.float32)),
                ).sample()
                smoothing = bk.clip(smoothing, -c.target_noise_clip, c.target_noise_clip)
                next_actions = bk.clip(bk.tanh(self.actor_target(next_obs)) + smoothing, -1, 1)
                q1_next, q2_next = self.critics_target(bk.concat([next_obs, next_actions]))
                next_q = bk.minimum(q1_next, q2_next)[:, 0]
                target = rewards + c.gamma * (1.0 - dones) * next_q
            q1, q2 = self.critics(bk.concat([obs, actions]))
            critic_loss = bk.mean(bk.mse(q1[:, 0], target)) + bk.mean(bk.mse(q2[:, 0], target))
        bk.update(self.critic_opt, critic_loss)
        self.critic_updates += 1
        metrics: dict[str, float] = {}
        if self.critic_updates % c.policy_delay == 0:
            with bk.autocast(), bk.frozen(self.critics):
                q_pi = self.critics(bk.concat([obs, bk.tanh(self.actor(obs))]), member=0)[0]
                actor_loss = -bk.mean(q_pi)
            bk.update(self.actor_opt, actor_loss)
            bk.copy_weights(self.actor_target, self.actor, tau=c.tau)
            bk.copy_weights(self.critics_target, self.critics, tau=c.tau)
            self._policy = None
            if diagnostics:
                metrics["losses/actor_loss"] = bk.item(actor_loss)
        if diagnostics:
            metrics["losses/critic_loss"] = bk.item(critic_loss)
            metrics["losses/q_values"] = bk.item(bk.mean(q1))
        return metrics


def make_policy(parts: ActingParts) -> offpolicy.OffPolicyPolicy:
    """TD3's policy made from ``parts`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`)."""
    return offpolicy.make_policy(parts, "td3")


def make_agent(
    info: EnvInfo, backend: Backend, config: TD3Config, *, seed: int = 0, total_steps: int = 1
) -> OffPolicyAgent:
    return OffPolicyAgent(
        TD3(backend, info, config), info, config, name="td3", seed=seed, total_steps=total_steps
    )
