"""Evolution strategies (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning"): a deterministic MLP policy whose flat parameter vector ``theta`` is
improved with a search gradient estimated from whole-episode returns of perturbed copies
``theta +- sigma * eps``. No backpropagation: the policy runs in numpy from ``theta`` on every
backend. Discrete (argmax) and box (tanh squashed into the bounds) actions.

Shared noise table. Every process (learner and actors) builds the same float32 table of
``noise_size`` standard normals from ``noise_seed`` (Box-Muller on the raw PCG64 bit stream,
whose sequence numpy keeps stable across versions; built once per process and cached). A
perturbation is an offset into the table and a sign: ``eps = table[index : index + dim]``.
Only offsets, signs and returns travel from actors to the learner, never perturbed parameters;
only ``theta`` (with its generation and the observation statistics) is broadcast back.

Acting (:class:`ESPolicy`). Each env slot evaluates one perturbation for a whole episode: its
state row (kept by whoever steps the envs) holds ``es_index``, ``es_sign``, ``es_generation``
(the generation of ``theta`` when the episode began) and ``es_step`` (steps into the
episode). A new episode in a slot (``reset`` after an episode ended, or the first ``act`` of
a fresh row) takes the next perturbation of the process's own :class:`Antithetic` stream
(``ES.stream``: the learner's, or a farm actor's, whose algorithm is built without an agent):
antithetic pairs, ``(index, +1)`` and then, in the next slot that needs one, ``(index, -1)``,
with offsets drawn from the acting generator (each farm actor has its own). Every exploratory
``act`` returns the rows' state as extras, which come back to the learner with the rollouts.
Greedy acting (evaluation) uses ``theta`` itself and no state.

Learning. ``observe`` sums each env's rewards from the step where ``es_step`` is 0. An episode
counts when it ended, the learner saw all of it, and it began under the current generation;
anything else (an episode that straddled an update, began under an older ``theta``, or was cut
by a lost rollout or a resume) is dropped and counted. Once ``population // 2`` antithetic pairs
are complete, ``learn`` shapes all the complete pairs' returns into centred ranks in
[-0.5, 0.5] (ties share their mean rank), forms the antithetic estimate
``g = sum_i (F+_i - F-_i) eps_i / (2 m sigma)`` over the m pairs, adds L2 weight decay and
takes an Adam (or momentum SGD) ascent step; the generation then advances and every pending
result (unpaired halves included) is discarded.

Over an actor farm (``on_policy = True``) each actor receives the newest ``theta`` before every
rollout of ``n_steps``. Episodes outlive rollouts: the env keeps stepping and the slot keeps its
perturbation. When ``set_weights`` brings a new generation mid-episode, the actor keeps acting
with the new ``theta`` plus the slot's old perturbation (the env cannot be reset from here) but
the episode's ``es_generation`` stays at the generation it began with, so the learner drops it;
the actor's half-used antithetic pair is forgotten too (``ES.set_policy_weights`` clears
``Antithetic.partners`` when the generation changes, as ``ES.learn`` does). New
episodes start under the new generation. This costs the unfinished part of the in-flight
episodes at each update, about ``num_envs`` half-episodes against ``population`` whole ones:
keep ``population`` a few times ``num_envs``.

Observation normalisation (``obs_norm``) follows the paper: the learner keeps running sums of
every observed observation, and the mean/std used by the policy change only at updates (they
are broadcast with ``theta``, so a generation's episodes all see the same normalisation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np

from harness.api import Agent, Algorithm, Backend, EnvInfo, Transition
from harness.policy import ActingParts, State
from harness_algos.bound_policy import BoundPolicy

_TABLES: dict[tuple[int, int], np.ndarray] = {}


def noise_table(seed: int, size: int) -> np.ndarray:
    """The shared read-only table of ``size`` float32 standard normals for ``seed``, built once
    per process. Box-Muller on PCG64's raw output (not ``Generator.standard_normal``, whose
    algorithm numpy may change between versions), so learner and actors on different machines
    agree."""
    key = (int(seed), int(size))
    table = _TABLES.get(key)
    if table is None:
        table = np.empty(size, np.float32)
        bits = np.random.PCG64(seed)
        chunk = 1 << 20  # bounds the float64 temporaries
        for start in range(0, size, 2 * chunk):
            count = min(2 * chunk, size - start)
            half = (count + 1) // 2
            u = (bits.random_raw(2 * half) >> np.uint64(11)).astype(np.float64) * 2.0**-53
            radius = np.sqrt(-2.0 * np.log1p(-u[:half]))  # 1 - u is in (0, 1]
            angle = 2.0 * np.pi * u[half:]
            both = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])
            table[start : start + count] = both[:count]
        table.flags.writeable = False
        _TABLES[key] = table
    return table


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` scaled to [-0.5, 0.5] (mean 0); equal values share their mean rank, so a
    population that all scored the same carries no gradient."""
    x = np.asarray(x, np.float64).ravel()
    n = len(x)
    if n < 2:
        return np.zeros(n, np.float32)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], n]
    mean_rank = (starts + ends - 1) / 2.0  # of each run of equal values
    ranks = np.empty(n)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return (ranks / (n - 1) - 0.5).astype(np.float32)


