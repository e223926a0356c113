"""MAPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent
Games"): PPO with one actor shared by every agent and a centralised critic.

* **Actor**: each agent's own observation, zero-padded to the widest agent's, with its one-hot
  id appended (parameter sharing with agent identity); categorical or diagonal-Gaussian
  actions as in PPO.
* **Critic**: V(s, id) on the global state - the concatenation of every agent's (unpadded)
  observation, PettingZoo MPE's ``state()`` - with the agent's one-hot id (the paper's
  "agent-specific global state" reduced to its simplest form).
* **Rewards**: with ``team_reward`` (the default, for cooperative tasks) every agent learns
  from the team's reward, the sum over agents (:func:`harness.api.team_reward`, the runner's
  ``charts/episodic_return``); without it each agent from its own (mixed or competitive
  tasks).
* Everything else is the house PPO, reused rather than copied: each (env, agent) pair is one
  column of :class:`~harness.data.RolloutBuffer` (GAE per agent, shuffled minibatches over
  steps x envs x agents), truncated episodes bootstrap V(final state), the clipped surrogate
  and value loss are :meth:`harness_algos.ppo.PPO.learn`, the epoch/minibatch loop is
  :meth:`harness_algos.ppo.PPOAgent.learn_rollout`. A stored sample is the actor's input
  and the critic's side by side; the networks read their own slice.

With ``value_norm`` (the paper's ValueNorm, on by default) the critic regresses returns
standardised by their running mean and variance: MPE team returns are of order -100, whose
raw squared errors (~1000) would dominate the shared gradient-norm clip and starve the actor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo, Obs, SpaceInfo, Transition, team_reward
from harness.data import RolloutBatch, RolloutBuffer
from harness.policy import ActingParts
from harness_algos.moments import merge_stats
from harness_algos.onpolicy import ActorCritic, env_actions, normalization, rollout_program
from harness_algos.ppo import PPO, PPOAgent
from harness_algos.qmix import Layout
from harness_algos.rollout_policy import RolloutPolicy


@dataclass
class MAPPOConfig:
    """MAPPO hyper-parameters ([algo] section). Defaults after the paper's MPE settings
    (Yu et al. 2022, appendix: lr 7e-4, 10 epochs, one minibatch, entropy 0.01, clip 0.2,
    gradient clip 10, value loss coefficient 1)."""

    learning_rate: float = 7e-4
    """Adam step size (actor and critic)."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over the run."""
    n_steps: int = 100
    """Vector steps per rollout (per env); a rollout holds n_steps * envs * agents samples."""
    batch_size: int = 1 << 30
    """Minibatch size in samples (agent steps); larger than a rollout: one minibatch."""
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
    clip_vloss: bool = True
    """Clip the value loss around the old values too (the paper's value clipping)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 1.0
    """Value loss coefficient."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    normalize_advantage: bool = True
    """Normalise advantages per minibatch."""
    target_kl: float | None = None
    """Stop the epoch loop early when the approximate KL exceeds this."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the actor and of the critic."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    log_std_init: float = 0.0
    """Initial log standard deviation for box actions."""
    team_reward: bool = True
    """Train every agent on the team's reward (sum over agents); off: each on its own."""
    value_norm: bool = True
    """Standardise the critic's targets by the running mean/variance of the returns."""

    def __post_init__(self) -> None:
        if self.n_steps < 1 or self.batch_size < 1 or self.n_epochs < 1:
            raise ValueError("n_steps, batch_size and n_epochs must be >= 1")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden = {self.hidden}: at least one layer, each width >= 1")


class ValueNorm:
    """Running mean and variance of the returns (all of them seen so far, merged batch by
    batch), to standardise the critic's targets and undo it on its outputs."""

    def __init__(self) -> None:
        self.stats = np.array([0.0, 1.0, 0.0])  # mean, variance, count

    def update(self, x: np.ndarray) -> None:
        self.stats = merge_stats(self.stats, x)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        mean, var, _ = self.stats
        return np.asarray((x - mean) / np.sqrt(var + 1e-8), np.float32)

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        mean, var, _ = self.stats
        return np.asarray(x * np.sqrt(var + 1e-8) + mean, np.float32)


class _NormalizedRollout(RolloutBuffer):
    """A rollout whose returns and old values are standardised by ``norm`` (updated with the
    returns first) once GAE has used them in return units."""

    norm: ValueNorm

    def compute_gae(self, last_values: Any, gamma: float, gae_lambda: float) -> None:
        super().compute_gae(last_values, gamma, gae_lambda)
        self.norm.update(self.returns)
        self.returns[:] = self.norm.normalize(self.returns)
        self.values[:] = self.norm.normalize(self.values)


