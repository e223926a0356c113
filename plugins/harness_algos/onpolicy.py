"""What PPO, A2C, PG and IMPALA share around their updates (each algorithm's config and loss
live in its own file).

All four learn from fixed-length rollouts (``rollout_len`` vector steps per env) with a policy
and a state-value function; outside the loss they do the same things, written once here:

* The policy: categorical logits for discrete actions; Gaussian means with a state-independent
  log standard deviation for box actions (a backend parameter, checkpointed and broadcast as
  ``"log_std"``). :class:`ActorCritic` holds it next to the algorithm's own models and
  optimisers, which it checkpoints under the keys the algorithm names
  (:meth:`~ActorCritic.checkpoint_parts`), and broadcasts the acting model's weights.
* Acting runs on a numpy copy of the acting model (``backend.inference``), taken again after
  every weight change (:meth:`~ActorCritic.refresh_policy`): sampling issues no framework
  operation, whose overhead dominates small networks. Categorical actions are drawn by
  Gumbel-max, Gaussian ones as mean + std * noise (white, or correlated over each env's
  steps with ``noise_correlation``: :mod:`harness_algos.noise`); without an ``rng`` they are
  greedy. The greedy policy is also described as data (:meth:`RolloutAgent.policy_program`,
  made of the numpy copy's own layers) for ``harness export``.
* :class:`RolloutAgent`: the rollout buffer; Gaussian actions clipped to the box on their way
  to the env (the buffer keeps the unclipped action, whose log-probability the loss takes);
  the truncation bootstrap (``reward += gamma * V(final obs)`` where a time limit, not the MDP,
  ended an episode); the learn skeleton (anneal, update on the full rollout, reset, fresh
  numpy copy).

Whether the network is feed-forward or recurrent (``algo.recurrent``) is decided once, when
the algorithm is built, into :attr:`ActorCritic.memory` and the agent's
:attr:`RolloutAgent.memory` (:mod:`harness_algos.memory`); nothing here branches on it.

IMPALA shares all of it but is not ``on_policy``: a farm may hand it rollouts of older weights,
which V-trace corrects for. PG keeps its separate policy and baseline networks with their own
optimisers; its acting model is the policy alone.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.api import Agent, Algorithm, Backend, Distribution, EnvInfo, Transition
from harness.data import RolloutBatch, RolloutBuffer
from harness.errors import ConfigError, IncompatibleError
from harness.numpy_nets import Argmax, Clip, Op, PolicyProgram, Standardize
from harness.policy import ActingParts, Policy
from harness_algos.memory import Memory, RolloutMemory, memory_for
from harness_algos.moments import EPS, Normalization, RunningMoments
from harness_algos.noise import CorrelatedExploration
from harness_algos.rollout_policy import RolloutPolicy


def annealed(value: float, progress: float, anneal: bool) -> float:
    """``value`` scaled linearly down to 0 over ``progress`` in [0, 1] when ``anneal``."""
    return value * (1.0 - min(max(progress, 0.0), 1.0)) if anneal else value


def actor_critic_mlp(
    backend: Backend, info: EnvInfo, hidden: Sequence[int], activation: str
) -> Any:
    """Separate actor and critic MLPs evaluated together (``backend.parallel_mlp``): called on
    an observation batch they return the policy head (logits or means, small initial gain)
    and the state values ``(B, 1)``."""
    act_dim = info.action.n if info.action.kind == "discrete" else info.action.flat_dim
    return backend.parallel_mlp(
        info.observation.flat_dim,
        hidden,
        [act_dim, 1],
        activation=activation,
        out_gains=[0.01, 1.0],
    )


class ActorCritic(Algorithm):
    """A policy acted with in numpy and a value function; subclasses build the networks and
    optimisers (after ``super().__init__``), define the loss, and take the first numpy copy
    with :meth:`refresh_policy` at the end of their ``__init__``."""

    _policy: Callable[..., Any]
    """The numpy copy of :meth:`acting_model` (its outputs as the model's; a recurrent one
    takes and returns the state too)."""
    config: Any
    """The algorithm's config dataclass (set by the subclass)."""
    optimizer: Any
    """The optimiser the default :meth:`set_schedule` anneals (set by the subclass)."""
    _log_std: np.ndarray
    """Box actions: the numpy copy of ``log_std``."""

    def __init__(
        self,
        backend: Backend,
        info: EnvInfo,
        log_std_init: float,
        *,
        recurrent: str = "none",
        rnn_hidden: int = 0,
    ) -> None:
        super().__init__(backend)
        self.recurrent = recurrent
        """``none``, or the kind of the recurrent layer in front of the heads
        (``harness_algos.recurrent``): then the acting model is ``group(core, heads)``."""
        self.memory: Memory = memory_for(recurrent, rnn_hidden)
        """Everything that differs between a feed-forward and a recurrent network, chosen
        here once (:mod:`harness_algos.memory`)."""
        self.discrete = info.action.kind == "discrete"
        self.act_dim = info.action.n if self.discrete else info.action.flat_dim
        """Width of the policy head: one logit per action, or one mean per action dimension."""
        self.action_dtype = "int64" if self.discrete else "float32"
        """Tensor dtype of a batch of actions."""
        self.log_std: Any = None
        """Box actions: the state-independent log standard deviation (a backend parameter)."""
        self.obs_norm: RunningMoments | None = None
        """With ``normalize_obs``: the observation statistics acting and learning use (set by
        :class:`RolloutAgent`; checkpointed, and broadcast as ``obs_mean``/``obs_var``)."""
        if not self.discrete:
            self.log_std = backend.parameter(np.full(self.act_dim, log_std_init, np.float32))

    # --- what each algorithm defines --------------------------------------------------------
    @abc.abstractmethod
    def acting_model(self) -> Any:
        """The network actors act with: its weights and ``log_std`` are the policy weights."""

    @abc.abstractmethod
    def checkpoint_parts(self) -> dict[str, Any]:
        """Every model and optimiser under its checkpoint key (``log_std`` is added to them)."""

    @abc.abstractmethod
    def values(self, obs: np.ndarray) -> np.ndarray:
        """State values of a batch of observations, in numpy (feed-forward networks; a
        recurrent one scores whole sequences: :meth:`sequence_values`)."""

    # --- feed-forward or recurrent networks (algo.recurrent: self.memory) ---------------------
    def network(
        self, info: EnvInfo, hidden: list[int], activation: str, feed_forward: Callable[[], Any]
    ) -> Any:
        """The acting network: ``feed_forward()``, or the recurrent layer of this algorithm's
        ``recurrent`` kind and heads of ``hidden`` widths (:meth:`Memory.network`)."""
        return self.memory.network(self.backend, info, hidden, activation, feed_forward)

    def net_outputs(self, net: Any, obs: Any, sequences: tuple[Any, Any] | None) -> Any:
        """``net``'s outputs on an observation tensor: a feed-forward ``net(obs)``, or with
        ``sequences = (state tensor (B, S), starts (T, B))`` the recurrent layer over
        time-major ``obs`` ``(T, B, ...)`` and the heads on its ``T * B`` outputs (rows in
        time-major order)."""
        return self.memory.net_outputs(net, obs, sequences)

    def sequence_values(self, obs: np.ndarray, starts: np.ndarray, state: np.ndarray) -> Any:
        """State values ``(T, B)`` of time-major observation sequences (recurrent networks),
        one fused pass without gradients."""
        bk = self.backend
        with bk.no_grad():
            out = self.net_outputs(self.acting_model(), bk.tensor(obs), (bk.tensor(state), starts))
        return bk.numpy(out[1])[:, 0].reshape(obs.shape[:2])

    def set_schedule(self, progress: float) -> float:
        """Anneal what the config anneals; ``progress`` in [0, 1]. Returns the (policy's) lr.
        Here: ``config.learning_rate`` of ``self.optimizer`` when ``config.anneal_lr``."""
        lr = annealed(self.config.learning_rate, progress, self.config.anneal_lr)
        self.backend.set_lr(self.optimizer, lr)
        return lr

    # --- the policy -------------------------------------------------------------------------
    def trainable(self, model: Any) -> list[Any]:
        """What the policy's optimiser updates: ``model``, and ``log_std`` for box actions."""
        return [model] if self.discrete else [model, self.log_std]

    def distribution(self, out: Any) -> Distribution:
        """The action distribution from the policy head's tensor output (logits or means)."""
        bk = self.backend
        return bk.categorical(out) if self.discrete else bk.normal(out, self.log_std)

    def numpy_policy(self) -> Callable[..., Any]:
        """A numpy copy of :meth:`acting_model` with its current weights (a recurrent one
        takes and returns the state too: ``(obs, state) -> (outputs, state)``)."""
        return self.memory.numpy_policy(self.backend, self.acting_model())

    def policy_outputs(
        self, obs: np.ndarray, state: np.ndarray | None = None
    ) -> tuple[Any, np.ndarray | None]:
        """The numpy copy's outputs (policy head, values) on ``obs``, and, for a recurrent
        network, the state after this step from ``state``."""
        return self.memory.outputs(self._policy, obs, state)

    def policy_layers(self) -> tuple[Op, ...] | None:
        """The policy head's path through the numpy copy acting uses, as policy-program ops
        (the recurrent layer first where there is one); None when that copy is no numpy
        network (IMPALA's CNN over images)."""
        return self.memory.policy_layers(self._policy)

    def refresh_policy(self) -> None:
        """Take the numpy copies that acting uses (after any weight change)."""
        self._policy = self.numpy_policy()
        if not self.discrete:
            self._log_std = np.asarray(self.backend.numpy(self.log_std), np.float32).copy()

    def sample_actions(self, out: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        """Actions from the policy head's numpy output ``out``, drawn with ``rng`` (greedy
        without one)."""
        if self.discrete:
            if rng is None:
                return np.asarray(out.argmax(-1))
            # Gumbel-max sampling: argmax(logits + Gumbel noise) ~ softmax(logits)
            return np.asarray((out + rng.gumbel(size=out.shape)).argmax(-1))
        if rng is None:
            return np.asarray(out)
        noise = rng.standard_normal(out.shape).astype(np.float32)
        return np.asarray(out + np.exp(self._log_std) * noise)

    def sample_with_log_probs(
        self, out: np.ndarray, rng: np.random.Generator | None, noise: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`sample_actions`, with the actions' log-probabilities (an empty array for
        greedy actions). Box actions: ``noise`` is the standard-normal noise to act with
        (``algo.noise_correlation``'s, :mod:`harness_algos.noise`), drawn from ``rng`` when
        None."""
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
        if noise is None:
            noise = rng.standard_normal(out.shape).astype(np.float32)
        actions = out + std * noise
        logp = (-0.5 * noise**2 - self._log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        return actions, logp.astype(np.float32)

    def act(
        self,
        x: np.ndarray,
        rnn: np.ndarray | None,
        rng: np.random.Generator | None,
        noise: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """One step of the numpy acting copy for policy inputs ``x`` (and, recurrent, the
        state ``rnn``): actions drawn with ``rng`` (greedy without one) with their
        log-probabilities and the actions themselves as the learner's extras, and the state
        after the step (:class:`harness_algos.rollout_policy.ActingNet`). Values are left
        out: the learner scores the whole rollout in one batched pass."""
        outs, after = self.policy_outputs(x, rnn)
        if rng is None:
            return self.sample_actions(outs[0], None), {}, after
        actions, log_probs = self.sample_with_log_probs(outs[0], rng, noise)
        return actions, {"log_prob": log_probs, "action": actions}, after

    # --- checkpoints and weight broadcast ---------------------------------------------------
    def state(self) -> dict[str, Any]:
        bk = self.backend
        state = {key: bk.state(part) for key, part in self.checkpoint_parts().items()}
        if not self.discrete:
            state["log_std"] = bk.state(self.log_std)
        if self.obs_norm is not None:
            state["obs_norm"] = self.obs_norm.state()
        self.memory.mark(state)
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk = self.backend
        self.memory.check(state)
        for key, part in self.checkpoint_parts().items():
            bk.load_state(part, state[key])
        if not self.discrete:
            bk.load_state(self.log_std, state["log_std"])
        if self.obs_norm is not None:
            if "obs_norm" not in state:
                raise ConfigError(
                    "algo.normalize_obs = true, but this checkpoint was trained without it "
                    "(it holds no observation statistics): set algo.normalize_obs = false."
                )
            self.obs_norm.load_state(state["obs_norm"])
        elif "obs_norm" in state:
            raise ConfigError(
                "This checkpoint was trained with algo.normalize_obs = true (it holds "
                "observation statistics the policy needs): set algo.normalize_obs = true."
            )
        self.refresh_policy()

    def check_recurrent_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a checkpoint whose network is recurrent in another way than the config's."""
        self.memory.check(state)

    def policy_weights(self) -> dict[str, np.ndarray]:
        weights = self.backend.get_weights(self.acting_model())
        if not self.discrete:
            weights["log_std"] = np.array(self.backend.numpy(self.log_std), copy=True)
        if self.obs_norm is not None:
            weights["obs_mean"] = self.obs_norm.mean.astype(np.float32)
            weights["obs_var"] = self.obs_norm.var.astype(np.float32)
        return weights

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        w = dict(weights)
        log_std = w.pop("log_std", None)
        obs_mean, obs_var = w.pop("obs_mean", None), w.pop("obs_var", None)
        if self.obs_norm is not None and obs_mean is not None and obs_var is not None:
            self.obs_norm.mean = np.asarray(obs_mean, np.float64)
            self.obs_norm.var = np.asarray(obs_var, np.float64)
        self.backend.set_weights(self.acting_model(), w)
        if log_std is not None:
            self.backend.assign(self.log_std, log_std)
        self.refresh_policy()


class RolloutAgent(Agent):
    """Rollout storage, action clipping, truncation bootstrapping and the learn skeleton around
    an :class:`ActorCritic`; subclasses act (``sample``/``predict``) and update
    (:meth:`learn_rollout`)."""

    algorithm: ActorCritic
    on_policy = True

    def __init__(
        self,
        algorithm: ActorCritic,
        info: EnvInfo,
        config: Any,
        rollout_len: int,
        *,
        seed: int,
        total_steps: int,
        obs_dtype: npt.DTypeLike = np.float32,
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.rollout_len = rollout_len
        self.discrete = info.action.kind == "discrete"
        self.buffer = RolloutBuffer(
            rollout_len,
            info.num_envs,
            info.observation.shape,
            () if self.discrete else info.action.shape,
            obs_dtype=obs_dtype,
            action_dtype=np.int64 if self.discrete else np.float32,
        )
        self._to_env = env_actions(info)
        self._zeros = np.zeros(info.num_envs, np.float32)
        self._last_next_obs: np.ndarray | None = None
        norm = normalization(config)
        self.norm = norm
        """The config's normalisation keys; None for a config without them (MAPPO's)."""
        if norm is not None and norm.normalize_obs:
            if np.dtype(obs_dtype) == np.uint8 or len(info.observation.shape) > 1:
                raise ConfigError(
                    f"algo.normalize_obs = true needs flat observations; {info.env_id} gives "
                    f"{info.observation.dtype} images of shape {info.observation.shape} (the "
                    "CNN scales frames itself): set algo.normalize_obs = false."
                )
            algorithm.obs_norm = RunningMoments(info.observation.shape)
        self._rollout_obs: list[np.ndarray] = []
        """With ``normalize_obs``: the raw observations of the rollout being collected."""
        self.return_norm = RunningMoments() if norm is not None and norm.normalize_reward else None
        """With ``normalize_reward``: moments of the running discounted returns."""
        self._returns = np.zeros(info.num_envs, np.float64)
        self.memory: RolloutMemory = algorithm.memory.rollouts(algorithm, info.num_envs)
        """What the learner keeps of a rollout beside the buffer: nothing for a feed-forward
        network, a recurrent one's states (:mod:`harness_algos.memory`)."""
        rho = config.noise_correlation if isinstance(config, CorrelatedExploration) else 0.0
        self.noise_correlation = float(rho)
        """``algo.noise_correlation`` (0 for a config without it): the policy's exploration
        noise (harness_algos.noise)."""
        if rho > 0 and self.discrete:
            raise ConfigError(
                f"algo.noise_correlation = {rho} correlates the Gaussian "
                f"noise of box actions over time, but {info.env_id} has discrete actions: "
                "set algo.noise_correlation = 0."
            )

    @abc.abstractmethod
    def learn_rollout(self, next_obs: np.ndarray) -> dict[str, float]:
        """The updates on the full rollout in ``self.buffer``; ``next_obs`` are the observations
        after its last step. Returns the metrics."""

    # --- acting ---------------------------------------------------------------------------
    def policy(self) -> Policy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    def policy_program(self) -> PolicyProgram | None:
        """:meth:`predict` as data (:func:`rollout_program`)."""
        return rollout_program(self.algorithm, self.env_info, self.norm)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Sampled actions as the env takes them (Gaussian ones clipped to the box)."""
        return self._to_env(actions)

    def policy_obs(self, obs: np.ndarray) -> np.ndarray:
        """Observations as the policy takes them (:func:`standardized`; the buffer stores
        these)."""
        return standardized(self.algorithm, self.norm, obs)

    def scale_rewards(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """With ``normalize_reward``: rewards divided by the running standard deviation of
        the discounted return (VecNormalize's formula, per env), clipped."""
        if self.return_norm is None or self.norm is None:
            return rewards
        self._returns = self._returns * self.config.gamma + rewards
        self.return_norm.update(self._returns)
        self._returns[dones > 0] = 0.0
        scaled = rewards / np.sqrt(self.return_norm.var + EPS)
        clip = self.norm.clip_reward
        return np.clip(scaled, -clip, clip).astype(np.float32)

    def observe(self, transition: Transition) -> None:
        t = transition
        if self.algorithm.obs_norm is not None:
            self._rollout_obs.append(np.asarray(t.obs))
        obs, next_obs = self.policy_obs(t.obs), self.policy_obs(t.next_obs)
        dones = (t.terminated | t.truncated).astype(np.float32)
        rewards = self.scale_rewards(t.rewards.astype(np.float32), dones)
        if self.buffer.size == 0:  # a recurrent network's: the state each column starts from
            self.memory.begin(t.extras, len(t.rewards), self.name)
        truncated = t.truncated & ~t.terminated
        if truncated.any():  # the episode did not end, the clock did: bootstrap V(final obs)
            idx = np.flatnonzero(truncated)
            step = self.buffer.size // self.buffer.num_envs
            self.memory.truncated(step, idx, next_obs[idx], rewards, self.config.gamma)
        # values and log-probs as sample() gave them (A2C's values; PPO's and IMPALA's
        # log-probs), zeros where it gave none (PPO and PG score the values in learn)
        x = t.extras
        values, log_probs = x.get("value", self._zeros), x.get("log_prob", self._zeros)
        self.buffer.add(obs, x["action"], rewards, dones, values, log_probs)
        self._last_next_obs = next_obs
        self.env_steps += len(t.obs)

    def learn(self) -> dict[str, float]:
        if not self.buffer.full or self._last_next_obs is None:
            return {}
        lr = self.algorithm.set_schedule(self.env_steps / self.total_steps)
        metrics = self.learn_rollout(self._last_next_obs)
        self.memory.clear()
        self.buffer.reset()
        moments = self.algorithm.obs_norm
        if moments is not None and self._rollout_obs:
            # the statistics are part of the policy: they change with the weights, at an update
            moments.update(np.concatenate(self._rollout_obs))
            self._rollout_obs.clear()
        self.algorithm.refresh_policy()
        metrics["charts/learning_rate"] = lr
        return metrics

    def extra_state(self) -> dict[str, Any]:
        state = super().extra_state()
        if self.return_norm is not None:
            state["return_norm"] = self.return_norm.state()
            state["running_returns"] = self._returns.tolist()
        return state

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        super().load_extra_state(state)
        if self.return_norm is not None and "return_norm" in state:
            self.return_norm.load_state(state["return_norm"])
            self._returns = np.asarray(state["running_returns"], np.float64)

    def score_rollout(self, next_obs: np.ndarray) -> np.ndarray:
        """Fill the buffer's values with V of every stored observation, in one batched pass
        (for agents whose ``sample`` does not compute them), and return V of ``next_obs``, the
        observations after the last step. A recurrent network scores each env's sequence
        through the bootstrap step from its first step's state, and adds the truncated
        episodes' bootstrap values to their rewards first (:meth:`RolloutMemory.score`)."""
        return self.memory.score(self.buffer, next_obs, self.config.gamma)

    def whole_rollout(self, normalize_advantages: bool) -> RolloutBatch:
        """The whole rollout as one batch (the shuffle inside does not change the gradient)."""
        return next(
            self.buffer.minibatches(
                self.buffer.size, self.rng, normalize_advantages=normalize_advantages
            )
        )


def normalization(config: Any) -> Normalization | None:
    """The config's normalisation keys; None for a config without them (MAPPO's)."""
    return config if isinstance(config, Normalization) else None


def standardized(algorithm: ActorCritic, norm: Normalization | None, obs: np.ndarray) -> np.ndarray:
    """Observations as the policy takes them: standardised with ``normalize_obs`` (the
    algorithm's running moments; a farm actor's come with each broadcast)."""
    moments = algorithm.obs_norm
    if moments is None or norm is None:
        return obs
    normalized: np.ndarray = moments.normalize(obs, norm.clip_obs)
    return normalized


def rollout_program(
    algorithm: ActorCritic, info: EnvInfo, norm: Normalization | None
) -> PolicyProgram | None:
    """The greedy policy as data: ``normalize_obs``'s standardisation, the policy head's
    layers (after the recurrent layer), then the argmax (discrete) or the clip to the box.
    None for a multi-agent env (MAPPO: agent-keyed batches)."""
    if info.multi_agent:
        return None
    layers = algorithm.policy_layers()
    if layers is None:
        raise IncompatibleError(
            f"{type(algorithm).__name__.lower()} acts on {info.env_id!r} through a network "
            f"without a numpy description (a CNN over image observations of shape "
            f"{info.observation.shape}): only MLP and LSTM/GRU policies over flat "
            "observations can be described (and exported)."
        )
    discrete = info.action.kind == "discrete"
    ops: list[Op] = []
    moments = algorithm.obs_norm
    if moments is not None and norm is not None:  # RunningMoments.normalize's arithmetic
        std = np.sqrt(moments.var + EPS)
        ops.append(Standardize(moments.mean.ravel().copy(), std.ravel(), norm.clip_obs))
    ops += layers
    if discrete:
        ops.append(Argmax())
    else:
        low, high = _box(info)
        ops.append(Clip(low.ravel(), high.ravel()))
    return PolicyProgram(tuple(ops), info.observation.flat_dim, algorithm.act_dim, discrete)


def _box(info: EnvInfo) -> tuple[np.ndarray, np.ndarray]:
    shape = info.action.shape
    low = np.asarray(info.action.low, np.float32).reshape(shape)
    return low, np.asarray(info.action.high, np.float32).reshape(shape)


def env_actions(info: EnvInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Sampled actions as the env takes them: discrete ones as they are, Gaussian ones
    clipped to the box (the agent's ``to_env`` and the policy's, one function)."""
    if info.action.kind == "discrete":
        return np.asarray
    low, high = _box(info)

    def clip(actions: np.ndarray) -> np.ndarray:
        clipped: np.ndarray = np.clip(actions, low, high)
        return clipped

    return clip


def make_policy(parts: ActingParts) -> RolloutPolicy:
    """The on-policy family's :class:`~harness_algos.rollout_policy.RolloutPolicy` (PPO,
    A2C, PG, IMPALA) on ``parts.algorithm``'s numpy copy, exploring with ``parts.rng``; its
    per-env state a recurrent network's and correlated noise's. ``parts``: an agent, or a
    farm actor's :class:`~harness.policy.Acting` (whose algorithm gets the ``normalize_obs``
    moments the agent would give it; each broadcast brings their values)."""
    algorithm: ActorCritic = parts.algorithm
    info, config = parts.env_info, parts.config
    norm = normalization(config)
    if norm is not None and norm.normalize_obs and algorithm.obs_norm is None:
        algorithm.obs_norm = RunningMoments(info.observation.shape)
    rho = config.noise_correlation if isinstance(config, CorrelatedExploration) else 0.0
    return RolloutPolicy(
        algorithm,
        parts.rng,
        inputs=lambda obs: standardized(algorithm, norm, obs),
        to_env=env_actions(info),
        width=algorithm.memory.width,
        rho=float(rho),
        act_dim=algorithm.act_dim,
        load=parts.set_weights,
        program=lambda: rollout_program(algorithm, info, norm),
    )
