"""R2D2 (Kapturowski et al. 2019, "Recurrent Experience Replay in Distributed Reinforcement
Learning"): recurrent DQN on replayed sequences, for discrete actions.

* **Network**: the flattened observation -> an optional MLP trunk (``hidden``) -> one LSTM
  or GRU layer (``backend.recurrent``, ``recurrent`` / ``rnn_hidden``) -> an MLP Q head
  (``head_hidden``), or a dueling pair (value + advantage - mean advantage).
* **Acting** (:class:`R2D2Policy`, made by :func:`make_policy` from an agent or, in a farm
  actor, from the algorithm alone): epsilon-greedy on a numpy copy of the network, stepped
  once per env step from the env's state row (``rnn``, kept by whoever steps the envs and
  zeroed when the env's episode ends). Exploring, it returns the state each step *started
  from* as the extra ``rnn_state``, so the learner stores the exact state a sequence was
  acted from, serially and over a farm (whose actors keep their envs' states across
  chunks). Greedy acting (evaluation) steps its own state rows the same way.
* **Sequences** (:class:`SequenceAssembler`): every env's steps, in time order (the agent has
  ``independent_transitions = False``, so a farm delivers its actors' chunks side by side,
  step by step), are cut into sequences of ``seq_len`` steps; adjacent ones overlap by
  ``overlap`` steps (the paper's 80 / 40) and none crosses an episode end: the last one of an
  episode is shorter and zero-padded with its length stored. Each keeps the observation
  after its last step (truncated and cut sequences bootstrap from it) and the ``rnn_state``
  of its first step (the paper's "stored state").
* **Burn-in**: a sequence that continues an episode trains on its steps from ``burn_in`` on;
  its first ``burn_in`` steps only carry the stored (possibly stale) state forward to fresher
  values. The burn-in is masked out of the loss (one fused op call over the whole sequence per
  network and batch), so gradients of the trained steps also reach back through the burn-in
  steps, where the paper's burn-in runs without gradients. A sequence that starts an
  episode starts from the true zero state and trains on every step: with ``burn_in <=
  overlap`` every step of an episode is trained in some sequence.
* **Targets**: n-step double Q (the online network picks the bootstrap action, a target
  network copied every ``target_update_interval`` updates scores it), truncated at the
  sequence's end; optionally on the paper's rescaled values (``value_rescale``).
* **Prioritized sequence replay**: a sequence's priority is ``eta * max |td| + (1 - eta) *
  mean |td|`` over its trained steps (``priority_eta``, 0.9 as the paper), sampled
  proportionally to ``priority ** per_alpha`` with importance weights ``(p_min / p) **
  per_beta`` (the batch's smallest priority, as :class:`harness.data.PrioritizedReplay`).

A farm actor that is lost is replaced by one with fresh envs, acting from zero states; a
resumed run resets its envs and acting states too. Either way an env's next step does not
continue its last one (its observation is not the one the last step led to, its state is
zeros): the assembler stores the sequence it was writing as cut there (it bootstraps from
that last observation, which is real) and starts a new one, so no sequence splices two
episodes and every stored state is one an actor acted from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.errors import ConfigError, IncompatibleError
from harness.policy import ActingParts, State
from harness.sequences import RECURRENT_KINDS, state_dim
from harness_algos.dqn import EpsilonPolicy, check_q, epsilon_at, explore_rows
from harness_algos.offpolicy import check_replay
from harness_algos.sequence_replay import (
    SequenceAssembler,
    SequenceReplay,
    n_step_targets,
    unrescale,
)


@dataclass
class R2D2Config:
    """R2D2 hyper-parameters ([algo] section). The paper's Atari values are noted where these
    differ; the defaults are sized for CartPole-like tasks (competitions/cartpole/r2d2.toml)."""

    recurrent: str = "lstm"
    """The recurrent layer: 'lstm' (the paper's) or 'gru'."""
    rnn_hidden: int = 64
    """Units of the recurrent layer (the paper: 512)."""
    hidden: list[int] = field(default_factory=lambda: [64])
    """Widths of the MLP trunk between the observation and the recurrent layer ([]: none)."""
    head_hidden: list[int] = field(default_factory=lambda: [64])
    """Hidden widths of the Q head (each of the dueling heads) on the recurrent output. The
    layer's output is bounded (an LSTM's h is in (-1, 1)): with a linear head, Q-values of
    CartPole's size (~60) drove it into saturation, where it no longer told the states apart
    (masked CartPole stuck at returns ~10-40, Q ~60-85 everywhere; measured)."""
    activation: str = "relu"
    """Trunk and head activation: relu, tanh or elu."""
    dueling: bool = True
    """Dueling head on the recurrent output: Q = V + A - mean(A)."""
    double: bool = True
    """Double Q-learning: the online network picks the bootstrap action, the target scores it."""
    learning_rate: float = 1e-3
    """Adam step size (the paper: 1e-4)."""
    batch_size: int = 16
    """Sequences per gradient step (the paper: 64)."""
    gamma: float = 0.99
    """Discount factor (the paper: 0.997)."""
    n_step: int = 5
    """Steps of rewards in each target before it bootstraps (the paper's 5)."""
    seq_len: int = 20
    """Steps per stored sequence, burn-in included (the paper: 80)."""
    burn_in: int = 5
    """Steps at the start of a sequence that continues an episode which only warm up the
    stored state (no loss on them); at most ``overlap`` (the paper: 40)."""
    overlap: int = 10
    """Steps adjacent sequences of an episode share (the paper: 40, half the length)."""
    value_rescale: bool = True
    """The paper's invertible value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x:
    the network learns h(Q), targets are h(r + gamma^n h^-1(Q')). On masked CartPole (Q up
    to ~100 -> h ~9) it made the difference: greedy returns 500 / 500 at 35k / 50k steps
    with it, 278 / 500 without, seed 0 (a serial loop, 10 episodes)."""
    loss: str = "huber"
    """TD loss: 'huber' or 'mse'."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip (the paper: 40)."""
    target_update_interval: int = 100
    """Gradient steps between hard target-network copies (the paper: 2500)."""
    buffer_size: int = 5_000
    """Replay capacity in sequences (the oldest are overwritten)."""
    learning_starts: int = 1_000
    """Env steps collected before the first update."""
    train_freq: int = 64
    """Env steps (summed over envs) between update bursts; sets the rollout length."""
    gradient_steps: int = 8
    """Gradient steps per update burst."""
    exploration_fraction: float = 0.2
    """Fraction of the run over which epsilon decays linearly."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start."""
    exploration_final_eps: float = 0.02
    """Epsilon after the decay."""
    prioritized: bool = True
    """Prioritized sequence replay (off: uniform)."""
    priority_eta: float = 0.9
    """A sequence's priority: eta * max |td| + (1 - eta) * mean |td| over its trained steps."""
    per_alpha: float = 0.9
    """Priority exponent (the paper's 0.9)."""
    per_beta: float = 0.6
    """Importance-sampling exponent (the paper's 0.6, fixed)."""

    def __post_init__(self) -> None:
        if self.recurrent not in RECURRENT_KINDS:
            raise ValueError(
                f"recurrent = {self.recurrent!r} must be one of {', '.join(RECURRENT_KINDS)}"
            )
        check_replay(self.train_freq, self.gradient_steps, self.batch_size)
        check_q(self.loss, self.batch_size, self.target_update_interval)
        positive = {
            "rnn_hidden": self.rnn_hidden,
            "n_step": self.n_step,
            "seq_len": self.seq_len,
            "buffer_size": self.buffer_size,
        }
        bad = [f"{k} = {v}" for k, v in positive.items() if v < 1]
        if bad:
            raise ValueError(f"{', '.join(bad)}: must be >= 1")
        if not 0 <= self.burn_in <= self.overlap < self.seq_len:
            raise ValueError(
                f"burn_in = {self.burn_in}, overlap = {self.overlap}, seq_len = {self.seq_len}: "
                f"need 0 <= burn_in <= overlap < seq_len (a sequence's burn-in steps are "
                f"trained in the sequence before it only if the two overlap that far)"
            )
        if self.buffer_size < self.batch_size:
            raise ValueError(f"buffer_size ({self.buffer_size}) < batch_size ({self.batch_size})")
        if not 0.0 <= self.priority_eta <= 1.0 or not 0.0 <= self.gamma <= 1.0:
            raise ValueError("priority_eta and gamma must be in [0, 1]")
        if self.per_alpha < 0 or self.per_beta < 0 or self.learning_rate < 0:
            raise ValueError("per_alpha, per_beta and learning_rate must be >= 0")


class R2D2(Algorithm):
    """The recurrent Q-network, its target and the sequence TD update."""

    def __init__(self, backend: Backend, info: EnvInfo, config: R2D2Config) -> None:
        super().__init__(backend)
        if info.action.kind != "discrete" or info.multi_agent:
            raise IncompatibleError(
                f"r2d2 learns Q-values of discrete actions for one agent; {info.env_id!r} has "
                f"{'several agents' if info.multi_agent else info.action.kind + ' actions'}."
            )
        if len(info.observation.shape) > 1:
            raise IncompatibleError(
                f"r2d2 feeds flat observations through an MLP trunk; {info.env_id!r} gives "
                f"images of shape {info.observation.shape}, and no CNN trunk in front of the "
                f"recurrent layer is built yet."
            )
        self.config = config
        self.obs_dim = info.observation.flat_dim
        self.n_actions = info.action.n
        self.width = state_dim(config.recurrent, config.rnn_hidden)
        self.heads = ("value", "advantage") if config.dueling else ("q",)
        self.online = self._build()
        self.target = self._build()
        backend.copy_weights(self.target, self.online)
        self.optimizer = backend.optimizer(self.online, lr=config.learning_rate)
        self.refresh_policy()

    def _build(self) -> Any:
        bk, c = self.backend, self.config
        parts: dict[str, Any] = {}
        width = self.obs_dim
        if c.hidden:
            parts["trunk"] = bk.mlp(
                width, c.hidden[:-1], c.hidden[-1], activation=c.activation, activate_output=True
            )
            width = c.hidden[-1]
        parts["rnn"] = bk.recurrent(c.recurrent, width, c.rnn_hidden)
        sizes = {"value": 1, "advantage": self.n_actions, "q": self.n_actions}
        for head in self.heads:
            parts[head] = bk.mlp(c.rnn_hidden, c.head_hidden, sizes[head], activation=c.activation)
        return bk.group(**parts)

    # --- acting (numpy) ---------------------------------------------------------------------
    def refresh_policy(self) -> None:
        """Numpy copies of the online network for acting (after every weight change)."""
        bk, net = self.backend, self.online
        self._trunk = bk.inference(net["trunk"]) if self.config.hidden else None
        self._rnn: Any = bk.inference(net["rnn"])
        self._heads = [bk.inference(net[head]) for head in self.heads]

    def q_step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Q-values ``(B, n_actions)`` of one step from ``state`` ``(B, S)``, and the state
        after it."""
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self._trunk is not None:
            x = self._trunk(x)
        out, after = self._rnn(x, state)
        if not self.config.dueling:
            return self._heads[0](out), after
        value, adv = (head(out) for head in self._heads)
        return value + adv - adv.mean(axis=-1, keepdims=True), after

    # --- learning ---------------------------------------------------------------------------
    def unroll(self, net: Any, obs: Any, state: Any) -> Any:
        """Q-values ``(T, B, n_actions)`` of time-major observations ``(T, B, obs_dim)`` from
        the states ``(B, S)``: one fused recurrent call."""
        bk, c = self.backend, self.config
        steps, width = obs.shape[0], obs.shape[1]
        x = obs.reshape([steps * width, self.obs_dim])
        if c.hidden:
            x = net["trunk"](x)
        out, _ = net["rnn"](x.reshape([steps, width, -1]), state, final=False)
        out = out.reshape([steps * width, c.rnn_hidden])
        if c.dueling:
            adv = net["advantage"](out)
            q = net["value"](out) + adv - bk.mean(adv, axis=-1)[:, None]
        else:
            q = net["q"](out)
        return q.reshape([steps, width, self.n_actions])

    def learn(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        return self.learn_with_priorities(batch)[0]

    def learn_with_priorities(
        self, batch: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step on a batch of sequences (:meth:`SequenceReplay.batch` plus
        ``weights``); also returns each sequence's new priority."""
        bk, c = self.backend, self.config
        steps = len(batch["actions"])  # (L, B)
        obs, state = bk.tensor(batch["obs"]), bk.tensor(batch["state"])
        t = np.arange(steps)[:, None]
        trained = (t >= batch["train_from"][None]) & (t < batch["length"][None])
        with bk.autocast():
            with bk.no_grad():
                q_target = bk.numpy(self.unroll(self.target, obs, state))  # (L + 1, B, A)
            q_all = self.unroll(self.online, obs, state)
            q_online = bk.numpy(q_all)
            if c.double:
                best = q_online.argmax(-1)
                next_values = np.take_along_axis(q_target, best[..., None], -1)[..., 0]
            else:
                next_values = q_target.max(-1)
            y = n_step_targets(
                batch["rewards"],
                batch["length"],
                batch["terminated"],
                next_values,
                c.gamma,
                c.n_step,
                c.value_rescale,
            )
            actions = batch["actions"]
            q = bk.gather(q_all[:steps], bk.tensor(actions, "int64"))  # (L, B)
            target = bk.tensor(y)
            per_step = bk.smooth_l1(q, target) if c.loss == "huber" else bk.mse(q, target)
            scale = trained * batch["weights"][None] / max(int(trained.sum()), 1)
            loss = bk.sum(per_step * bk.tensor(scale.astype(np.float32)))
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        taken = np.take_along_axis(q_online[:steps], actions[..., None], -1)[..., 0]
        td = np.abs(taken - y) * trained
        count = np.maximum(trained.sum(0), 1)
        priorities = c.priority_eta * td.max(0) + (1.0 - c.priority_eta) * td.sum(0) / count
        values = unrescale(taken) if c.value_rescale else taken  # (in return units)
        metrics = {
            "losses/td_loss": bk.item(loss),
            "losses/q_values": float((values * trained).sum() / max(int(trained.sum()), 1)),
            "losses/grad_norm": grad_norm,
        }
        return metrics, priorities

    def sync_target(self) -> None:
        self.backend.copy_weights(self.target, self.online)

    # --- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        bk, c = self.backend, self.config
        return {
            "online": bk.state(self.online),
            "target": bk.state(self.target),
            "optimizer": bk.state(self.optimizer),
            "recurrent": f"{c.recurrent}:{c.rnn_hidden}",
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk, c = self.backend, self.config
        saved, wanted = str(state.get("recurrent", "?")), f"{c.recurrent}:{c.rnn_hidden}"
        if saved != wanted:
            kind, _, hidden = saved.partition(":")
            raise ConfigError(
                f'This checkpoint holds an r2d2 network with algo.recurrent = "{kind}", '
                f"algo.rnn_hidden = {hidden}, but the config asks for algo.recurrent = "
                f'"{c.recurrent}", algo.rnn_hidden = {c.rnn_hidden}: set '
                f"--set algo.recurrent={kind} --set algo.rnn_hidden={hidden} to load it."
            )
        bk.load_state(self.online, state["online"])
        bk.load_state(self.target, state["target"])
        bk.load_state(self.optimizer, state["optimizer"])
        self.refresh_policy()

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.online)

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.online, weights)
        self.refresh_policy()