class MAPPO(PPO):
    """The shared actor and the centralised critic; the update is :meth:`PPO.learn` on
    samples that hold both networks' inputs side by side."""

    config: MAPPOConfig

    def __init__(
        self, backend: Backend, layout: Layout, info: EnvInfo, config: MAPPOConfig
    ) -> None:
        # (PPO's own __init__ builds a single-agent network: only its update is reused)
        ActorCritic.__init__(self, backend, info, config.log_std_init)
        self.config = config
        self.layout = layout
        self.actor_dim = layout.obs_dim + layout.num_agents
        self.critic_dim = layout.state_dim + layout.num_agents
        act = config.activation
        self.actor = backend.mlp(
            self.actor_dim, config.hidden, self.act_dim, activation=act, out_gain=0.01
        )
        self.critic = backend.mlp(self.critic_dim, config.hidden, 1, activation=act)
        self.net = backend.group(actor=self.actor, critic=self.critic)
        self.optimizer = backend.optimizer(
            *self.trainable(self.net), lr=config.learning_rate, eps=1e-5
        )
        self.clip_range = config.clip_range
        self._batch: RolloutBatch | None = None
        self._tensors: tuple[Any, ...] = ()
        self.value_norm = ValueNorm() if config.value_norm else None
        self.refresh_policy()

    def state(self) -> dict[str, Any]:
        state = super().state()
        if self.value_norm is not None:
            state["value_norm"] = self.value_norm.stats.copy()
        return state

    def load_state(self, state: Any) -> None:
        if self.value_norm is not None:
            self.value_norm.stats = np.asarray(state["value_norm"], np.float64).copy()
        super().load_state(state)

    def acting_model(self) -> Any:
        return self.actor

    def checkpoint_parts(self) -> dict[str, Any]:
        return {"net": self.net, "optimizer": self.optimizer}

    def refresh_policy(self) -> None:
        super().refresh_policy()
        self._critic = self.backend.inference(self.critic)

    def forward(self, obs: Any, sequences: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
        """The action distribution and values of samples ``[actor input | critic input]``
        (feed-forward networks: ``sequences`` is always None)."""
        out = self.actor(obs[:, : self.actor_dim])
        value = self.critic(obs[:, self.actor_dim :])
        return self.distribution(out), value[:, 0]

    def act(
        self,
        x: np.ndarray,
        rnn: np.ndarray | None,
        rng: np.random.Generator | None,
        noise: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Actions for actor inputs ``(n * A, actor_dim)`` (greedy without ``rng``) and,
        exploring, the actions and their log-probabilities per env and agent ``(n, A, ...)``
        as extras (feed-forward: no state)."""
        actions, log_probs = self.sample_with_log_probs(self._policy(x), rng)
        if rng is None:
            return actions, {}, None
        a = self.layout.num_agents
        extras = {
            "action": actions.reshape(-1, a, *actions.shape[1:]),
            "log_prob": log_probs.reshape(-1, a),
        }
        return actions, extras, None

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V of samples ``[actor input | critic input]`` (numpy, in return units)."""
        out = np.asarray(self._critic(obs[:, self.actor_dim :])[:, 0])
        return out if self.value_norm is None else self.value_norm.denormalize(out)


class MAPPOAgent(PPOAgent):
    """Agent-keyed observations, actions and rewards to and from PPO's rollout columns (one
    per env and agent, env-major)."""

    name = "mappo"
    algorithm: MAPPO
    config: MAPPOConfig  # type: ignore[assignment]

    def __init__(
        self, algorithm: MAPPO, info: EnvInfo, config: MAPPOConfig, *, seed: int, total_steps: int
    ) -> None:
        lay = algorithm.layout
        width = algorithm.actor_dim + algorithm.critic_dim
        columns = dataclasses.replace(
            info,
            observation=SpaceInfo("box", (width,), "float32"),
            action=lay.action,
            num_envs=info.num_envs * lay.num_agents,
        )
        super().__init__(algorithm, columns, config, seed=seed, total_steps=total_steps)  # type: ignore[arg-type]
        self.env_info = info
        self.layout = lay
        if algorithm.value_norm is not None:
            old = self.buffer
            self.buffer = _NormalizedRollout(
                old.num_steps,
                old.num_envs,
                old.obs_shape,
                old.action_shape,
                action_dtype=old.actions.dtype,
            )
            self.buffer.norm = algorithm.value_norm

    def _inputs(self, obs: Obs) -> np.ndarray:
        """``(n * A, actor_dim + critic_dim)``: each agent's actor input and critic input."""
        lay = self.layout
        stacked = lay.stack(obs)
        n, a = stacked.shape[:2]
        state = np.broadcast_to(lay.state(stacked)[:, None], (n, a, lay.state_dim))
        x = np.concatenate([lay.with_ids(stacked), lay.with_ids(state)], axis=-1)
        return x.reshape(n * a, -1)

    def policy(self) -> RolloutPolicy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    def observe(self, transition: Transition) -> None:
        t, lay = transition, self.layout
        n, a = len(t.terminated), lay.num_agents
        if self.config.team_reward:
            rewards = np.repeat(team_reward(t.rewards).astype(np.float32), a)
        else:
            per_agent = [np.asarray(t.rewards[agent], np.float32) for agent in lay.agents]
            rewards = np.stack(per_agent, axis=1).reshape(n * a)
        next_inputs = self._inputs(t.next_obs)
        truncated = np.repeat(np.asarray(t.truncated) & ~np.asarray(t.terminated), a)
        if truncated.any():  # the clock, not the MDP, ended these episodes: bootstrap V
            idx = np.flatnonzero(truncated)
            rewards[idx] += self.config.gamma * self.algorithm.values(next_inputs[idx])
        dones = np.repeat(np.asarray(t.terminated) | np.asarray(t.truncated), a)
        actions = np.asarray(t.extras["action"])
        self.buffer.add(
            self._inputs(t.obs),
            actions.reshape(n * a, *actions.shape[2:]),
            rewards,
            dones.astype(np.float32),
            np.zeros(n * a, np.float32),
            np.asarray(t.extras["log_prob"], np.float32).reshape(n * a),
        )
        self._last_next_obs = next_inputs
        self.env_steps += n


def actor_inputs(layout: Layout, obs: Obs) -> np.ndarray:
    """``(n * A, actor_dim)``: padded observations with agent ids, env-major."""
    x = layout.with_ids(layout.stack(obs))
    return x.reshape(-1, x.shape[-1])


def agent_actions(
    layout: Layout, to_env: Callable[[np.ndarray], np.ndarray], actions: np.ndarray
) -> dict[str, np.ndarray]:
    """The shared actor's actions ``(n * A, ...)``, env-major, as the env takes them
    (``to_env``: clipped to the box) in an agent-keyed dict."""
    n, a = len(actions) // layout.num_agents, layout.num_agents
    per = to_env(actions).reshape(n, a, *actions.shape[1:])
    return {agent: per[:, j].copy() for j, agent in enumerate(layout.agents)}


def make_policy(parts: ActingParts) -> RolloutPolicy:
    """The on-policy family's :class:`~harness_algos.rollout_policy.RolloutPolicy` over
    agent-keyed batches, made from ``parts`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`): each env's agents are rows of the shared actor's inputs
    (:func:`actor_inputs`) and the actions go back as an agent-keyed dict
    (:func:`agent_actions`). What ``onpolicy.make_policy`` does besides (``normalize_obs``,
    correlated noise, a recurrent state) MAPPO has no keys for: its policy is feed-forward and
    stateless."""
    algorithm: MAPPO = parts.algorithm
    layout, info = algorithm.layout, parts.env_info
    to_env = env_actions(dataclasses.replace(info, action=layout.action))
    norm = normalization(parts.config)
    return RolloutPolicy(
        algorithm,
        parts.rng,
        inputs=lambda obs: actor_inputs(layout, obs),
        to_env=lambda actions: agent_actions(layout, to_env, actions),
        load=parts.set_weights,
        program=lambda: rollout_program(algorithm, info, norm),
    )


def make_algorithm(backend: Backend, info: EnvInfo, config: MAPPOConfig) -> MAPPO:
    """The shared actor and the centralised critic for the agents of ``info`` (what a farm
    actor acts with, and the agent's)."""
    layout = Layout(info, "MAPPO", ("discrete", "box"))
    return MAPPO(backend, layout, dataclasses.replace(info, action=layout.action), config)


def make_agent(
    info: EnvInfo, backend: Backend, config: MAPPOConfig, *, seed: int = 0, total_steps: int = 1
) -> MAPPOAgent:
    algorithm = make_algorithm(backend, info, config)
    return MAPPOAgent(algorithm, info, config, seed=seed, total_steps=total_steps)
