"""PPO (Schulman et al. 2017): clipped surrogate, GAE, vectorized envs, advantage
normalisation, linear learning-rate/clip annealing. Discrete (categorical) and box (diagonal
Gaussian) actions. Backend-neutral; the policy plumbing and rollouts are in onpolicy.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo
from harness.data import RolloutBatch
from harness_algos.moments import check_normalization
from harness_algos.noise import check_noise_correlation
from harness_algos.onpolicy import ActorCritic, RolloutAgent, actor_critic_mlp, annealed
from harness_algos.recurrent import SequenceBatch, check_recurrent


@dataclass
class PPOConfig:
    """PPO hyper-parameters ([algo] section)."""

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
    learning_rate: float = 3e-4
    """Adam step size (annealed linearly to 0 when anneal_lr)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
    n_steps: int = 128
    """Vector steps per rollout (per env); a rollout holds n_steps * num_envs samples."""
    batch_size: int = 64
    """Minibatch size."""
    n_epochs: int = 10
    """Passes over each rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """Surrogate clipping range."""
    anneal_clip: bool = False
    """Anneal the clip range linearly to 0 over the run."""
    clip_vloss: bool = False
    """Clip the value loss around the old values too."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantage: bool = True
    """Normalise advantages per minibatch."""
    target_kl: float | None = None
    """Stop the epoch loop early when the approximate KL exceeds this."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the (separate) actor and critic networks."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    log_std_init: float = 0.0
    """Initial log standard deviation for box actions."""
    noise_correlation: float = 0.0
    """Box actions: how much each env's exploration noise keeps from one step to the next,
    rho in [0, 1) of an AR(1) process whose every step is still N(0, 1), so the log-probs are
    the policy's (harness_algos.noise); 0: white noise. 0.9 keeps a perturbation about 10
    steps, for fast control rates such as MyoSuite's 100 Hz (README, Algorithms)."""
    recurrent: str = "none"
    """'lstm' or 'gru': a recurrent layer of rnn_hidden units between the observation and
    the actor and critic heads (hidden), for partially observed tasks; 'none': feed-forward.
    Each env's state is kept across rollouts and reset at its episode's start, the state
    each rollout starts from travels with it, and minibatches are whole env sequences
    (batch_size // n_steps of them), trained through the n_steps of a rollout
    (docs/recurrent.md)."""
    rnn_hidden: int = 64
    """Units of the recurrent layer (recurrent = 'lstm' or 'gru')."""

    def __post_init__(self) -> None:
        check_recurrent(self.recurrent, self.rnn_hidden)
        check_noise_correlation(self.noise_correlation)
        check_normalization(self.clip_obs, self.clip_reward)
        if self.n_steps < 1 or self.batch_size < 1 or self.n_epochs < 1:
            raise ValueError("n_steps, batch_size and n_epochs must be >= 1")


