"""PPO (Schulman et al. 2017): clipped surrogate, GAE, vectorized envs, advantage
normalisation, linear learning-rate/clip annealing. Discrete (categorical) and box (diagonal
Gaussian) actions. One file, backend-neutral."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.data import RolloutBatch, RolloutBuffer


@dataclass
class PPOConfig:
    """PPO hyper-parameters ([algo] section)."""

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

    def __post_init__(self) -> None:
        if self.n_steps < 1 or self.batch_size < 1 or self.n_epochs < 1:
            raise ValueError("n_steps, batch_size and n_epochs must be >= 1")


class PPO(Algorithm):
    """The clipped-surrogate update on one minibatch."""

    def __init__(self, backend: Backend, info: EnvInfo, config: PPOConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.discrete = info.action.kind == "discrete"
        obs_dim = info.observation.flat_dim
        act_dim = info.action.n if self.discrete else info.action.flat_dim
        # separate actor and critic networks, evaluated together (backend.parallel_mlp)
        self.net = backend.parallel_mlp(
            obs_dim,
            config.hidden,
            [act_dim, 1],
            activation=config.activation,
            out_gains=[0.01, 1.0],
        )
        params: list[Any] = [self.net]
        if not self.discrete:
            self.log_std = backend.parameter(np.full(act_dim, config.log_std_init, np.float32))
            params.append(self.log_std)
        self.optimizer = backend.optimizer(*params, lr=config.learning_rate, eps=1e-5)
        self.clip_range = config.clip_range
        self._batch: RolloutBatch | None = None
        self._tensors: tuple[Any, ...] = ()
        self.refresh_policy()

    def refresh_policy(self) -> None:
        """Take the numpy copy of the networks that acting uses (after any weight change)."""
        self._policy = self.backend.inference(self.net)
        if not self.discrete:
            self._log_std = np.asarray(self.backend.numpy(self.log_std), np.float32).copy()

    def forward(self, obs: Any) -> tuple[Any, Any]:
        """The action distribution and the state values for a batch of observations."""
        out, value = self.net(obs)
        bk = self.backend
        dist = bk.categorical(out) if self.discrete else bk.normal(out, self.log_std)
        return dist, value[:, 0]

    def act(
        self, obs: np.ndarray, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions and their log-probabilities, sampled with ``rng`` (greedy actions and an
        empty array without one). Runs on the numpy copy of the actor: acting issues no
        framework operation. Values are not computed here: :meth:`PPOAgent.learn` scores the
        whole rollout in one batched pass."""
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
        return self._policy(obs)[1][:, 0]

    def learn(self, batch: RolloutBatch, *, diagnostics: bool = True) -> dict[str, float]:
        """One clipped-surrogate step on ``batch``. Passing the same batch object again (a
        rollout that fits in one minibatch, trained for several epochs) reuses its tensors.
        Without ``diagnostics`` the losses, KL and clip fraction are not read back (an empty
        dict is returned), which saves several framework round trips per step."""
        bk, c = self.backend, self.config
        if batch is not self._batch:
            self._batch = batch
            self._tensors = (
                bk.tensor(batch.obs),
                bk.tensor(batch.actions, "int64" if self.discrete else "float32"),
                bk.tensor(batch.log_probs),
                bk.tensor(batch.advantages),
                bk.tensor(batch.returns),
                bk.tensor(batch.values),
            )
        obs, actions, old_logp, adv, returns, old_values = self._tensors
        with bk.autocast():
            d, v = self.forward(obs)
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
        c = self.config
        frac = 1.0 - min(max(progress, 0.0), 1.0)
        lr = c.learning_rate * frac if c.anneal_lr else c.learning_rate
        self.backend.set_lr(self.optimizer, lr)
        self.clip_range = c.clip_range * frac if c.anneal_clip else c.clip_range
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


class PPOAgent(Agent):
    """Rollout collection, truncation bootstrapping, GAE and the epoch/minibatch loop."""

    algorithm: PPO
    config: PPOConfig

    def __init__(
        self, algorithm: PPO, info: EnvInfo, config: PPOConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "ppo"
        self.on_policy = True
        self.rollout_len = config.n_steps
        discrete = info.action.kind == "discrete"
        self.buffer = RolloutBuffer(
            config.n_steps,
            info.num_envs,
            info.observation.shape,
            () if discrete else info.action.shape,
            action_dtype=np.int64 if discrete else np.float32,
        )
        if not discrete:
            self.low = np.asarray(info.action.low, np.float32).reshape(info.action.shape)
            self.high = np.asarray(info.action.high, np.float32).reshape(info.action.shape)
        self.discrete = discrete
        self._no_values = np.zeros(info.num_envs, np.float32)
        self._last_next_obs: np.ndarray | None = None

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions if self.discrete else np.clip(actions, self.low, self.high)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, log_probs = self.algorithm.act(obs, self.rng)
        extras = {"log_prob": log_probs, "action": actions}
        return self._to_env(actions), extras

    def predict(self, obs: np.ndarray) -> np.ndarray:
        return self._to_env(self.algorithm.act(obs)[0])

    def observe(self, transition: Transition) -> None:
        t = transition
        rewards = t.rewards.astype(np.float32)
        truncated = t.truncated & ~t.terminated
        if truncated.any():  # the episode did not end, the clock did: bootstrap V(final obs)
            idx = np.flatnonzero(truncated)
            rewards[idx] += self.config.gamma * self.algorithm.values(t.next_obs[idx])
        dones = (t.terminated | t.truncated).astype(np.float32)
        x = t.extras
        # values are filled in by learn() in one batched pass over the rollout
        self.buffer.add(t.obs, x["action"], rewards, dones, self._no_values, x["log_prob"])
        self._last_next_obs = t.next_obs
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        if not self.buffer.full or self._last_next_obs is None:
            return {}
        c = self.config
        lr = self.algorithm.set_schedule(self.env_steps / self.total_steps)
        buf = self.buffer
        flat_obs = buf.obs.reshape(buf.num_steps * buf.num_envs, *buf.obs_shape)
        buf.values[:] = self.algorithm.values(flat_obs).reshape(buf.num_steps, buf.num_envs)
        last_values = self.algorithm.values(self._last_next_obs)
        self.buffer.compute_gae(last_values, c.gamma, c.gae_lambda)
        totals: dict[str, float] = {}
        count = 0
        # a rollout that fits in one minibatch is the same batch every epoch (the order of
        # samples inside it does not change the gradient): build it once
        one_batch = c.batch_size >= buf.num_steps * buf.num_envs
        batches: list[RolloutBatch] = []
        for epoch in range(c.n_epochs):
            # losses and KL are read back on the last epoch only, or every epoch for target_kl
            diagnostics = c.target_kl is not None or epoch == c.n_epochs - 1
            if not (one_batch and batches):
                batches = list(
                    self.buffer.minibatches(
                        c.batch_size, self.rng, normalize_advantages=c.normalize_advantage
                    )
                )
            for batch in batches:
                metrics = self.algorithm.learn(batch, diagnostics=diagnostics)
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                count += bool(metrics)
                self.updates += 1
            if c.target_kl is not None and metrics["losses/approx_kl"] > c.target_kl:
                break
        self.buffer.reset()
        self.algorithm.refresh_policy()
        out = {k: v / max(count, 1) for k, v in totals.items()}
        out["charts/learning_rate"] = lr
        return out


def make_agent(
    info: EnvInfo, backend: Backend, config: PPOConfig, *, seed: int = 0, total_steps: int = 1
) -> PPOAgent:
    return PPOAgent(PPO(backend, info, config), info, config, seed=seed, total_steps=total_steps)
