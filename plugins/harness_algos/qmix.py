"""QMIX (Rashid et al. 2018, "QMIX: Monotonic Value Function Factorisation for Deep
Multi-Agent Reinforcement Learning") for cooperative multi-agent envs with discrete actions.

* **Agent network**, shared by every agent (PyMARL's ``RNNAgent``): a ReLU layer, a GRU
  (``recurrent``: a ``Backend.recurrent`` layer, trained over whole sequences by the
  framework's fused op, stepped one time step at a time in numpy for acting; a second ReLU
  layer without it) and a linear Q head. Its input is the agent's observation zero-padded to
  the widest agent's (agents may differ, as in simple_adversary), a one-hot agent id
  (parameter sharing with agent identity) and, with ``last_action``, the one-hot of the
  agent's previous action.
* **Mixing network**: the agents' chosen Q-values combined into Q_tot by a two-layer network
  whose weights come from hypernetworks of the global state and pass through ``abs()``
  (non-negative, so Q_tot is monotonic in every agent's Q and the greedy joint action is the
  agents' own greedy actions); ``mixer = "vdn"`` sums the agents' Q-values instead. Q_tot
  is the mixer's output plus a constant offset, the running mean team reward / (1 - gamma)
  (``value_offset``; see ``QMIXConfig.mixer`` for why the monotonic mixer needs it). The state
  is the concatenation of every agent's own (unpadded) observation: PettingZoo's MPE
  ``state()`` is that concatenation too, and it travels with
  the observations, so the agent needs nothing from the env beyond ``Transition``.
* **Team reward**: the sum of the agents' rewards (:func:`harness.api.team_reward`, what the
  runner reports as ``charts/episodic_return``). In mpe2's simple_spread each agent's reward
  is ``local_ratio`` * its own collision penalty + (1 - ``local_ratio``) * the shared
  coverage term, so the sum is N times the shared term plus every collision penalty.
* **Episode replay**: each env's steps are assembled into sequences of at most ``seq_len``
  steps (an episode, or a piece of a longer one), zero-padded with a mask, together with the
  observation after the last step (the true final observation where the episode ended:
  truncated episodes and cut pieces bootstrap from it, terminated ones do not). A recurrent
  agent's ``sample`` returns the hidden state it acted from (``extras["rnn_state"]``, so it
  reaches the learner from farm actors too), and each sequence keeps the one of its first
  step: training unrolls the agent network from that stored state (R2D2's "stored state",
  Kapturowski et al. 2019; zeros where an episode starts), one fused call over the batch.
  The stored state comes from the weights that acted, which may have moved since (R2D2's
  "representational drift"; no burn-in here); without it a piece that continues an episode
  would start from zeros, a state the agent never acted from.
* **Targets**: TD(lambda) returns over each sequence (``td_lambda``; 0: one-step TD) with
  double Q (the online network picks the next actions, the target
  network scores them), a target network copied every ``target_update_interval`` updates
  (hard) or Polyak-averaged with ``tau`` < 1 after every update.
* **Acting** (:class:`~harness_algos.qmix_policy.QMIXPolicy`, made by its ``make_policy``
  from an agent or, in a farm actor, from :func:`make_algorithm`'s networks alone, no agent):
  epsilon-greedy with epsilon
  annealed linearly over ``epsilon_anneal_steps`` env steps, on numpy copies of the agent
  network (``backend.inference``); a recurrent agent's hidden state and the last actions
  are state rows per env, kept by whoever steps the envs and reset where an episode ends.

A recurrent agent (or one fed its last action) acts on its history, so its greedy acting
steps the same state rows per evaluation env (harness.runtime.run.evaluate resets them at
every episode start). Without either option it is a function of the observations alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Obs, Transition, team_reward
from harness.errors import CheckpointError, IncompatibleError
from harness_algos.episode_replay import EpisodeReplay
from harness_algos.moments import merge_stats
from harness_algos.qmix_policy import QMIXPolicy, agent_inputs, epsilon_at, make_policy


@dataclass
class QMIXConfig:
    """QMIX hyper-parameters ([algo] section). Defaults follow PyMARL's QMIX where they
    apply (Adam instead of RMSprop: the only optimiser every backend offers)."""

    learning_rate: float = 5e-4
    """Adam step size."""
    batch_size: int = 32
    """Sequences (episodes or pieces of them) per update."""
    buffer_size: int = 5000
    """Sequences kept in the episode replay (the oldest are overwritten)."""
    seq_len: int = 32
    """Longest stored sequence; longer episodes are stored in pieces of this length."""
    learning_starts: int = 32
    """Sequences stored before the first update."""
    train_every: int = 8
    """Vector steps between two learn() calls (the iteration length, ``rollout_len``)."""
    updates_per_train: int = 1
    """Gradient steps per learn() call."""
    gamma: float = 0.99
    """Discount factor."""
    td_lambda: float = 0.6
    """TD(lambda) targets over each stored sequence (:func:`lambda_returns`; 0: one-step TD).
    A one-step target moves the value of a step only as far as the target network's value of
    the next one, so a value needs about one target refresh per step of its horizon to form;
    lambda returns carry the sequence's rewards back at once (Hu et al. 2021, "Rethinking the
    Implementation Tricks and Monotonicity Constraint in Cooperative MARL", use 0.6)."""
    double_q: bool = True
    """Double Q-learning: the online network picks the next actions, the target scores them."""
    target_update_interval: int = 200
    """Updates between two hard target-network copies (used when tau = 1)."""
    tau: float = 1.0
    """1: hard copies every target_update_interval updates; < 1: Polyak averaging after
    every update."""
    epsilon_start: float = 1.0
    """Exploration rate at the start."""
    epsilon_end: float = 0.05
    """Exploration rate after the anneal."""
    epsilon_anneal_steps: int = 50_000
    """Env steps (vector steps x envs) over which epsilon falls linearly."""
    hidden: int = 64
    """Width of the agent network (its ReLU layer and GRU state)."""
    recurrent: bool = False
    """A GRU cell in the agent network (PyMARL's RNN agent); off: a second ReLU layer. A
    recurrent agent's greedy policy is stateful too (see the module doc)."""
    last_action: bool = False
    """Feed each agent its previous action (one-hot), as PyMARL does by default; makes the
    greedy policy stateful like recurrent."""
    mixer: str = "qmix"
    """``qmix``: the monotonic hypernetwork mixer; ``vdn``: Q_tot = the sum of the agents'
    Q-values (Sunehag et al. 2018, value decomposition networks), QMIX without the state's
    say in the mixing. On simple_spread (every reward negative, returns about -60) ``qmix``
    with ``hypernet_gain`` 1 and no ``value_offset`` diverged (Q_tot positive, greedy returns
    -92..-189, worse than random): the mixer's gain dQ_tot/dQ_a per agent, ~5 at init, grew
    to ~33 as it fitted the large negative returns through its multiplicative paths, and the
    gain amplified the max over the agents' Q-values in the targets (the greedy actions'
    Q-values exceed the replayed ones by noise that the mixer scales up, and gamma 0.95
    compounds the excess over ~20 steps). With a small ``hypernet_gain`` it learns like VDN
    (competitions/mpe_spread/qmix.toml has the measurements)."""
    mixing_embed: int = 32
    """Width of the mixing network's hidden layer."""
    hypernet_hidden: int = 64
    """Hidden width of the hypernetworks producing the mixing weights; 0: single linear
    layers."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    value_offset: bool = True
    """Q_tot = the mixer's output + a constant offset: the running mean team reward (of the
    replayed steps) / (1 - gamma), a state-independent baseline, so the mixer only learns
    Q_tot's variation around it. Adam moves a bias by about ``learning_rate`` per update,
    far too slowly to reach returns of -60 in a few thousand updates: without the offset the
    mixer fits them through its multiplicative paths (elu units saturated at -1 times a
    growing ``|w2|``), which raises its gain dQ_tot/dQ_a (see ``mixer``), or lags behind the
    returns (simple_spread, 24k steps: Q_tot about -40 where the offset's runs track the
    policy's value, about -46). A pure reparameterisation (the targets bootstrap through the
    same offset), whatever the task; VDN's sum takes it too."""
    hypernet_gain: float = 0.1
    """Init gain of the hypernetworks' output layers (orthogonal): small mixing weights and
    biases at the start, so the mixer starts with a small gain dQ_tot/dQ_a. At 1.0 the gain
    was about 6 per agent at init and grew to 15-30 on simple_spread, amplifying the noise in
    the agents' greedy Q-values in the bootstrapped targets until Q_tot diverged."""
    huber: bool = False
    """Huber (smooth L1) TD loss instead of the squared error: bounded gradients for the
    large TD errors of early training."""

    def __post_init__(self) -> None:
        positive = {
            "batch_size": self.batch_size,
            "buffer_size": self.buffer_size,
            "seq_len": self.seq_len,
            "train_every": self.train_every,
            "updates_per_train": self.updates_per_train,
            "target_update_interval": self.target_update_interval,
            "hidden": self.hidden,
            "mixing_embed": self.mixing_embed,
        }
        bad = [f"{k} = {v}" for k, v in positive.items() if v < 1]
        if bad:
            raise ValueError(f"{', '.join(bad)}: must be >= 1")
        if self.buffer_size < self.batch_size:
            raise ValueError(f"buffer_size ({self.buffer_size}) < batch_size ({self.batch_size})")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau = {self.tau} must be in (0, 1]")
        if not 0.0 <= self.td_lambda <= 1.0:
            raise ValueError(f"td_lambda = {self.td_lambda} must be in [0, 1]")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma = {self.gamma} must be in [0, 1]")
        if not 0.0 <= self.epsilon_end <= 1.0 or not 0.0 <= self.epsilon_start <= 1.0:
            raise ValueError("epsilon_start and epsilon_end must be in [0, 1]")
        if self.mixer not in ("qmix", "vdn"):
            raise ValueError(f"mixer = {self.mixer!r}: expected 'qmix' or 'vdn'")
        if self.hypernet_hidden < 0 or self.learning_starts < 0 or self.epsilon_anneal_steps < 0:
            raise ValueError("hypernet_hidden, learning_starts and epsilon_anneal_steps >= 0")