class R2D2Agent(Agent):
    """Epsilon-greedy recurrent acting, sequence assembly, prioritized sequence replay and the
    update schedule around :class:`R2D2`."""

    name = "r2d2"
    on_policy = False
    independent_transitions = False  # per-env sequences: a farm delivers chunks side by side
    algorithm: R2D2
    config: R2D2Config

    def __init__(
        self, algorithm: R2D2, info: EnvInfo, config: R2D2Config, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.rollout_len = max(1, config.train_freq // info.num_envs)
        self.width = algorithm.width
        self.replay = SequenceReplay(
            config.buffer_size,
            config.seq_len,
            algorithm.obs_dim,
            self.width,
            alpha=config.per_alpha,
        )
        self.assembler = SequenceAssembler(
            self.replay,
            info.num_envs,
            algorithm.obs_dim,
            self.width,
            seq_len=config.seq_len,
            overlap=config.overlap,
            burn_in=config.burn_in,
        )

    # --- acting -----------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """DQN's schedule (:func:`~harness_algos.dqn.epsilon_at`: the same keys)."""
        return epsilon_at(self)

    def policy(self) -> R2D2Policy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    # --- experience -------------------------------------------------------------------------
    def observe(self, transition: Transition) -> None:
        t = transition
        n = len(t.rewards)
        states = t.extras.get("rnn_state")
        if states is None or np.shape(states) != (n, self.width):
            raise ValueError(
                f"r2d2 stores the state each sequence was acted from: every step needs the "
                f"(envs, {self.width}) 'rnn_state' extra its policy's act() returns (got "
                f"{None if states is None else np.shape(states)})"
            )
        self.assembler.add(
            np.asarray(t.obs, np.float32).reshape(n, -1),
            np.asarray(t.actions, np.int64),
            np.asarray(t.rewards, np.float32),
            np.asarray(t.next_obs, np.float32).reshape(n, -1),
            np.asarray(t.terminated),
            np.asarray(t.truncated),
            np.asarray(states, np.float32),
        )
        self.env_steps += n

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.env_steps < c.learning_starts or self.replay.size < c.batch_size:
            return {"charts/epsilon": self.epsilon}
        totals: dict[str, float] = {}
        for _ in range(c.gradient_steps):
            indices, weights = self.replay.sample(c.batch_size, self.rng, c.per_beta, c.prioritized)
            batch = self.replay.batch(indices) | {"weights": weights}
            metrics, priorities = self.algorithm.learn_with_priorities(batch)
            if c.prioritized:
                self.replay.update_priorities(indices, priorities)
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / c.gradient_steps
            self.updates += 1
            if self.updates % c.target_update_interval == 0:
                self.algorithm.sync_target()
        if c.gradient_steps:
            self.algorithm.refresh_policy()
        totals["charts/epsilon"] = self.epsilon
        totals["charts/replay_sequences"] = float(self.replay.size)
        return totals

    # --- resume -----------------------------------------------------------------------------
    def data_state(self) -> dict[str, np.ndarray]:
        # no acting state: a resumed run's envs start fresh episodes from zero states (the
        # stepper's initial_state), and the assembler cuts the sequences those episodes
        # interrupt (the module doc)
        return self.replay.state_dict() | self.assembler.state_dict()

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Also reads checkpoints that hold the acting state agents once kept
        (``acting/state``, ignored)."""
        self.replay.load_state_dict(state)
        self.assembler.load_state_dict(state)


class R2D2Policy(EpsilonPolicy):
    """Epsilon-greedy on :class:`R2D2`'s numpy copies (always its current weights), one
    recurrent state row per env (``rnn``, zeros at an episode's start), for exploring and
    greedy acting alike. Exploring draws what DQN draws from ``rng`` (None: the agent's own
    generator), with ``epsilon()`` read at each act, and returns the state each step started
    from as the extra ``rnn_state``."""

    def __init__(
        self,
        algorithm: R2D2,
        epsilon: Callable[[], float],
        own_rng: Callable[[], np.random.Generator],
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
    ) -> None:
        super().__init__(epsilon, own_rng, load=load)
        self.algorithm = algorithm

    def initial_state(self, rows: int) -> State:
        return {"rnn": np.zeros((rows, self.algorithm.width), np.float32)}

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        before = np.asarray(state["rnn"], np.float32)
        q, after = self.algorithm.q_step(obs, before)
        actions: np.ndarray = q.argmax(-1)
        new_state = {"rnn": np.asarray(after, np.float32)}
        if not explore:
            return actions, {}, new_state
        rng = self.generator(rng)
        actions = explore_rows(actions, self.algorithm.n_actions, self.epsilon(), rng)
        return actions, {"rnn_state": before}, new_state


def make_policy(parts: ActingParts) -> R2D2Policy:
    """Epsilon-greedy on ``parts.algorithm``'s numpy copies, epsilon read from ``parts``'
    step count at each act (DQN's schedule, :func:`~harness_algos.dqn.epsilon_at`), exploring
    with ``parts.rng`` (an agent, or a farm actor's :class:`~harness.policy.Acting`)."""
    return R2D2Policy(
        parts.algorithm, lambda: epsilon_at(parts), lambda: parts.rng, load=parts.set_weights
    )


def make_agent(
    info: EnvInfo, backend: Backend, config: R2D2Config, *, seed: int = 0, total_steps: int = 1
) -> R2D2Agent:
    return R2D2Agent(R2D2(backend, info, config), info, config, seed=seed, total_steps=total_steps)