def es_gradient(
    eps: np.ndarray,
    returns_plus: np.ndarray,
    returns_minus: np.ndarray,
    sigma: float,
    *,
    rank_shaping: bool = True,
) -> np.ndarray:
    """The antithetic search-gradient estimate ``sum_i (F+_i - F-_i) eps_i / (2 m sigma)`` of
    ``m`` pairs (``eps`` is ``(m, dim)``), with the returns optionally rank-shaped together."""
    m = len(eps)
    f = np.concatenate([returns_plus, returns_minus]).astype(np.float64)
    if rank_shaping:
        f = centered_ranks(f).astype(np.float64)
    diff = f[:m] - f[m:]
    return (diff @ eps.astype(np.float64) / (2 * m * sigma)).astype(np.float32)


@dataclass
class ESConfig:
    """Evolution-strategies hyper-parameters ([algo] section)."""

    population: int = 32
    """Episodes per generation (an even number: population / 2 antithetic pairs). Keep it a
    few times num_envs: each update drops the episodes still running."""
    sigma: float = 0.05
    """Standard deviation of the parameter perturbations."""
    learning_rate: float = 0.01
    """Optimiser step size."""
    optimizer: str = "adam"
    """'adam', or 'sgd' (with momentum)."""
    momentum: float = 0.9
    """Momentum of the 'sgd' optimiser."""
    l2_coeff: float = 0.005
    """L2 weight decay added to the search gradient."""
    rank_shaping: bool = True
    """Fitness shaping: centred ranks in [-0.5, 0.5] instead of raw returns."""
    hidden: list[int] = field(default_factory=lambda: [32, 32])
    """Hidden widths of the policy MLP ([] for a linear policy)."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu or elu."""
    out_std: float = 0.01
    """Initial scale of each output unit's weights (normalised-column init; hidden layers 1)."""
    obs_norm: bool = True
    """Normalise observations by running mean/std (updated at each generation)."""
    obs_clip: float = 5.0
    """Clip normalised observations to +-obs_clip."""
    n_steps: int = 128
    """Vector steps per rollout (per env); episodes continue across rollouts."""
    noise_size: int = 1 << 24
    """Floats in the shared noise table (float32: 4 bytes each, in every process)."""
    noise_seed: int = 123
    """Seed of the shared noise table (the same in every process of a run)."""

    def __post_init__(self) -> None:
        if self.population < 2 or self.population % 2:
            raise ValueError(f"population must be an even number >= 2, got {self.population}")
        if self.sigma <= 0 or self.learning_rate <= 0:
            raise ValueError("sigma and learning_rate must be > 0")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}")
        if self.n_steps < 1:
            raise ValueError("n_steps must be >= 1")


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": _elu,
}


