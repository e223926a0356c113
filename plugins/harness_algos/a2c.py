"""A2C (Mnih et al. 2016), synchronous advantage actor-critic as in Stable-Baselines3: short
rollouts over vectorized envs, GAE (lambda 1 by default: plain n-step returns), one update per
rollout on policy loss + value loss - entropy bonus. Discrete (categorical) and box (diagonal
Gaussian) actions. One file, backend-neutral.

On an actor farm (``run.actors > 0``) the rollouts stay synchronous: the agent is on-policy, so
every actor steps with the newest weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.data import RolloutBatch, RolloutBuffer


@dataclass
class A2CConfig:
    """A2C hyper-parameters ([algo] section). Defaults are SB3's, except the optimiser: SB3
    uses RMSprop (alpha 0.99, eps 1e-5), the backends offer Adam, so this is Adam with eps 1e-5
    (it reaches the same CartPole scores; see competitions/cartpole/a2c.toml)."""

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
        if self.n_steps < 1:
            raise ValueError("n_steps must be >= 1")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda = {self.gae_lambda} must be in [0, 1]")


class A2C(Algorithm):
    """The actor-critic loss and its single gradient step per rollout."""

    def __init__(self, backend: Backend, info: EnvInfo, config: A2CConfig) -> None:
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
        self.optimizer = backend.optimizer(*params, lr=config.learning_rate, eps=config.adam_eps)
        self.refresh_policy()

    def refresh_policy(self) -> None:
        """Take the numpy copy of the networks that acting uses (after any weight change)."""
        self._policy = self.backend.inference(self.net)
        if not self.discrete:
            self._log_std = np.asarray(self.backend.numpy(self.log_std), np.float32).copy()

    def act(
        self, obs: np.ndarray, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions sampled with ``rng`` (greedy without one) and the state values, from one
        numpy forward pass of both networks (acting issues no framework operation)."""
        out, value = self._policy(obs)
        if self.discrete:
            if rng is None:
                return out.argmax(-1), value[:, 0]
            # Gumbel-max sampling: argmax(logits + Gumbel noise) ~ softmax(logits)
            return (out + rng.gumbel(size=out.shape)).argmax(-1), value[:, 0]
        if rng is None:
            return out, value[:, 0]
        noise = rng.standard_normal(out.shape).astype(np.float32)
        return out + np.exp(self._log_std) * noise, value[:, 0]

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(obs)[1][:, 0], np.float32)

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """One step on ``-mean(A * log pi(a|s)) + vf_coef * mse(V, R) - ent_coef * H``."""
        bk, c = self.backend, self.config
        obs = bk.tensor(batch.obs)
        actions = bk.tensor(batch.actions, "int64" if self.discrete else "float32")
        adv, returns = bk.tensor(batch.advantages), bk.tensor(batch.returns)
        with bk.autocast():
            out, value = self.net(obs)
            dist = bk.categorical(out) if self.discrete else bk.normal(out, self.log_std)
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

    def set_schedule(self, progress: float) -> float:
        """Anneal the learning rate; ``progress`` in [0, 1]. Returns the lr."""
        c = self.config
        frac = 1.0 - min(max(progress, 0.0), 1.0)
        lr = c.learning_rate * frac if c.anneal_lr else c.learning_rate
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


class A2CAgent(Agent):
    """Rollout collection, truncation bootstrapping and GAE around :class:`A2C`."""

    algorithm: A2C
    config: A2CConfig

    def __init__(
        self, algorithm: A2C, info: EnvInfo, config: A2CConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "a2c"
        self.on_policy = True
        self.rollout_len = config.n_steps
        self.discrete = info.action.kind == "discrete"
        self.buffer = RolloutBuffer(
            config.n_steps,
            info.num_envs,
            info.observation.shape,
            () if self.discrete else info.action.shape,
            action_dtype=np.int64 if self.discrete else np.float32,
        )
        if not self.discrete:
            self.low = np.asarray(info.action.low, np.float32).reshape(info.action.shape)
            self.high = np.asarray(info.action.high, np.float32).reshape(info.action.shape)
        self._no_log_probs = np.zeros(info.num_envs, np.float32)  # (the buffer's PPO column)
        self._last_next_obs: np.ndarray | None = None

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions if self.discrete else np.clip(actions, self.low, self.high)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, values = self.algorithm.act(obs, self.rng)
        # the unclipped action is what the Gaussian's log-probability is taken of
        return self._to_env(actions), {"action": actions, "value": values}

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
        self.buffer.add(t.obs, x["action"], rewards, dones, x["value"], self._no_log_probs)
        self._last_next_obs = t.next_obs
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        if not self.buffer.full or self._last_next_obs is None:
            return {}
        c = self.config
        lr = self.algorithm.set_schedule(self.env_steps / self.total_steps)
        last_values = self.algorithm.values(self._last_next_obs)
        self.buffer.compute_gae(last_values, c.gamma, c.gae_lambda)
        # the whole rollout as one batch (the shuffle inside does not change the gradient)
        batch = next(
            self.buffer.minibatches(
                self.buffer.size, self.rng, normalize_advantages=c.normalize_advantage
            )
        )
        metrics = self.algorithm.learn(batch)
        self.updates += 1
        self.buffer.reset()
        self.algorithm.refresh_policy()
        metrics["charts/learning_rate"] = lr
        return metrics


def make_agent(
    info: EnvInfo, backend: Backend, config: A2CConfig, *, seed: int = 0, total_steps: int = 1
) -> A2CAgent:
    return A2CAgent(A2C(backend, info, config), info, config, seed=seed, total_steps=total_steps)
