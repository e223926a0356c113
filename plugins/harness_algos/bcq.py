"""BCQ (Fujimoto, Meger and Precup 2019, "Off-Policy Deep Reinforcement Learning without
Exploration"), continuous actions: a conditional VAE models the dataset's actions per state, a
perturbation actor shifts the VAE's actions by at most ``phi`` towards higher Q, and twin
critics learn with a soft clipped double-Q target (``lmbda`` of the min, the rest of the max)
over ``n_candidates`` generated next actions. The policy only picks among actions the data
supports, which keeps the critics off actions they never saw. Backend-neutral; the dataset and
the agent are offline.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo, Tensor
from harness.data import ReplayBatch
from harness.policy import ActingParts
from harness_algos.offline import (
    OfflineAgent,
    OfflineConfig,
    OfflinePolicy,
    check_offline,
    per_state,
)
from harness_algos.offline import make_policy as offline_policy
from harness_algos.offpolicy import ContinuousActorCritic, check_actor_critic, flat

LATENT_CLIP = 0.5
"""Latent codes drawn from the prior are clipped to [-0.5, 0.5] (the authors' code): the
decoder then stays near the modes of the data."""
LOG_STD_MIN, LOG_STD_MAX = -4.0, 15.0


@dataclass
class BCQConfig(OfflineConfig):
    """BCQ hyper-parameters ([algo] section); defaults are the authors' (actor and critics
    400x300, VAE 750x750, phi 0.05, lambda 0.75, 10 candidate actions)."""

    dataset: str | list[str] = ""
    """The Minari dataset to learn from: a path to a dataset directory (what `harness collect
    --out PATH` writes) or a dataset id (NAME-vN, NAMESPACE/NAME-vN) under dataset_root; a list
    pools several datasets of the same env."""
    dataset_root: str = ""
    """Directory in which dataset ids are looked up; empty: MINARI_DATASETS_PATH, else
    ~/.minari/datasets (Minari's own default). Paths in dataset are used as they are."""
    updates_per_iteration: int = 250
    """Gradient updates per iteration. An offline run steps no env: run.total_steps,
    eval_every, log_every and checkpoint_every count gradient updates."""
    learning_rate: float = 1e-3
    """Adam step size of every network (and of SAC's entropy coefficient)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks (1.0 = hard copy)."""
    hidden: list[int] = field(default_factory=lambda: [400, 300])
    """Hidden widths of the perturbation actor and of each critic."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    vae_hidden: list[int] = field(default_factory=lambda: [750, 750])
    """Hidden widths of the VAE's encoder and decoder."""
    latent_dim: int = 0
    """Size of the VAE's latent code; 0 = twice the action dimensions."""
    phi: float = 0.05
    """Largest perturbation of a VAE action (in [-1, 1] action units)."""
    lmbda: float = 0.75
    """Weight of the smaller target critic in the soft clipped double-Q target."""
    n_candidates: int = 10
    """Actions generated per state for the target and for acting (the best-scored is taken)."""
    kl_weight: float = 0.5
    """Weight of the VAE's KL term against its reconstruction error."""

    def __post_init__(self) -> None:
        if self.phi < 0 or not 0.0 <= self.lmbda <= 1.0:
            raise ValueError("phi must be >= 0 and lmbda in [0, 1]")
        if self.n_candidates < 1 or self.latent_dim < 0:
            raise ValueError("n_candidates must be >= 1 and latent_dim >= 0")
        check_actor_critic(self.batch_size, self.tau)
        check_offline(self.updates_per_iteration)


class BCQ(ContinuousActorCritic):
    """The VAE, critic and perturbation-actor updates; acting scores generated candidates."""

    saved = (
        "encoder",
        "decoder",
        "actor",
        "actor_target",
        "critics",
        "critics_target",
        "vae_opt",
        "actor_opt",
        "critic_opt",
    )
    acting = ("decoder", "actor", "critics")
    """The networks a policy needs (its weights())."""

    def actor_layers(self) -> None:
        """BCQ acts by perturbing VAE-decoded candidates and picking by Q: not a chain of
        layers, so it is not exported."""
        return None

    def __init__(self, backend: Backend, info: EnvInfo, config: BCQConfig) -> None:
        super().__init__(backend)
        self.config = config
        obs_dim, self.act_dim = info.observation.flat_dim, info.action.flat_dim
        self.latent = config.latent_dim or 2 * self.act_dim
        act = config.activation
        self.encoder = backend.mlp(
            obs_dim + self.act_dim, config.vae_hidden, 2 * self.latent, activation=act
        )
        self.decoder = backend.mlp(
            obs_dim + self.latent, config.vae_hidden, self.act_dim, activation=act
        )
        self.actor, self.actor_target = (
            backend.mlp(obs_dim + self.act_dim, config.hidden, self.act_dim, activation=act)
            for _ in range(2)
        )
        self.critics, self.critics_target = (
            backend.parallel_mlp(obs_dim + self.act_dim, config.hidden, [1, 1], activation=act)
            for _ in range(2)
        )
        backend.copy_weights(self.actor_target, self.actor)
        backend.copy_weights(self.critics_target, self.critics)
        lr = config.learning_rate
        self.vae_opt = backend.optimizer(self.encoder, self.decoder, lr=lr)
        self.actor_opt = backend.optimizer(self.actor, lr=lr)
        self.critic_opt = backend.optimizer(self.critics, lr=lr)
        # Acting scores the same latent codes in every state (the prior's mode first), so the
        # greedy policy is deterministic and survives a checkpoint without an RNG.
        codes = np.random.default_rng(0).standard_normal((config.n_candidates, self.latent))
        codes[0] = 0.0
        self._codes = np.clip(codes, -LATENT_CLIP, LATENT_CLIP).astype(np.float32)
        self._zeros: dict[int, Tensor] = {}

    # -- acting (numpy) ----------------------------------------------------------------------
    def _numpy_nets(self) -> Any:
        if self._policy is None:
            self._policy = tuple(self.backend.inference(getattr(self, n)) for n in self.acting)
        return self._policy

    def act(self, obs: np.ndarray) -> np.ndarray:
        decoder, actor, critics = self._numpy_nets()
        b, n = len(obs), len(self._codes)
        states = np.tile(flat(obs), (n, 1))  # row k * b + i: state i, candidate k
        vae = np.tanh(decoder(np.concatenate([states, np.repeat(self._codes, b, axis=0)], -1)))
        shift = self.config.phi * np.tanh(actor(np.concatenate([states, vae], -1)))
        candidates = np.clip(vae + shift, -1.0, 1.0)
        q1 = critics(np.concatenate([states, candidates], -1))[0][:, 0].reshape(n, b)
        best: np.ndarray = candidates.reshape(n, b, self.act_dim)[q1.argmax(0), np.arange(b)]
        return best

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.act(obs)

    def policy_weights(self) -> dict[str, np.ndarray]:
        return {
            f"{name}/{key}": value
            for name in self.acting
            for key, value in self.backend.get_weights(getattr(self, name)).items()
        }

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for name in self.acting:
            prefix = name + "/"
            own = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
            self.backend.set_weights(getattr(self, name), own)
        self._policy = None

    # -- learning ----------------------------------------------------------------------------
    def _prior_codes(self, rows: int) -> Tensor:
        """Latent codes from the clipped prior (reparameterised noise of the backend)."""
        bk = self.backend
        if rows not in self._zeros:
            self._zeros[rows] = bk.tensor(np.zeros((rows, self.latent), np.float32))
        zeros = self._zeros[rows]
        return bk.clip(bk.normal(zeros, zeros).sample(), -LATENT_CLIP, LATENT_CLIP)

    def _generate(self, states: Tensor, actor: Any) -> Tensor:
        """VAE actions for ``states`` perturbed by ``actor``, in [-1, 1]."""
        bk = self.backend
        vae = bk.tanh(self.decoder(bk.concat([states, self._prior_codes(int(states.shape[0]))])))
        return bk.clip(vae + self.config.phi * bk.tanh(actor(bk.concat([states, vae]))), -1, 1)

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        obs, next_obs = bk.tensor(flat(batch.obs)), bk.tensor(flat(batch.next_obs))
        actions = bk.tensor(flat(batch.actions))
        rewards, dones = bk.tensor(batch.rewards), bk.tensor(batch.dones)
        b, n, latent = len(batch.obs), c.n_candidates, self.latent
        with bk.autocast():
            out = self.encoder(bk.concat([obs, actions]))
            mean, log_std = out[:, :latent], bk.clip(out[:, latent:], LOG_STD_MIN, LOG_STD_MAX)
            codes = bk.normal(mean, log_std).sample()
            recon = bk.tanh(self.decoder(bk.concat([obs, codes])))
            kl = -0.5 * bk.mean(1.0 + 2.0 * log_std - mean * mean - bk.exp(2.0 * log_std))
            vae_loss = bk.mean(bk.mse(recon, actions)) + c.kl_weight * kl
        bk.update(self.vae_opt, vae_loss)
        with bk.autocast():
            with bk.no_grad():
                next_n = bk.concat([next_obs] * n, axis=0)  # row k * b + i: state i
                q1_next, q2_next = self.critics_target(
                    bk.concat([next_n, self._generate(next_n, self.actor_target)])
                )
                low, high = bk.minimum(q1_next, q2_next), bk.maximum(q1_next, q2_next)
                soft = (c.lmbda * low + (1.0 - c.lmbda) * high)[:, 0]
                next_q = bk.max(per_state(bk, soft, b), axis=1)
                target = rewards + c.gamma * (1.0 - dones) * next_q
            q1, q2 = self.critics(bk.concat([obs, actions]))
            critic_loss = bk.mean(bk.mse(q1[:, 0], target)) + bk.mean(bk.mse(q2[:, 0], target))
        bk.update(self.critic_opt, critic_loss)
        with bk.autocast(), bk.frozen(self.critics):
            with bk.no_grad():
                vae_actions = bk.tanh(self.decoder(bk.concat([obs, self._prior_codes(b)])))
            shift = c.phi * bk.tanh(self.actor(bk.concat([obs, vae_actions])))
            perturbed = bk.clip(vae_actions + shift, -1.0, 1.0)
            actor_loss = -bk.mean(self.critics(bk.concat([obs, perturbed]), member=0)[0])
        bk.update(self.actor_opt, actor_loss)
        bk.copy_weights(self.critics_target, self.critics, tau=c.tau)
        bk.copy_weights(self.actor_target, self.actor, tau=c.tau)
        self._policy = None
        if not diagnostics:
            return {}
        return {
            "losses/critic_loss": bk.item(critic_loss),
            "losses/actor_loss": bk.item(actor_loss),
            "losses/vae_loss": bk.item(vae_loss),
            "losses/q_values": bk.item(bk.mean(q1)),
        }


def make_policy(parts: ActingParts) -> OfflinePolicy:
    """:func:`harness_algos.offline.make_policy` of BCQ (an agent, or an agentless actor's
    :class:`~harness.policy.Acting`)."""
    return offline_policy(parts, "bcq")


def make_agent(
    info: EnvInfo, backend: Backend, config: BCQConfig, *, seed: int = 0, total_steps: int = 1
) -> OfflineAgent:
    return OfflineAgent(
        BCQ(backend, info, config), info, config, name="bcq", seed=seed, total_steps=total_steps
    )
