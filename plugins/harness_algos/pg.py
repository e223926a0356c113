"""Vanilla policy gradient: REINFORCE (Williams 1992) with a learned state-value baseline.
Discrete (categorical) and box (diagonal Gaussian) actions. One file, backend-neutral.

Experience comes in fixed-length rollouts of ``n_steps`` per env, like the other on-policy
algorithms, rather than whole episodes: the return-to-go of each step is the discounted sum of
the rewards after it, cut at episode ends and completed with ``V`` only where the rollout (or a
time limit) cuts an episode short. The advantage ``G_t - V(s_t)`` drives one policy-gradient
step per rollout; the baseline is then fitted to the returns with its own optimiser."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.data import RolloutBatch, RolloutBuffer


@dataclass
class PGConfig:
    """Policy-gradient hyper-parameters ([algo] section); defaults solve CartPole-v1."""

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
        if self.n_steps < 1 or self.value_steps < 0:
            raise ValueError("n_steps must be >= 1 and value_steps >= 0")


class PG(Algorithm):
    """The policy-gradient step and the baseline's regression steps."""

    def __init__(self, backend: Backend, info: EnvInfo, config: PGConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.discrete = info.action.kind == "discrete"
        obs_dim = info.observation.flat_dim
        act_dim = info.action.n if self.discrete else info.action.flat_dim
        # two networks with two optimisers: the baseline's extra steps leave the policy alone
        self.policy = backend.mlp(
            obs_dim, config.hidden, act_dim, activation=config.activation, out_gain=0.01
        )
        self.critic = backend.mlp(obs_dim, config.hidden, 1, activation=config.activation)
        params: list[Any] = [self.policy]
        if not self.discrete:
            self.log_std = backend.parameter(np.full(act_dim, config.log_std_init, np.float32))
            params.append(self.log_std)
        self.pi_optimizer = backend.optimizer(*params, lr=config.learning_rate)
        self.vf_optimizer = backend.optimizer(self.critic, lr=config.vf_learning_rate)
        self.refresh()

    def refresh(self) -> None:
        """Take the numpy copies of the networks (after any weight change)."""
        self._policy = self.backend.inference(self.policy)
        self._critic = self.backend.inference(self.critic)
        if not self.discrete:
            self._log_std = np.asarray(self.backend.numpy(self.log_std), np.float32).copy()

    def act(self, obs: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Actions sampled with ``rng`` (greedy without one), on the numpy copy of the policy."""
        out = self._policy(obs)
        if self.discrete:
            if rng is None:
                return np.asarray(out.argmax(-1))
            # Gumbel-max sampling: argmax(logits + Gumbel noise) ~ softmax(logits)
            return np.asarray((out + rng.gumbel(size=out.shape)).argmax(-1))
        if rng is None:
            return np.asarray(out)
        noise = rng.standard_normal(out.shape).astype(np.float32)
        return np.asarray(out + np.exp(self._log_std) * noise)

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self._critic(obs)[:, 0], np.float32)

    def learn(self, batch: RolloutBatch) -> dict[str, float]:
        """One policy step on ``-mean(A * log pi(a|s)) - ent_coef * H``, then ``value_steps``
        baseline steps on ``mse(V(s), G)``."""
        bk, c = self.backend, self.config
        obs = bk.tensor(batch.obs)
        actions = bk.tensor(batch.actions, "int64" if self.discrete else "float32")
        adv, returns = bk.tensor(batch.advantages), bk.tensor(batch.returns)
        with bk.autocast():
            out = self.policy(obs)
            dist = bk.categorical(out) if self.discrete else bk.normal(out, self.log_std)
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
        frac = 1.0 - min(max(progress, 0.0), 1.0) if c.anneal_lr else 1.0
        self.backend.set_lr(self.pi_optimizer, c.learning_rate * frac)
        self.backend.set_lr(self.vf_optimizer, c.vf_learning_rate * frac)
        return c.learning_rate * frac

    def state(self) -> dict[str, Any]:
        bk = self.backend
        state = {
            "policy": bk.state(self.policy),
            "critic": bk.state(self.critic),
            "pi_optimizer": bk.state(self.pi_optimizer),
            "vf_optimizer": bk.state(self.vf_optimizer),
        }
        if not self.discrete:
            state["log_std"] = bk.state(self.log_std)
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk = self.backend
        bk.load_state(self.policy, state["policy"])
        bk.load_state(self.critic, state["critic"])
        bk.load_state(self.pi_optimizer, state["pi_optimizer"])
        bk.load_state(self.vf_optimizer, state["vf_optimizer"])
        if not self.discrete:
            bk.load_state(self.log_std, state["log_std"])
        self.refresh()

    def policy_weights(self) -> dict[str, np.ndarray]:
        """The policy only: actors never need the baseline."""
        weights = self.backend.get_weights(self.policy)
        if not self.discrete:
            weights["log_std"] = self.backend.numpy(self.log_std)
        return weights

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        w = dict(weights)
        log_std = w.pop("log_std", None)
        self.backend.set_weights(self.policy, w)
        if log_std is not None:
            self.backend.assign(self.log_std, log_std)
        self.refresh()


class PGAgent(Agent):
    """Rollout collection, truncation bootstrapping and the returns-to-go around :class:`PG`."""

    algorithm: PG
    config: PGConfig

    def __init__(
        self, algorithm: PG, info: EnvInfo, config: PGConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "pg"
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
        self._zeros = np.zeros(info.num_envs, np.float32)
        self._last_next_obs: np.ndarray | None = None

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions if self.discrete else np.clip(actions, self.low, self.high)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions = self.algorithm.act(obs, self.rng)
        # the unclipped action is what the Gaussian's log-probability is taken of
        return self._to_env(actions), {"action": actions}

    def predict(self, obs: np.ndarray) -> np.ndarray:
        return self._to_env(self.algorithm.act(obs))

    def observe(self, transition: Transition) -> None:
        t = transition
        rewards = t.rewards.astype(np.float32)
        truncated = t.truncated & ~t.terminated
        if truncated.any():  # the episode did not end, the clock did: bootstrap V(final obs)
            idx = np.flatnonzero(truncated)
            rewards[idx] += self.config.gamma * self.algorithm.values(t.next_obs[idx])
        dones = (t.terminated | t.truncated).astype(np.float32)
        # values are filled in by learn() in one batched pass; log-probs are not needed
        self.buffer.add(t.obs, t.extras["action"], rewards, dones, self._zeros, self._zeros)
        self._last_next_obs = t.next_obs
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        if not self.buffer.full or self._last_next_obs is None:
            return {}
        c, buf = self.config, self.buffer
        lr = self.algorithm.set_schedule(self.env_steps / self.total_steps)
        flat_obs = buf.obs.reshape(buf.size, *buf.obs_shape)
        buf.values[:] = self.algorithm.values(flat_obs).reshape(buf.num_steps, buf.num_envs)
        # GAE with lambda = 1 is exactly the discounted return-to-go, cut at episode ends and
        # bootstrapped from V(last obs) where the rollout cuts an episode, minus V(s_t)
        buf.compute_gae(self.algorithm.values(self._last_next_obs), c.gamma, 1.0)
        batch = next(
            buf.minibatches(buf.size, self.rng, normalize_advantages=c.normalize_advantage)
        )
        metrics = self.algorithm.learn(batch)
        self.updates += 1
        buf.reset()
        self.algorithm.refresh()
        metrics["charts/learning_rate"] = lr
        return metrics


def make_agent(
    info: EnvInfo, backend: Backend, config: PGConfig, *, seed: int = 0, total_steps: int = 1
) -> PGAgent:
    return PGAgent(PG(backend, info, config), info, config, seed=seed, total_steps=total_steps)