class Layout:
    """How agent-keyed observations become network inputs (shared by QMIX and MAPPO): every
    agent's observation flattened and zero-padded to the widest one, its one-hot id, and the
    global state as the concatenation of the unpadded observations."""

    def __init__(self, info: EnvInfo, algo: str, kinds: tuple[str, ...]) -> None:
        if not info.multi_agent:
            raise IncompatibleError(f"{algo} is multi-agent; {info.env_id!r} is single-agent.")
        self.agents = tuple(info.agents)
        self.num_agents = len(self.agents)
        self.dims = [info.observations[a].flat_dim for a in self.agents]
        self.obs_dim = max(self.dims)
        self.state_dim = sum(self.dims)
        actions = [info.actions[a] for a in self.agents]
        first = actions[0]
        same = all((a.kind, a.shape, a.n) == (first.kind, first.shape, first.n) for a in actions)
        if not same or first.kind not in kinds:
            found = ", ".join(
                f"{a}: {s.kind} {s.n or s.shape}" for a, s in zip(self.agents, actions, strict=True)
            )
            raise IncompatibleError(
                f"{algo} shares one network between the agents, so every agent needs the same "
                f"{'/'.join(kinds)} action space; {info.env_id!r} has "
                f"{found}."
            )
        self.action = first
        self.ids = np.eye(self.num_agents, dtype=np.float32)

    def stack(self, obs: Obs) -> np.ndarray:
        """Agent-keyed ``(n, *shape)`` observations as one ``(n, A, obs_dim)`` array."""
        n = len(obs[self.agents[0]])
        out = np.zeros((n, self.num_agents, self.obs_dim), np.float32)
        for j, (agent, dim) in enumerate(zip(self.agents, self.dims, strict=True)):
            out[:, j, :dim] = np.asarray(obs[agent], np.float32).reshape(n, dim)
        # subnormal floats (MPE's decaying velocities reach them) make every CPU matmul that
        # touches them take a slow microcode path: a MAPPO update ran ~10x slower
        out[np.abs(out) < np.finfo(np.float32).tiny] = 0.0
        return out

    def state(self, stacked: np.ndarray) -> np.ndarray:
        """The global state ``(..., state_dim)`` of stacked observations ``(..., A, obs_dim)``."""
        parts = [stacked[..., j, :dim] for j, dim in enumerate(self.dims)]
        return np.concatenate(parts, axis=-1)

    def with_ids(self, x: np.ndarray) -> np.ndarray:
        """``(..., A, d)`` features with the one-hot agent ids appended: ``(..., A, d + A)``."""
        ids = np.broadcast_to(self.ids, (*x.shape[:-2], self.num_agents, self.num_agents))
        return np.concatenate([x, ids], axis=-1)