class PPO(ActorCritic):
    """The clipped-surrogate update on one minibatch."""

    def __init__(self, backend: Backend, info: EnvInfo, config: PPOConfig) -> None:
        super().__init__(
            backend,
            info,
            config.log_std_init,
            recurrent=config.recurrent,
            rnn_hidden=config.rnn_hidden,
        )
        self.config = config
        self.net = self.network(
            info,
            config.hidden,
            config.activation,
            lambda: actor_critic_mlp(backend, info, config.hidden, config.activation),
        )
        self.optimizer = backend.optimizer(
            *self.trainable(self.net), lr=config.learning_rate, eps=1e-5
        )
        self.clip_range = config.clip_range
        self._batch: RolloutBatch | SequenceBatch | None = None
        self._tensors: tuple[Any, ...] = ()
        self._sequences: tuple[Any, Any] | None = None
        self.refresh_policy()

    def acting_model(self) -> Any:
        return self.net

    def checkpoint_parts(self) -> dict[str, Any]:
        return {"net": self.net, "optimizer": self.optimizer}

    def forward(self, obs: Any, sequences: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
        """The action distribution and the state values for a batch of observations (for a
        recurrent network, time-major sequences with ``sequences = (state, starts)``; the
        outputs' rows are then time-major)."""
        out, value = self.net_outputs(self.net, obs, sequences)
        return self.distribution(out), value[:, 0]

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(obs)[1][:, 0])

    def learn(
        self, batch: RolloutBatch | SequenceBatch, *, diagnostics: bool = True
    ) -> dict[str, float]:
        """One clipped-surrogate step on ``batch``. Passing the same batch object again (a
        rollout that fits in one minibatch, trained for several epochs) reuses its tensors.
        Without ``diagnostics`` the losses, KL and clip fraction are not read back (an empty
        dict is returned), which saves several framework round trips per step."""
        bk, c = self.backend, self.config
        if batch is not self._batch:
            self._batch = batch
            self._tensors = (
                bk.tensor(batch.obs),
                bk.tensor(batch.actions, self.action_dtype),
                bk.tensor(batch.log_probs),
                bk.tensor(batch.advantages),
                bk.tensor(batch.returns),
                bk.tensor(batch.values),
            )
            self._sequences = (
                (bk.tensor(batch.state), batch.starts) if isinstance(batch, SequenceBatch) else None
            )
        obs, actions, old_logp, adv, returns, old_values = self._tensors
        with bk.autocast():
            d, v = self.forward(obs, self._sequences)
            logp = d.log_prob(actions)
            log_ratio = logp - old_logp
            ratio = bk.exp(log_ratio)
            clip = self.clip_range
            pg_loss = -bk.mean(bk.minimum(adv * ratio, adv * bk.clip(ratio, 1 - clip, 1 + clip)))
            # plain MSE as in SB3, whose tuned vf_coef values the packs reuse (CleanRL halves it)
            if c.clip_vloss:
                v_clipped = old_values + bk.clip(v - old_values, -clip, clip)
                v_loss = bk.mean(bk.maximum(bk.mse(v, returns), bk.mse(v_clipped, returns)))
            else:
                v_loss = bk.mean(bk.mse(v, returns))
            loss = pg_loss + c.vf_coef * v_loss
            entropy = None
            if c.ent_coef:  # kept out of the graph when it does not contribute to the loss
                entropy = bk.mean(d.entropy())
                loss = loss - c.ent_coef * entropy
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        if not diagnostics:
            return {}
        with bk.no_grad():
            if entropy is None:
                entropy = bk.mean(d.entropy())
            r = bk.numpy(ratio)
            approx_kl = float(np.mean((r - 1.0) - np.log(r)))
            clip_frac = float(np.mean(np.abs(r - 1.0) > clip))
        return {
            "losses/policy_loss": bk.item(pg_loss),
            "losses/value_loss": bk.item(v_loss),
            "losses/entropy": bk.item(entropy),
            "losses/approx_kl": approx_kl,
            "losses/clip_fraction": clip_frac,
            "losses/grad_norm": grad_norm,
        }

    def set_schedule(self, progress: float) -> float:
        """Anneal learning rate / clip range; ``progress`` in [0, 1]. Returns the lr."""
        self.clip_range = annealed(self.config.clip_range, progress, self.config.anneal_clip)
        return super().set_schedule(progress)


class PPOAgent(RolloutAgent):
    """GAE and the epoch/minibatch loop around :class:`PPO` (rollout collection and
    truncation bootstrapping: :class:`~harness_algos.onpolicy.RolloutAgent`)."""

    name = "ppo"
    algorithm: PPO
    config: PPOConfig

    def __init__(
        self, algorithm: PPO, info: EnvInfo, config: PPOConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(
            algorithm, info, config, config.n_steps, seed=seed, total_steps=total_steps
        )

    def minibatches(self) -> list[RolloutBatch] | list[SequenceBatch]:
        """One shuffled pass over the rollout: samples, or for a recurrent network whole env
        sequences (``batch_size // n_steps`` of them, at least one)."""
        c = self.config
        return self.memory.minibatches(
            self.buffer, c.batch_size, self.rng, normalize=c.normalize_advantage
        )

    def learn_rollout(self, next_obs: np.ndarray) -> dict[str, float]:
        c, buf = self.config, self.buffer
        # values are left out when acting: one batched pass over the rollout instead
        last_values = self.score_rollout(next_obs)
        buf.compute_gae(last_values, c.gamma, c.gae_lambda)
        totals: dict[str, float] = {}
        count = 0
        # a rollout that fits in one minibatch is the same batch every epoch (the order of
        # samples inside it does not change the gradient): build it once
        one_batch = c.batch_size >= buf.num_steps * buf.num_envs
        batches: list[RolloutBatch] | list[SequenceBatch] = []
        for epoch in range(c.n_epochs):
            # losses and KL are read back on the last epoch only, or every epoch for target_kl
            diagnostics = c.target_kl is not None or epoch == c.n_epochs - 1
            if not (one_batch and batches):
                batches = self.minibatches()
            for batch in batches:
                metrics = self.algorithm.learn(batch, diagnostics=diagnostics)
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                count += bool(metrics)
                self.updates += 1
            if c.target_kl is not None and metrics["losses/approx_kl"] > c.target_kl:
                break
        return {k: v / max(count, 1) for k, v in totals.items()}


def make_agent(
    info: EnvInfo, backend: Backend, config: PPOConfig, *, seed: int = 0, total_steps: int = 1
) -> PPOAgent:
    return PPOAgent(PPO(backend, info, config), info, config, seed=seed, total_steps=total_steps)