class ESBatch(NamedTuple):
    """One generation's complete antithetic pairs."""

    indices: np.ndarray
    """(m,) noise-table offsets."""
    returns: np.ndarray
    """(m, 2) returns of the + and - member."""
    lengths: np.ndarray
    """(m, 2) episode lengths."""


class ES(Algorithm):
    """``theta``, its optimiser and generation, the observation statistics and the update;
    and this process's perturbation stream (:attr:`stream`). ``seed`` draws the initial
    ``theta`` only: a farm actor's (``make_algorithm``, seed 0) acts with the broadcast one."""

    def __init__(self, backend: Backend, info: EnvInfo, config: ESConfig, seed: int = 0) -> None:
        super().__init__(backend)
        self.config = config
        self.discrete = info.action.kind == "discrete"
        obs_dim = info.observation.flat_dim
        act_dim = info.action.n if self.discrete else info.action.flat_dim
        sizes = [obs_dim, *config.hidden, act_dim]
        self.layers: list[tuple[int, int, int]] = []  # (offset, fan_in, fan_out)
        offset = 0
        for fan_in, fan_out in pairwise(sizes):
            self.layers.append((offset, fan_in, fan_out))
            offset += fan_in * fan_out + fan_out
        self.dim = offset
        if config.noise_size < self.dim:
            raise ValueError(
                f"algo.noise_size = {config.noise_size} is smaller than the policy's "
                f"{self.dim} parameters; raise it"
            )
        self.noise = noise_table(config.noise_seed, config.noise_size)
        self.act_fn = _ACTIVATIONS[config.activation]
        self.theta = self._init_theta(np.random.default_rng(seed))
        self.generation = 0
        self.moment1: np.ndarray = np.zeros(self.dim, np.float32)
        self.moment2: np.ndarray = np.zeros(self.dim, np.float32)
        self.steps = 0  # optimiser steps (Adam's bias correction)
        self.obs_mean = np.zeros(obs_dim, np.float32)
        self.obs_std = np.ones(obs_dim, np.float32)
        self.obs_sum = np.zeros(obs_dim)
        self.obs_sumsq = np.zeros(obs_dim)
        self.obs_count = np.zeros(())
        self.stream = Antithetic(config.noise_size - self.dim + 1)
        """The perturbations this process hands out (acting: :class:`ESPolicy` draws from
        it). A pair whose + member ran under an older ``theta`` is never completed: a new
        generation (:meth:`learn`, or :meth:`set_policy_weights` bringing one) clears its
        partners."""

    def _init_theta(self, rng: np.random.Generator) -> np.ndarray:
        """Normalised-column init (each unit's incoming weights have norm ``std``), zero biases."""
        theta = np.zeros(self.dim, np.float32)
        last = len(self.layers) - 1
        for k, (offset, fan_in, fan_out) in enumerate(self.layers):
            w = rng.standard_normal((fan_in, fan_out))
            std = self.config.out_std if k == last else 1.0
            w *= std / np.sqrt(np.square(w).sum(axis=0, keepdims=True))
            theta[offset : offset + fan_in * fan_out] = w.ravel()
        return theta

    # -- acting ------------------------------------------------------------------------------
    def perturbed(self, indices: np.ndarray, signs: np.ndarray) -> np.ndarray:
        """``(n, dim)`` parameters ``theta + sign * sigma * table[index : index + dim]``."""
        eps = self.noise[indices[:, None] + np.arange(self.dim)]
        scale = (self.config.sigma * signs).astype(np.float32)[:, None]
        out: np.ndarray = self.theta + scale * eps
        return out

    def outputs(self, obs: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
        """Network outputs for ``obs``: under ``theta`` (``params`` None) or one parameter row
        per observation (``(n, dim)``, perturbed copies)."""
        n = len(obs)
        x = np.asarray(obs, np.float32).reshape(n, -1)
        if self.config.obs_norm:
            x = np.clip(
                (x - self.obs_mean) / self.obs_std, -self.config.obs_clip, self.config.obs_clip
            )
        last = len(self.layers) - 1
        for k, (offset, fan_in, fan_out) in enumerate(self.layers):
            end = offset + fan_in * fan_out
            w: np.ndarray
            if params is None:
                w = self.theta[offset:end].reshape(fan_in, fan_out)
                x = x @ w + self.theta[end : end + fan_out]
            else:
                w = params[:, offset:end].reshape(n, fan_in, fan_out)
                x = np.matmul(x[:, None, :], w)[:, 0] + params[:, end : end + fan_out]
            if k < last:
                x = self.act_fn(x)
        return x

    # -- learning ----------------------------------------------------------------------------
    def observe_obs(self, obs: np.ndarray) -> None:
        """Add observations to the running statistics (applied at the next update)."""
        x = np.asarray(obs, np.float64).reshape(len(obs), -1)
        self.obs_sum += x.sum(axis=0)
        self.obs_sumsq += np.square(x).sum(axis=0)
        self.obs_count += len(x)

    def learn(self, batch: ESBatch) -> dict[str, float]:
        """One generation: the search gradient of ``batch``'s pairs, an optimiser step."""
        c = self.config
        eps = self.noise[batch.indices[:, None] + np.arange(self.dim)]
        grad = es_gradient(
            eps, batch.returns[:, 0], batch.returns[:, 1], c.sigma, rank_shaping=c.rank_shaping
        )
        grad = grad - c.l2_coeff * self.theta
        step = self._step(grad)
        self.theta = (self.theta + step).astype(np.float32)
        self.generation += 1
        self.stream.partners.clear()
        if c.obs_norm and self.obs_count > 1:
            mean = self.obs_sum / self.obs_count
            var = np.maximum(self.obs_sumsq / self.obs_count - np.square(mean), 0.0)
            self.obs_mean = mean.astype(np.float32)
            self.obs_std = np.sqrt(np.maximum(var, 1e-4)).astype(np.float32)
        returns = batch.returns
        theta_norm = float(np.linalg.norm(self.theta))
        return {
            "es/mean_return": float(returns.mean()),
            "es/max_return": float(returns.max()),
            "es/min_return": float(returns.min()),
            "es/mean_length": float(batch.lengths.mean()),
            "es/pairs": float(len(returns)),
            "es/grad_norm": float(np.linalg.norm(grad)),
            "es/theta_norm": theta_norm,
            "es/update_ratio": float(np.linalg.norm(step)) / max(theta_norm, 1e-12),
        }

    def _step(self, grad: np.ndarray) -> np.ndarray:
        """The ascent step for ``grad`` (Adam, or SGD with momentum as in the paper's code)."""
        c = self.config
        self.steps += 1
        if c.optimizer == "sgd":
            self.moment1 = c.momentum * self.moment1 + (1.0 - c.momentum) * grad
            out: np.ndarray = c.learning_rate * self.moment1
            return out
        b1, b2 = 0.9, 0.999
        self.moment1 = b1 * self.moment1 + (1.0 - b1) * grad
        self.moment2 = b2 * self.moment2 + (1.0 - b2) * np.square(grad)
        lr = c.learning_rate * np.sqrt(1.0 - b2**self.steps) / (1.0 - b1**self.steps)
        out = lr * self.moment1 / (np.sqrt(self.moment2) + 1e-8)
        return out

    # -- state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "theta": self.theta.copy(),
            "generation": self.generation,
            "moment1": self.moment1.copy(),
            "moment2": self.moment2.copy(),
            "steps": self.steps,
            "obs_mean": self.obs_mean.copy(),
            "obs_std": self.obs_std.copy(),
            "obs_sum": self.obs_sum.copy(),
            "obs_sumsq": self.obs_sumsq.copy(),
            "obs_count": float(self.obs_count),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = np.array(state["theta"], np.float32)
        self.generation = int(state["generation"])
        self.moment1 = np.array(state["moment1"], np.float32)
        self.moment2 = np.array(state["moment2"], np.float32)
        self.steps = int(state["steps"])
        self.obs_mean = np.array(state["obs_mean"], np.float32)
        self.obs_std = np.array(state["obs_std"], np.float32)
        self.obs_sum = np.array(state["obs_sum"], np.float64)
        self.obs_sumsq = np.array(state["obs_sumsq"], np.float64)
        self.obs_count = np.array(state["obs_count"], np.float64)

    def policy_weights(self) -> dict[str, np.ndarray]:
        return {
            "theta": self.theta.copy(),
            "generation": np.array(self.generation, np.int64),
            "obs_mean": self.obs_mean.copy(),
            "obs_std": self.obs_std.copy(),
        }

    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Episodes in flight keep their ``es_generation`` (the learner drops them); a pair
        whose + member ran under the old ``theta`` is not completed (:attr:`stream`)."""
        generation = self.generation
        self.theta = np.array(weights["theta"], np.float32)
        self.generation = int(weights["generation"])
        self.obs_mean = np.array(weights["obs_mean"], np.float32)
        self.obs_std = np.array(weights["obs_std"], np.float32)
        if self.generation != generation:
            self.stream.partners.clear()


class Antithetic:
    """An acting process's stream of perturbations: offsets into the noise table below
    ``high``, each handed out as ``(offset, +1)`` and then ``(offset, -1)``."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.partners: list[int] = []
        """Offsets whose - member is still to be handed out (cleared at a new generation)."""

    def next(self, rng: np.random.Generator) -> tuple[int, int]:
        """The next ``(offset, sign)``: a waiting - member, else a new offset from ``rng``."""
        if self.partners:
            return self.partners.pop(0), -1
        offset = int(rng.integers(self.high))
        self.partners.append(offset)
        return offset, 1


class ESPolicy(BoundPolicy):
    """Exploring, each row (env slot) acts with its episode's perturbation ``theta +- sigma *
    eps``, drawn from the algorithm's :class:`Antithetic` stream when the row's episode starts
    (``reset``, or the first ``act`` of a fresh row) with ``own_rng()`` (where ``act`` is
    given no generator: the agent's, or a farm actor's), and
    returns its state row as extras (``es_index``, ``es_sign``, ``es_generation``,
    ``es_step``); greedy, it acts with ``theta``. Always :class:`ES`'s current ``theta``: the
    perturbed parameters are cached per ``theta`` and perturbations."""

    def __init__(
        self,
        algorithm: ES,
        info: EnvInfo,
        own_rng: Callable[[], np.random.Generator],
        *,
        load: Callable[[Mapping[str, np.ndarray]], None],
    ) -> None:
        self.algorithm = algorithm
        self.stream = algorithm.stream
        self.own_rng = own_rng
        """The generator when ``act`` is given none (``ActingParts.rng``, read at each
        call)."""
        super().__init__(load)
        self.discrete = info.action.kind == "discrete"
        if not self.discrete:
            low = np.asarray(info.action.low, np.float64).reshape(info.action.shape)
            high = np.asarray(info.action.high, np.float64).reshape(info.action.shape)
            self.bounded = np.isfinite(low) & np.isfinite(high)
            self.low = np.where(self.bounded, low, 0.0).astype(np.float32)
            self.high = np.where(self.bounded, high, 0.0).astype(np.float32)
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        """(theta, es_index, es_sign, their perturbed parameters) of the last act."""

    def initial_state(self, rows: int) -> State:
        """Rows without a perturbation yet (``es_index`` -1: drawn at their first act)."""
        return {
            "es_index": np.full(rows, -1, np.int64),
            "es_sign": np.ones(rows, np.int64),
            "es_generation": np.zeros(rows, np.int64),
            "es_step": np.zeros(rows, np.int64),
        }

    def _draw(self, state: State, slots: np.ndarray, rng: np.random.Generator) -> State:
        """``state`` with the next perturbations of the stream in rows ``slots``, in order."""
        out = {key: np.array(value, np.int64) for key, value in state.items()}
        for i in slots:
            out["es_index"][i], out["es_sign"][i] = self.stream.next(rng)
            out["es_generation"][i] = self.algorithm.generation
            out["es_step"][i] = 0
        return out

    def reset(self, state: State, mask: np.ndarray, *, explore: bool) -> State:
        if not explore:  # (greedy acting reads no state)
            return state
        return self._draw(state, np.flatnonzero(mask), self.own_rng())

    def _perturbed(self, index: np.ndarray, sign: np.ndarray) -> np.ndarray:
        theta, cache = self.algorithm.theta, self._cache
        if (
            cache is None
            or cache[0] is not theta
            or not np.array_equal(cache[1], index)
            or not np.array_equal(cache[2], sign)
        ):
            cache = self._cache = (theta, index, sign, self.algorithm.perturbed(index, sign))
        return cache[3]

    def _to_env(self, out: np.ndarray) -> np.ndarray:
        if self.discrete:
            return np.asarray(out.argmax(-1), np.int64)
        squashed = self.low + (np.tanh(out) + 1.0) * 0.5 * (self.high - self.low)
        return np.where(self.bounded, squashed, out).astype(np.float32)

    def act(
        self,
        obs: Any,
        state: State,
        rng: np.random.Generator | None = None,
        *,
        explore: bool,
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if not explore:
            return self._to_env(self.algorithm.outputs(obs)), {}, state
        fresh = np.flatnonzero(np.asarray(state["es_index"]) < 0)
        if len(fresh):
            state = self._draw(state, fresh, self.own_rng() if rng is None else rng)
        params = self._perturbed(state["es_index"], state["es_sign"])
        actions = self._to_env(self.algorithm.outputs(obs, params))
        extras = {key: np.array(value, np.int64) for key, value in state.items()}
        after = dict(state)
        after["es_step"] = extras["es_step"] + 1
        return actions, extras, after


class ESAgent(Agent):
    """Per-episode results (learning); acts through :class:`ESPolicy`."""

    algorithm: ES
    config: ESConfig

    def __init__(
        self, algorithm: ES, info: EnvInfo, config: ESConfig, *, seed: int, total_steps: int
    ) -> None:
        super().__init__(algorithm, info, config, seed=seed, total_steps=total_steps)
        self.name = "es"
        self.on_policy = True
        self.rollout_len = config.n_steps
        n = info.num_envs
        # learning: per-env sums since the episode's first step, results of this generation
        self.ep_return = np.zeros(n)
        self.ep_length = np.zeros(n, np.int64)
        self.results: dict[int, np.ndarray] = {}  # offset -> [R+, R-, L+, L-] (nan: not yet)
        self.dropped = 0
        self.dropped_total = 0
        self.last_metrics: dict[str, float] = {"es/generation": 0.0}
        self.generation_began = 0  # env_steps at the last update

    @property
    def stream(self) -> Antithetic:
        """This agent's perturbations (its algorithm's :attr:`ES.stream`)."""
        return self.algorithm.stream

    def policy(self) -> ESPolicy:
        """:func:`make_policy` of this agent."""
        return make_policy(self)

    # -- learning ----------------------------------------------------------------------------
    def observe(self, transition: Transition) -> None:
        t = transition
        x = t.extras
        first = x["es_step"] == 0
        self.ep_return[first] = 0.0
        self.ep_length[first] = 0
        self.ep_return += t.rewards
        self.ep_length += 1
        if self.config.obs_norm:
            self.algorithm.observe_obs(t.obs)
        self.env_steps += len(t.obs)
        done = np.flatnonzero(t.terminated | t.truncated)
        generation = self.algorithm.generation
        for i in done:
            whole = self.ep_length[i] == x["es_step"][i] + 1  # its first step was observed
            if not whole or x["es_generation"][i] != generation:
                self.dropped += 1
                continue
            row = self.results.setdefault(int(x["es_index"][i]), np.full(4, np.nan))
            member = 0 if x["es_sign"][i] > 0 else 1
            row[member] = self.ep_return[i]
            row[2 + member] = self.ep_length[i]

    def learn(self) -> dict[str, float]:
        complete = [(k, r) for k, r in self.results.items() if not np.isnan(r).any()]
        if len(complete) < self.config.population // 2:
            # no update: the latest generation's numbers again (the runner logs only some
            # iterations, and most ES iterations end without an update)
            pending = {"es/pending_pairs": float(len(complete))}
            return {**self.last_metrics, **pending}
        complete.sort()  # (in offset order: the update does not depend on arrival order)
        rows = np.stack([r for _, r in complete])
        batch = ESBatch(
            np.array([k for k, _ in complete], np.int64), rows[:, :2], rows[:, 2:].astype(np.int64)
        )
        metrics = self.algorithm.learn(batch)
        self.updates += 1
        unpaired = len(self.results) - len(complete)
        self.results.clear()  # (and the update cleared the stream's partners)
        self.dropped_total += self.dropped
        metrics.update(
            {
                "es/generation": float(self.algorithm.generation),
                "es/dropped": float(self.dropped),
                "es/dropped_total": float(self.dropped_total),
                "es/unpaired": float(unpaired),
                # env steps of this generation that went into the update (the rest: dropped,
                # unpaired or unfinished episodes)
                "es/used_fraction": float(batch.lengths.sum())
                / max(self.env_steps - self.generation_began, 1),
            }
        )
        self.dropped = 0
        self.generation_began = self.env_steps
        self.last_metrics = metrics
        return {**metrics, "es/pending_pairs": 0.0}

    # -- state -------------------------------------------------------------------------------
    def data_state(self) -> dict[str, np.ndarray]:
        # no acting state: a resumed run's envs start fresh episodes, which draw their
        # perturbations anew (the waiting - members first)
        keys = sorted(self.results)
        return {
            "partners": np.array(self.stream.partners, np.int64),
            "result_index": np.array(keys, np.int64),
            "result": np.array([self.results[k] for k in keys]).reshape(len(keys), 4),
        }

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Also reads checkpoints that hold the slots' perturbations agents once kept
        (``index``, ``sign``, ``born``: ignored, the resumed run's episodes start afresh)."""
        self.stream.partners[:] = [int(k) for k in state["partners"]]
        self.results = {
            int(k): np.array(r, np.float64)
            for k, r in zip(state["result_index"], state["result"], strict=True)
        }
        self.ep_return[:] = 0.0
        self.ep_length[:] = 0

    def extra_state(self) -> dict[str, Any]:
        return {
            **super().extra_state(),
            "dropped": self.dropped,
            "dropped_total": self.dropped_total,
            "generation_began": self.generation_began,
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        super().load_extra_state(state)
        self.dropped = int(state.get("dropped", 0))
        self.dropped_total = int(state.get("dropped_total", 0))
        self.generation_began = int(state.get("generation_began", self.env_steps))


def make_policy(parts: ActingParts) -> ESPolicy:
    """The :class:`ESPolicy` on ``parts.algorithm`` (its ``theta`` and perturbation stream),
    drawing perturbations with ``parts.rng`` (an agent, or a farm actor's
    :class:`~harness.policy.Acting`: ``ES(backend, info, config)`` is the algorithm alone,
    and loading a new generation clears its stream's partners there as in the agent)."""
    return ESPolicy(parts.algorithm, parts.env_info, lambda: parts.rng, load=parts.set_weights)


def make_agent(
    info: EnvInfo, backend: Backend, config: ESConfig, *, seed: int = 0, total_steps: int = 1
) -> ESAgent:
    return ESAgent(
        ES(backend, info, config, seed), info, config, seed=seed, total_steps=total_steps
    )
