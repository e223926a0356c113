"""IMPALA (Espeholt et al. 2018): an actor-critic learning from the rollouts of actors that act
with older weights, corrected off-policy by V-trace. One file, backend-neutral.

In a harness actor farm (``run.actors > 0``) this agent (``on_policy = False``, sequences kept
per env) gets ``rollout_len``-step chunks from every actor in actor order, generated with
weights up to ``run.max_policy_lag`` versions old: IMPALA's asynchronous actors and learner with
a bounded lag. The behaviour policy's log-probabilities travel with the rollouts (``sample``'s
extras); ``learn`` scores the batch under the current weights and corrects with V-trace. In a
serial run (``run.actors = 0``) behaviour and target policy coincide and rho = 1.

Differences from the paper: Adam instead of RMSProp (harness backends offer Adam only); no LSTM;
the loss is averaged over the batch rather than summed (Adam is insensitive to the scale).
Observations with three axes (stacked frames) go through the backend's Nature-CNN trunk
(``backend.cnn``), flat ones through separate actor and critic MLPs. Discrete and box actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.data import RolloutBuffer

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

    def __post_init__(self) -> None:
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


class IMPALA(Algorithm):
    """The V-trace actor-critic update on one batch of unrolls."""

    def __init__(self, backend: Backend, info: EnvInfo, config: IMPALAConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.discrete = info.action.kind == "discrete"
        self.image = len(info.observation.shape) == 3
        act_dim = info.action.n if self.discrete else info.action.flat_dim
        if self.image:  # a shared convolutional trunk with linear policy and value heads
            preset = CNN_PRESETS[config.cnn]
            trunk = backend.cnn(info.observation.shape, **preset)
            width = int(preset["out_dim"])
            self.net = backend.group(
                trunk=trunk,
                policy=backend.mlp(width, [], act_dim, out_gain=0.01),
                value=backend.mlp(width, [], 1),
            )
        else:  # separate actor and critic MLPs, evaluated together
            self.net = backend.parallel_mlp(
                info.observation.flat_dim,
                config.hidden,
                [act_dim, 1],
                activation=config.activation,
                out_gains=[0.01, 1.0],
            )
        params: list[Any] = [self.net]
        if not self.discrete:
            self.log_std = backend.parameter(np.full(act_dim, config.log_std_init, np.float32))
            params.append(self.log_std)
        self.optimizer = backend.optimizer(*params, lr=config.learning_rate, eps=config.adam_eps)
        self.obs_dtype = "uint8" if np.dtype(info.observation.dtype) == np.uint8 else "float32"
        self.refresh_policy()

    def refresh_policy(self) -> None:
        """Take the numpy copies that acting uses (after any weight change)."""
        bk = self.backend
        if self.image:
            trunk = bk.inference(self.net["trunk"])
            policy, value = bk.inference(self.net["policy"]), bk.inference(self.net["value"])

            def forward(obs: np.ndarray) -> list[np.ndarray]:
                features = trunk(obs)
                return [policy(features), value(features)]

            self._policy: Any = forward
        else:
            self._policy = bk.inference(self.net)
        if not self.discrete:
            self._log_std = np.asarray(bk.numpy(self.log_std), np.float32).copy()

    def forward(self, obs: Any) -> tuple[Any, Any]:
        """Policy-head outputs (logits or means) and state values for a batch."""
        if self.image:
            features = self.net["trunk"](obs)
            return self.net["policy"](features), self.net["value"](features)[:, 0]
        out, value = self.net(obs)
        return out, value[:, 0]

    def distribution(self, out: Any) -> Any:
        bk = self.backend
        return bk.categorical(out) if self.discrete else bk.normal(out, self.log_std)

    def act(
        self, obs: np.ndarray, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions and their log-probabilities under the current weights, sampled with ``rng``
        (greedy actions and an empty array without one), in numpy."""
        out = self._policy(obs)[0]
        if self.discrete:
            logp = out - out.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            if rng is None:
                return logp.argmax(-1), np.empty(0)
            actions = (logp + rng.gumbel(size=logp.shape)).argmax(-1)  # Gumbel-max sampling
            return actions, np.take_along_axis(logp, actions[:, None], -1)[:, 0]
        if rng is None:
            return out, np.empty(0)
        std = np.exp(self._log_std)
        noise = rng.standard_normal(out.shape).astype(np.float32)
        actions = out + std * noise
        logp = (-0.5 * noise**2 - self._log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        return actions, logp.astype(np.float32)

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(obs)[1])[:, 0]

    def learn(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One V-trace step on a batch of unrolls: ``obs`` ``(T, N, ...)``, ``next_obs``
        ``(N, ...)`` (after the last step), ``actions``, ``rewards``, ``discounts``,
        ``behaviour_log_probs`` ``(T, N)``."""
        bk, c = self.backend, self.config
        obs = batch["obs"]
        steps, n = obs.shape[:2]
        rows = steps * n
        every = np.concatenate([obs.reshape(rows, *obs.shape[2:]), batch["next_obs"]])
        actions = batch["actions"].reshape(rows, *batch["actions"].shape[2:])
        act_t = bk.tensor(actions, "int64" if self.discrete else "float32")
        with bk.autocast():
            # one forward pass over the unrolls and the bootstrap observations
            out, all_values = self.forward(bk.tensor(every, self.obs_dtype))
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

    def set_lr(self, progress: float) -> float:
        """Anneal the learning rate; ``progress`` in [0, 1]. Returns it."""
        c = self.config
        lr = (
            c.learning_rate * (1.0 - min(max(progress, 0.0), 1.0))
            if c.anneal_lr
            else c.learning_rate
        )
        self.backend.set_lr(self.optimizer, lr)
        return lr

    def state(self) -> dict[str, Any]:
        bk = self.backend
        state = {"net": bk.state(self.net), "optimizer": bk.state(self.optimizer)}
        if not self.discrete:
            state["log_std"] = bk.state(self.log_std)
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk = self.backend
        bk.load_state(self.net, state["net"])
        bk.load_state(self.optimizer, state["optimizer"])
        if not self.discrete:
            bk.load_state(self.log_std, state["log_std"])
        self.refresh_policy()

    def policy_weights(self) -> dict[str, np.ndarray]:
        weights = self.backend.get_weights(self.net)
        if not self.discrete:
            weights["log_std"] = self.backend.numpy(self.log_std)
        return weights

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        w = dict(weights)
        log_std = w.pop("log_std", None)
        self.backend.set_weights(self.net, w)
        if log_std is not None:
            self.backend.assign(self.log_std, log_std)
        self.refresh_policy()


class IMPALAAgent(Agent):
    """Unroll storage with the behaviour log-probabilities, truncation bootstrapping and the
    update schedule around :class:`IMPALA`."""

    algorithm: IMPALA
    config: IMPALAConfig
    on_policy = False  # actors may lag (run.max_policy_lag): V-trace corrects for it
    independent_transitions = False  # unrolls are sequences per env

    def __init__(
        self, algorithm: IMPALA, info: EnvInfo, config: IMPALAConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "impala"
        self.rollout_len = config.rollout_len
        self.discrete = info.action.kind == "discrete"
        self.buffer = RolloutBuffer(
            config.rollout_len,
            info.num_envs,
            info.observation.shape,
            () if self.discrete else info.action.shape,
            obs_dtype=np.dtype(info.observation.dtype),
            action_dtype=np.int64 if self.discrete else np.float32,
        )
        if not self.discrete:
            self.low = np.asarray(info.action.low, np.float32).reshape(info.action.shape)
            self.high = np.asarray(info.action.high, np.float32).reshape(info.action.shape)
        self._no_values = np.zeros(info.num_envs, np.float32)
        self._last_next_obs: np.ndarray | None = None

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions if self.discrete else np.clip(actions, self.low, self.high)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, log_probs = self.algorithm.act(obs, self.rng)
        return self._to_env(actions), {"log_prob": log_probs, "action": actions}

    def predict(self, obs: np.ndarray) -> np.ndarray:
        return self._to_env(self.algorithm.act(obs)[0])

    def observe(self, transition: Transition) -> None:
        t = transition
        rewards = t.rewards.astype(np.float32)
        truncated = t.truncated & ~t.terminated
        if truncated.any():  # the clock ended the episode, not the MDP: bootstrap V(final obs)
            idx = np.flatnonzero(truncated)
            rewards[idx] += self.config.gamma * self.algorithm.values(t.next_obs[idx])
        dones = (t.terminated | t.truncated).astype(np.float32)
        x = t.extras
        self.buffer.add(t.obs, x["action"], rewards, dones, self._no_values, x["log_prob"])
        self._last_next_obs = t.next_obs
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        if not self.buffer.full or self._last_next_obs is None:
            return {}
        c, buf = self.config, self.buffer
        lr = self.algorithm.set_lr(self.env_steps / self.total_steps)
        batch = {
            "obs": buf.obs,
            "next_obs": self._last_next_obs,
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
        buf.reset()
        self.algorithm.refresh_policy()
        totals["charts/learning_rate"] = lr
        return totals


def make_agent(
    info: EnvInfo, backend: Backend, config: IMPALAConfig, *, seed: int = 0, total_steps: int = 1
) -> IMPALAAgent:
    return IMPALAAgent(
        IMPALA(backend, info, config), info, config, seed=seed, total_steps=total_steps
    )
