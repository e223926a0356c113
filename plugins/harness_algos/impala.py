"""IMPALA (Espeholt et al. 2018): an actor-critic learning from the rollouts of actors that act
with older weights, corrected off-policy by V-trace. Backend-neutral; the policy plumbing and
the unroll storage are in onpolicy.py.

In a harness actor farm (``run.actors > 0``) this agent (``on_policy = False``, sequences kept
per env) gets ``rollout_len``-step chunks from every actor in actor order, generated with
weights up to ``run.max_policy_lag`` versions old: IMPALA's asynchronous actors and learner with
a bounded lag. The behaviour policy's log-probabilities travel with the rollouts (``sample``'s
extras); ``learn`` scores the batch under the current weights and corrects with V-trace. In a
serial run (``run.actors = 0``) behaviour and target policy coincide and rho = 1.

Differences from the paper: Adam instead of RMSProp (harness backends offer Adam only); the
loss is averaged over the batch rather than summed (Adam is insensitive to the scale).
Observations with three axes (stacked frames) go through the backend's Nature-CNN trunk
(``backend.cnn``), flat ones through separate actor and critic MLPs. Discrete and box actions.

With ``recurrent = "lstm" | "gru"`` (flat observations) an LSTM or GRU sits in front of the
heads, as the paper's LSTM agent: each unroll carries the state its actor had at its first
step (``rnn_state``), and ``learn`` replays the unroll and its bootstrap step from it in one
fused pass, zeroing the state where an episode starts inside (harness_algos.recurrent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo
from harness.errors import ConfigError
from harness_algos.moments import check_normalization
from harness_algos.noise import check_noise_correlation
from harness_algos.onpolicy import ActorCritic, RolloutAgent, actor_critic_mlp
from harness_algos.recurrent import check_recurrent

CNN_PRESETS: dict[str, dict[str, Any]] = {
    "nature": {
        "out_dim": 512,
        "channels": (32, 64, 64),
        "kernels": (8, 4, 3),
        "strides": (4, 2, 1),
    },
    "shallow": {"out_dim": 256, "channels": (16, 32), "kernels": (8, 4), "strides": (4, 2)},
}
"""Image trunks: Mnih et al. 2015's, and the IMPALA paper's shallow model (without its LSTM)."""


@dataclass
class IMPALAConfig:
    """IMPALA hyper-parameters ([algo] section). Defaults follow the paper's Atari settings
    where they apply (unroll 20, gamma 0.99, rho_bar = c_bar = 1, entropy 0.01, grad clip 40)."""

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
    learning_rate: float = 6e-4
    """Adam step size (annealed linearly to 0 when anneal_lr)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run (as the paper)."""
    rollout_len: int = 20
    """Unroll length: vector steps per env between two updates; one batch holds
    rollout_len * num_envs steps."""
    epochs: int = 1
    """Gradient steps per batch (1 as the paper); later ones are off-policy by the earlier
    updates, which V-trace corrects for like actor lag."""
    gamma: float = 0.99
    """Discount factor."""
    rho_bar: float = 1.0
    """V-trace truncation of the importance weights in the value targets and the policy
    gradient (rho-bar)."""
    c_bar: float = 1.0
    """V-trace truncation of the trace-cutting coefficients (c-bar)."""
    vtrace_lambda: float = 1.0
    """Extra trace decay: c_s = lambda * min(c_bar, pi/mu) (1 = the paper's main setting)."""
    vf_coef: float = 0.5
    """Weight of the value loss 0.5 * (v_s - V(x_s))^2."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the (separate) actor and critic MLPs for flat observations."""
    activation: str = "tanh"
    """Hidden activation of the MLPs: tanh, relu or elu."""
    cnn: str = "nature"
    """Trunk for image observations (C, H, W): 'nature' (Mnih et al. 2015, 512 features) or
    'shallow' (the IMPALA paper's 2-layer trunk, 256 features, ~3x less compute)."""
    log_std_init: float = 0.0
    """Initial log standard deviation for box actions."""
    noise_correlation: float = 0.0
    """Box actions: how much each env's exploration noise keeps from one step to the next,
    rho in [0, 1) of an AR(1) process whose every step is still N(0, 1), so the log-probs are
    the policy's (harness_algos.noise); 0: white noise. 0.9 keeps a perturbation about 10
    steps, for fast control rates such as MyoSuite's 100 Hz (README, Algorithms)."""
    recurrent: str = "none"
    """'lstm' or 'gru': a recurrent layer of rnn_hidden units between the (flat) observation
    and the actor and critic heads (hidden), for partially observed tasks; 'none':
    feed-forward. Each actor keeps its envs' states across unrolls and resets them at episode
    starts; every unroll carries the state it started from, and the learner replays it from
    there through the whole unroll (docs/recurrent.md)."""
    rnn_hidden: int = 64
    """Units of the recurrent layer (recurrent = 'lstm' or 'gru')."""

    def __post_init__(self) -> None:
        check_recurrent(self.recurrent, self.rnn_hidden)
        check_noise_correlation(self.noise_correlation)
        check_normalization(self.clip_obs, self.clip_reward)
        if self.rollout_len < 1 or self.epochs < 1:
            raise ValueError("rollout_len and epochs must be >= 1")
        if self.rho_bar <= 0 or self.c_bar <= 0 or not 0 < self.vtrace_lambda <= 1:
            raise ValueError("rho_bar and c_bar must be > 0, vtrace_lambda in (0, 1]")
        if self.cnn not in CNN_PRESETS:
            raise ValueError(f"cnn = {self.cnn!r} must be one of {sorted(CNN_PRESETS)}")


def vtrace(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    *,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, section 4).

    Time-major ``(T, N)`` arrays: ``log_rhos`` = log pi(a_t|x_t) - log mu(a_t|x_t) (target
    minus behaviour), ``discounts`` = gamma where x_{t+1} continues the episode and 0 where it
    ended, ``values`` = V(x_t), and ``bootstrap_value`` ``(N,)`` = V(x_T). With
    ``delta_t = rho_t (r_t + discount_t V(x_{t+1}) - V(x_t))``, ``rho_t = min(rho_bar, pi/mu)``
    and ``c_t = lam * min(c_bar, pi/mu)``:

        v_s - V(x_s) = delta_s + discount_s c_s (v_{s+1} - V(x_{s+1}))
        advantage_s  = rho_s (r_s + discount_s v_{s+1} - V(x_s))

    with ``v_T = V(x_T)``. Returns ``(vs, advantages)``, float32. On-policy (rho = c = 1) ``vs``
    is the n-step bootstrapped return. Computed in float64, vectorised over N."""
    log_rhos = np.asarray(log_rhos, np.float64)
    discounts = np.asarray(discounts, np.float64)
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    bootstrap = np.asarray(bootstrap_value, np.float64)
    rhos = np.exp(log_rhos)
    clipped_rhos = np.minimum(rho_bar, rhos)
    cs = lam * np.minimum(c_bar, rhos)
    next_values = np.concatenate([values[1:], bootstrap[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_v = np.zeros_like(values)
    acc = np.zeros_like(bootstrap)
    for t in range(len(values) - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    next_vs = np.concatenate([vs[1:], bootstrap[None]], axis=0)
    advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs.astype(np.float32), advantages.astype(np.float32)


class IMPALA(ActorCritic):
    """The V-trace actor-critic update on one batch of unrolls."""

    def __init__(self, backend: Backend, info: EnvInfo, config: IMPALAConfig) -> None:
        super().__init__(
            backend,
            info,
            config.log_std_init,
            recurrent=config.recurrent,
            rnn_hidden=config.rnn_hidden,
        )
        self.config = config
        self.image = len(info.observation.shape) == 3
        if self.image and config.recurrent != "none":
            raise ConfigError(
                f"algo.recurrent = {config.recurrent!r} takes flat observations; {info.env_id} "
                f"gives images of shape {info.observation.shape} (a CNN trunk before the "
                'recurrent layer is not built yet): set algo.recurrent = "none" (frame '
                "stacking gives the CNN its short-term memory)."
            )
        self.net = self.network(
            info, config.hidden, config.activation, lambda: self.feed_forward_net(info)
        )
        self.optimizer = backend.optimizer(
            *self.trainable(self.net), lr=config.learning_rate, eps=config.adam_eps
        )
        self.obs_dtype = "uint8" if np.dtype(info.observation.dtype) == np.uint8 else "float32"
        self.refresh_policy()

    def feed_forward_net(self, info: EnvInfo) -> Any:
        """The network without a recurrent layer: for images a shared convolutional trunk
        with linear policy and value heads, else separate actor and critic MLPs."""
        backend, config = self.backend, self.config
        if self.image:
            preset = CNN_PRESETS[config.cnn]
            trunk = backend.cnn(info.observation.shape, **preset)
            width = int(preset["out_dim"])
            return backend.group(
                trunk=trunk,
                policy=backend.mlp(width, [], self.act_dim, out_gain=0.01),
                value=backend.mlp(width, [], 1),
            )
        return actor_critic_mlp(backend, info, config.hidden, config.activation)

    def acting_model(self) -> Any:
        return self.net

    def checkpoint_parts(self) -> dict[str, Any]:
        return {"net": self.net, "optimizer": self.optimizer}

    def numpy_policy(self) -> Callable[..., Any]:
        """The numpy copy acting uses: for images, the trunk's and both heads' chained."""
        if not self.image:
            return super().numpy_policy()
        bk = self.backend
        trunk = bk.inference(self.net["trunk"])
        policy, value = bk.inference(self.net["policy"]), bk.inference(self.net["value"])

        def forward(obs: np.ndarray) -> list[np.ndarray]:
            features = trunk(obs)
            return [policy(features), value(features)]

        return forward

    def forward(self, obs: Any, sequences: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
        """Policy-head outputs (logits or means) and state values for a batch (time-major
        sequences for a recurrent network, with ``sequences = (state, starts)``)."""
        if self.image:
            features = self.net["trunk"](obs)
            return self.net["policy"](features), self.net["value"](features)[:, 0]
        out, value = self.net_outputs(self.net, obs, sequences)
        return out, value[:, 0]

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(obs)[1])[:, 0]

    def learn(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One V-trace step on a batch of unrolls: ``obs`` ``(T, N, ...)``, ``next_obs``
        ``(N, ...)`` (after the last step), ``actions``, ``rewards``, ``discounts``,
        ``behaviour_log_probs`` ``(T, N)``; for a recurrent network also ``starts`` ``(T + 1,
        N)`` (episode starts through the bootstrap step) and ``state`` ``(N, S)``."""
        bk, c = self.backend, self.config
        obs = batch["obs"]
        steps, n = obs.shape[:2]
        rows = steps * n
        actions = batch["actions"].reshape(rows, *batch["actions"].shape[2:])
        act_t = bk.tensor(actions, self.action_dtype)
        every, sequences = self.memory.unroll(bk, batch)
        with bk.autocast():
            # one forward pass over the unrolls and the bootstrap observations
            out, all_values = self.forward(bk.tensor(every, self.obs_dtype), sequences)
            dist = self.distribution(out[:rows])
            values = all_values[:rows]
            logp = dist.log_prob(act_t)
        value_np = bk.numpy(all_values).astype(np.float64)
        log_rhos = bk.numpy(logp).reshape(steps, n) - batch["behaviour_log_probs"]
        vs, advantages = vtrace(
            log_rhos,
            batch["discounts"],
            batch["rewards"],
            value_np[:rows].reshape(steps, n),
            value_np[rows:],
            rho_bar=c.rho_bar,
            c_bar=c.c_bar,
            lam=c.vtrace_lambda,
        )
        with bk.autocast():
            pg_loss = -bk.mean(bk.tensor(advantages.reshape(rows)) * logp)
            v_loss = 0.5 * bk.mean(bk.mse(values, bk.tensor(vs.reshape(rows))))
            entropy = bk.mean(dist.entropy())
            loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * entropy
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        rhos = np.exp(log_rhos)
        return {
            "losses/policy_loss": bk.item(pg_loss),
            "losses/value_loss": bk.item(v_loss),
            "losses/entropy": bk.item(entropy),
            "losses/grad_norm": grad_norm,
            "vtrace/rho_mean": float(rhos.mean()),
            # truncated by more than float noise (numpy acting vs the framework's forward)
            "vtrace/rho_clipped": float(np.mean(rhos > c.rho_bar + 1e-3)),
            "vtrace/advantage_mean": float(advantages.mean()),
        }


class IMPALAAgent(RolloutAgent):
    """Unrolls with the behaviour log-probabilities and the update schedule around
    :class:`IMPALA` (rollout collection and truncation bootstrapping:
    :class:`~harness_algos.onpolicy.RolloutAgent`)."""

    name = "impala"
    algorithm: IMPALA
    config: IMPALAConfig
    on_policy = False  # actors may lag (run.max_policy_lag): V-trace corrects for it
    independent_transitions = False  # unrolls are sequences per env

    def __init__(
        self, algorithm: IMPALA, info: EnvInfo, config: IMPALAConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(
            algorithm,
            info,
            config,
            config.rollout_len,
            seed=seed,
            total_steps=total_steps,
            obs_dtype=np.dtype(info.observation.dtype),
        )

    def learn_rollout(self, next_obs: np.ndarray) -> dict[str, float]:
        c, buf = self.config, self.buffer
        batch = {
            **self.memory.learn_inputs(buf, c.gamma),
            "obs": buf.obs,
            "next_obs": next_obs,
            "actions": buf.actions,
            "rewards": buf.rewards,
            "discounts": c.gamma * (1.0 - buf.dones),
            "behaviour_log_probs": buf.log_probs,
        }
        totals: dict[str, float] = {}
        for _ in range(c.epochs):
            for key, value in self.algorithm.learn(batch).items():
                totals[key] = totals.get(key, 0.0) + value / c.epochs
            self.updates += 1
        return totals


def make_agent(
    info: EnvInfo, backend: Backend, config: IMPALAConfig, *, seed: int = 0, total_steps: int = 1
) -> IMPALAAgent:
    return IMPALAAgent(
        IMPALA(backend, info, config), info, config, seed=seed, total_steps=total_steps
    )