class QMIX(Algorithm):
    """The agent network, the mixer, their targets and the TD update on sequence batches."""

    def __init__(self, backend: Backend, layout: Layout, config: QMIXConfig) -> None:
        super().__init__(backend)
        self.config = config
        self.layout = layout
        self.n_actions = layout.action.n
        self.in_dim = layout.obs_dim + layout.num_agents
        if config.last_action:
            self.in_dim += self.n_actions
        self.online = self._build()
        self.target = self._build()
        backend.copy_weights(self.target, self.online)
        self.optimizer = backend.optimizer(self.online, lr=config.learning_rate)
        self.updates = 0
        self.reward_stats = np.array([0.0, 1.0, 0.0])  # running mean, variance, count
        self.refresh_policy()

    def _build(self) -> Any:
        bk, c, lay = self.backend, self.config, self.layout
        h, e, s, a = c.hidden, c.mixing_embed, lay.state_dim, lay.num_agents
        memory = (
            bk.recurrent("gru", h, h)
            if c.recurrent
            else bk.mlp(h, [], h, activation="relu", activate_output=True)
        )
        agent = bk.group(
            fc=bk.mlp(self.in_dim, [], h, activation="relu", activate_output=True),
            memory=memory,
            head=bk.mlp(h, [], self.n_actions),
        )
        hyper = [c.hypernet_hidden] if c.hypernet_hidden else []
        mixer = bk.group(
            w1=bk.mlp(s, hyper, a * e, activation="relu", out_gain=c.hypernet_gain),
            b1=bk.mlp(s, [], e, out_gain=c.hypernet_gain),
            w2=bk.mlp(s, hyper, e, activation="relu", out_gain=c.hypernet_gain),
            v=bk.mlp(s, [e], 1, activation="relu", out_gain=c.hypernet_gain),
        )
        return bk.group(agent=agent, mixer=mixer)

    # --- acting (numpy) ---------------------------------------------------------------------
    def refresh_policy(self) -> None:
        """Numpy copies of the agent network for acting (after every weight change)."""
        bk, agent = self.backend, self.online["agent"]
        self._fc = bk.inference(agent["fc"])
        self._memory = bk.inference(agent["memory"])
        self._head = bk.inference(agent["head"])

    def q_values(self, inputs: np.ndarray, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Q-values ``(rows, n_actions)`` and next hidden states of ``(rows, in_dim)`` inputs."""
        x = self._fc(inputs)
        memory: Any = self._memory  # a recurrent layer's copy steps (x, h) -> (out, h)
        h = memory(x, hidden)[1] if self.config.recurrent else memory(x)
        return self._head(h), h

    # --- learning ---------------------------------------------------------------------------
    def _unroll(self, net: Any, inputs: Any, steps: int, rows: int, initial: Any) -> Any:
        """Q-values ``(steps, rows, n_actions)`` of time-major inputs ``(steps * rows, in)``,
        a recurrent agent's GRU starting from ``initial`` ``(rows, hidden)``. The GRU runs as
        one fused call: no episode starts inside a stored sequence (it ends with its
        episode), so no ``starts``. Against the step-by-step cell it replaced (same weights,
        losses equal to 6e-5 over 100 updates), one update of the recurrent test's size (64
        sequences x 3 agents x 26 steps, one thread) took 47 instead of 63 ms, but whole runs
        only 0-25% less learning time: on a CPU torch's GRU is itself a loop of small matmuls
        (tools/bench_rnn.py); on a GPU it is cuDNN's, in paddle its fused kernel."""
        c = self.config
        x = net["fc"](inputs)
        if c.recurrent:
            x, _ = net["memory"](x.reshape([steps, rows, c.hidden]), initial)
            x = x.reshape([steps * rows, c.hidden])
        else:
            x = net["memory"](x)
        return net["head"](x).reshape([steps, rows, self.n_actions])

    def _mix(self, net: Any, q: Any, state: Any) -> Any:
        """Q_tot ``(N,)`` of agent Q-values ``(N, A)`` in states ``(N, state_dim)``: hidden =
        elu(q . |W1(s)| + b1(s)), Q_tot = hidden . |w2(s)| + V(s) (the sum of q with the VDN
        mixer)."""
        bk, e, a = self.backend, self.config.mixing_embed, self.layout.num_agents
        if self.config.mixer == "vdn":
            return bk.sum(q, axis=1)
        n = q.shape[0]
        w1 = abs(net["w1"](state)).reshape([n, a, e])
        hidden = bk.sum(q.reshape([n, a, 1]) * w1, axis=1) + net["b1"](state)
        # elu(x) = max(x, 0) + exp(min(x, 0)) - 1, in ops every backend has
        hidden = bk.maximum(hidden, hidden * 0.0) + bk.exp(bk.clip(hidden, -60.0, 0.0)) - 1.0
        w2 = abs(net["w2"](state))
        return bk.sum(hidden * w2, axis=1) + net["v"](state)[:, 0]

    def _offset(self, batch: Mapping[str, np.ndarray]) -> float:
        """The constant added to the mixer's output (``value_offset``), after merging the
        batch's rewards into the running statistics."""
        c = self.config
        if not c.value_offset:
            return 0.0
        self.reward_stats = merge_stats(self.reward_stats, batch["rewards"][batch["mask"] > 0])
        horizon = 1.0 / (1.0 - c.gamma) if c.gamma < 1.0 else float(c.seq_len)
        return float(self.reward_stats[0] * horizon)

    def learn(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One TD(lambda) step on a batch of sequences (see :meth:`QMIXAgent.batch`)."""
        bk, c = self.backend, self.config
        steps, b, a = batch["actions"].shape  # (L, B, A) time-major
        rows = b * a
        inputs = bk.tensor(batch["inputs"].reshape((steps + 1) * rows, self.in_dim))
        state = bk.tensor(batch["state"])  # (L + 1, B, S)
        mask = bk.tensor(batch["mask"].reshape(-1))
        actions = bk.tensor(batch["actions"].reshape(steps * b, a), "int64")
        initial = bk.tensor(batch["initial_state"].reshape(rows, -1)) if c.recurrent else None
        q = self._unroll(self.online["agent"], inputs, steps + 1, rows, initial)
        chosen = bk.gather(q[:steps].reshape([steps * b, a, self.n_actions]), actions)
        q_tot = self._mix(self.online["mixer"], chosen, state[:steps].reshape([steps * b, -1]))
        with bk.no_grad():
            q_next = self._unroll(self.target["agent"], inputs, steps + 1, rows, initial)[1:]
            q_next = q_next.reshape([steps * b, a, self.n_actions])
            if c.double_q:
                online_next = q[1:].reshape([steps * b, a, self.n_actions])
                best = bk.argmax(online_next, axis=-1)
                next_values = bk.gather(q_next, best)
            else:
                next_values = bk.max(q_next, axis=-1)
            next_state = state[1:].reshape([steps * b, -1])
            next_tot = self._mix(self.target["mixer"], next_values, next_state)
            next_tot = bk.numpy(next_tot).reshape(steps, b)
            offset = self._offset(batch)
            returns = lambda_returns(
                batch["rewards"],
                batch["terminated"],
                batch["mask"],
                next_tot + offset,
                c.gamma,
                c.td_lambda,
            )
            y = bk.tensor((returns - offset).reshape(-1).astype(np.float32))
        td = (bk.smooth_l1(q_tot, y) if c.huber else bk.mse(q_tot, y)) * mask
        loss = bk.sum(td) / max(float(batch["mask"].sum()), 1.0)
        grad_norm = bk.update(self.optimizer, loss, max_grad_norm=c.max_grad_norm)
        self.updates += 1
        if c.tau < 1.0:
            bk.copy_weights(self.target, self.online, c.tau)
        elif self.updates % c.target_update_interval == 0:
            bk.copy_weights(self.target, self.online)
        self.refresh_policy()
        valid = batch["mask"].reshape(-1) > 0
        q_tot_np = bk.numpy(q_tot) + offset
        return {
            "losses/td_loss": bk.item(loss),
            "losses/q_tot": float(q_tot_np[valid].mean()) if valid.any() else 0.0,
            "losses/grad_norm": grad_norm,
        }

    # --- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        bk = self.backend
        return {
            "online": bk.state(self.online),
            "target": bk.state(self.target),
            "optimizer": bk.state(self.optimizer),
            "updates": self.updates,
            "reward_stats": self.reward_stats.copy(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        bk = self.backend
        self._check_memory(state["online"])
        bk.load_state(self.online, state["online"])
        bk.load_state(self.target, state["target"])
        bk.load_state(self.optimizer, state["optimizer"])
        self.updates = int(state["updates"])
        self.reward_stats = np.array(state.get("reward_stats", [0.0, 1.0, 0.0]), np.float64)
        self.refresh_policy()

    def _check_memory(self, saved: Any) -> None:
        """Refuse a checkpoint whose agent network has another memory layer than this config
        builds, naming both (the backend's own error lists parameter names)."""
        if not isinstance(saved, Mapping):
            return
        have = _memory_kind(saved)
        want = _memory_kind(self.backend.get_weights(self.online))
        if have == want:
            return
        hint = (
            "retrain, or evaluate it with a harness from before the fused GRU (issue 28)"
            if have == _OLD_CELL
            else f"set algo.recurrent = {str(have != _FEED_FORWARD).lower()} to load it"
        )
        raise CheckpointError(
            f"this QMIX checkpoint's agent network has {have}, but algo.recurrent = "
            f"{str(self.config.recurrent).lower()} builds {want}; {hint}."
        )

    def policy_weights(self) -> dict[str, np.ndarray]:
        return self.backend.get_weights(self.online["agent"])

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.backend.set_weights(self.online["agent"], weights)
        self.refresh_policy()


class QMIXAgent(Agent):
    """Per-env sequence assembly, episode replay, epsilon-greedy acting around :class:`QMIX`."""

    name = "qmix"
    algorithm: QMIX
    config: QMIXConfig

    def __init__(
        self, algorithm: QMIX, info: EnvInfo, config: QMIXConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.rollout_len = config.train_every
        self.layout = lay = algorithm.layout
        n, a, length = info.num_envs, lay.num_agents, config.seq_len
        self.n_actions = algorithm.n_actions
        width = config.hidden if config.recurrent else 0
        self.replay = EpisodeReplay(config.buffer_size, length, a, lay.obs_dim, width)
        # the sequence each env is writing
        self.cur: dict[str, np.ndarray] = {
            "obs": np.zeros((n, length + 1, a, lay.obs_dim), np.float32),
            "actions": np.zeros((n, length, a), np.int64),
            "rewards": np.zeros((n, length), np.float32),
            "terminated": np.zeros((n, length), np.float32),
            "prev_actions": np.full((n, a), -1, np.int64),
            "initial_state": np.zeros((n, a, width), np.float32),
        }
        self.cur_len = np.zeros(n, np.int64)

    # --- acting -----------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """The acting schedule (:func:`~harness_algos.qmix_policy.epsilon_at`)."""
        return epsilon_at(self)

    def policy(self) -> QMIXPolicy:
        """:func:`~harness_algos.qmix_policy.make_policy` of this agent."""
        return make_policy(self)

    # --- experience -------------------------------------------------------------------------
    def observe(self, transition: Transition) -> None:
        t, lay, cur = transition, self.layout, self.cur
        n = len(t.terminated)
        rows = np.arange(n)
        pos = self.cur_len
        cur["obs"][rows, pos] = lay.stack(t.obs)
        actions = np.stack([np.asarray(t.actions[a]) for a in lay.agents], axis=1)
        cur["actions"][rows, pos] = actions
        cur["rewards"][rows, pos] = team_reward(t.rewards)
        cur["terminated"][rows, pos] = np.asarray(t.terminated, np.float32)
        starts = pos == 0
        if self.config.recurrent and starts.any():
            acted = t.extras.get("rnn_state")  # absent: a transition its policy did not act
            first = cur["initial_state"]
            first[starts] = 0.0 if acted is None else np.asarray(acted, np.float32)[starts]
        self.cur_len = pos + 1
        done = np.asarray(t.terminated) | np.asarray(t.truncated)
        full = self.cur_len == self.config.seq_len
        if (done | full).any():
            next_obs = lay.stack(t.next_obs)
            for i in np.flatnonzero(done | full):
                self._flush(int(i), next_obs[i], actions[i], bool(done[i]))
        self.env_steps += n

    def _flush(self, i: int, final_obs: np.ndarray, last: np.ndarray, done: bool) -> None:
        """Store env ``i``'s sequence (``final_obs``: the observation after its last step)
        and start the next one (continuing the episode unless ``done``)."""
        cur, length = self.cur, int(self.cur_len[i])
        cur["obs"][i, length] = final_obs
        mask = np.zeros(self.config.seq_len, np.float32)
        mask[:length] = 1.0
        self.replay.add(
            obs=cur["obs"][i],
            actions=cur["actions"][i],
            rewards=cur["rewards"][i],
            terminated=cur["terminated"][i],
            mask=mask,
            prev_actions=cur["prev_actions"][i],
            initial_state=cur["initial_state"][i],
        )
        for name in ("obs", "actions", "rewards", "terminated", "initial_state"):
            cur[name][i] = 0
        cur["prev_actions"][i] = -1 if done else last
        self.cur_len[i] = 0

    def batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Time-major training arrays of the replay's sequences ``indices``: network inputs
        ``(L + 1, B, A, in_dim)``, states ``(L + 1, B, S)``, actions ``(L, B, A)``, rewards,
        terminated flags and masks ``(L, B)``, and the agents' hidden states before the first
        step ``(B, A, hidden)`` (width 0 for a feed-forward agent)."""
        r = self.replay
        obs = r.obs[indices].swapaxes(0, 1)  # (L + 1, B, A, D)
        actions = r.actions[indices].swapaxes(0, 1)  # (L, B, A)
        last = np.concatenate([r.prev_actions[indices][None], actions], axis=0)
        # a padded step's "last action" is 0, but padded steps are masked out of the loss
        return {
            "inputs": agent_inputs(self.algorithm, obs, last),
            "state": self.layout.state(obs),
            "actions": actions,
            "rewards": r.rewards[indices].T,
            "terminated": r.terminated[indices].T,
            "mask": r.mask[indices].T,
            "initial_state": r.initial_state[indices],
        }

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.replay.size < max(c.learning_starts, c.batch_size):
            return {}
        totals: dict[str, float] = {}
        for _ in range(c.updates_per_train):
            indices = self.rng.integers(0, self.replay.size, c.batch_size)
            for key, value in self.algorithm.learn(self.batch(indices)).items():
                totals[key] = totals.get(key, 0.0) + value / c.updates_per_train
            self.updates += 1
        totals["charts/epsilon"] = self.epsilon
        return totals

    # --- resume -----------------------------------------------------------------------------
    def data_state(self) -> dict[str, np.ndarray]:
        state = self.replay.state()
        state.update({f"current/{k}": v for k, v in self.cur.items()})
        state["current/length"] = self.cur_len
        return state  # (no acting state: a resumed run's envs start fresh episodes)

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Also reads checkpoints that hold the acting state agents once kept
        (``acting/hidden``, ``acting/last_actions``: ignored)."""
        self.replay.load_state(state)
        for key in self.cur:
            if f"current/{key}" in state or key not in EpisodeReplay.ADDED:
                self.cur[key] = np.array(state[f"current/{key}"])
            else:
                self.cur[key][:] = 0
        self.cur_len = np.array(state["current/length"])


def lambda_returns(
    rewards: np.ndarray,
    terminated: np.ndarray,
    mask: np.ndarray,
    next_values: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """TD(lambda) targets ``(L, B)`` of time-major sequences: ``G_t = r_t + gamma * (1 -
    terminated_t) * ((1 - lam) * next_values_t + lam * G_{t+1})``, where ``next_values_t`` is
    the target network's value of the state after step t. The last valid step of a sequence
    (followed by padding or the sequence's end) bootstraps from ``next_values`` alone, so a
    piece cut from a longer episode, or a truncated one, continues through its value; lam =
    0 is one-step TD."""
    steps = len(rewards)
    out = np.zeros(rewards.shape, np.float32)
    for t in reversed(range(steps)):
        ahead = next_values[t]
        if t + 1 < steps:
            ahead = np.where(
                mask[t + 1] > 0, (1.0 - lam) * next_values[t] + lam * out[t + 1], ahead
            )
        out[t] = rewards[t] + gamma * (1.0 - terminated[t]) * ahead
    return out


_FEED_FORWARD = "a feed-forward memory layer (algo.recurrent = false)"
_OLD_CELL = "the step-by-step GRU cell of QMIX before the fused GRU"


def _memory_kind(weights: Mapping[str, Any]) -> str:
    """What the agent network's memory layer is, from its parameter names: the recurrent
    layer's weights are named ``weight_ih*`` (torch's ``nn.GRU``, paddle's ``GRU``), the old
    cell's were two linear layers ``ih`` and ``hh``."""
    names = [k for k in weights if isinstance(k, str) and k.startswith("agent.memory.")]
    if any("weight_ih" in k for k in names):
        return "a GRU (algo.recurrent = true)"
    if any(k.startswith("agent.memory.ih.") for k in names):
        return _OLD_CELL
    return _FEED_FORWARD


def make_algorithm(backend: Backend, info: EnvInfo, config: QMIXConfig) -> QMIX:
    """QMIX's networks for ``info``'s agents (what a farm actor acts with, no agent)."""
    return QMIX(backend, Layout(info, "QMIX", ("discrete",)), config)


def make_agent(
    info: EnvInfo, backend: Backend, config: QMIXConfig, *, seed: int = 0, total_steps: int = 1
) -> QMIXAgent:
    return QMIXAgent(
        make_algorithm(backend, info, config), info, config, seed=seed, total_steps=total_steps
    )
