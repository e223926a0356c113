"""PARL's three layers as small typed interfaces, plus the backend interface they run on.

* **Model** - the network. Built through a :class:`Backend` (``backend.mlp(...)``), so the same
  algorithm file serves every framework.
* **Algorithm** - the loss and the update: tensors in, metrics out.
* **Agent** - the data flow outside the algorithm (replay or rollout storage, when to update):
  ``observe`` / ``learn`` / ``save`` / ``restore``, and ``policy()``, the
  :class:`~harness.policy.Policy` that acts (numpy in, numpy out; per-env state as rows).

The :class:`Backend` protocol is the whole framework surface an algorithm may touch: tensor
creation, a handful of ops, distributions, optimisers, weight copies and state. Tensors support
Python arithmetic and indexing in every framework harness targets (torch, paddle); anything whose
spelling differs between frameworks (``gather``, ``clip``, reductions with an axis) is a backend
method. See docs/architecture.md for how a second backend plugs in.
"""

from __future__ import annotations

import abc
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np

from harness.errors import CheckpointError
from harness.numpy_nets import PolicyProgram
from harness.policy import HeldActing, Policy, held_acting, hooks_policy
from harness.policy import batch_size as batch_size  # (public here since before Policy)

Tensor = Any
"""A framework tensor (``torch.Tensor``, ``paddle.Tensor``). Algorithms never inspect its type."""


@dataclass(frozen=True)
class SpaceInfo:
    """A framework-neutral view of a gymnasium space (only what algorithms need)."""

    kind: Literal["discrete", "box"]
    """"discrete" (actions ``0 .. n-1``) or "box" (arrays within ``low`` .. ``high``)."""
    shape: tuple[int, ...]
    """Shape of one element (``()`` for a discrete space)."""
    dtype: str
    """numpy dtype name of one element, e.g. "float32", "int64", "uint8"."""
    n: int = 0
    """Number of choices of a discrete space; 0 for a box."""
    low: tuple[float, ...] = ()
    """A box's lower bounds, flattened (C order); empty for a discrete space."""
    high: tuple[float, ...] = ()
    """A box's upper bounds, flattened (C order); empty for a discrete space."""

    @property
    def flat_dim(self) -> int:
        """The number of values in one element: the product of :attr:`shape` (1 for a
        discrete space); the ``in_dim`` of an MLP that reads it."""
        return int(np.prod(self.shape)) if self.shape else 1


@dataclass(frozen=True)
class EnvInfo:
    """What an agent is told about its environment.

    A multi-agent env (PettingZoo through an env plugin) also names its ``agents`` (every agent
    that can appear, in a fixed order) and each one's spaces in ``observations`` / ``actions``;
    ``observation`` / ``action`` are then the first agent's. Its observations, actions and
    rewards travel as agent-keyed dicts of arrays (see :class:`Transition`)."""

    env_id: str
    """The env id the run was configured with (``[run] env``)."""
    observation: SpaceInfo
    """The space of one env's observation (the first agent's in a multi-agent env)."""
    action: SpaceInfo
    """The space of one env's action (the first agent's in a multi-agent env)."""
    num_envs: int
    """Envs in the vector env: the first axis of every batch the agent sees."""
    agents: tuple[str, ...] = ()
    """A multi-agent env's agent names in a fixed order; empty for a single-agent env."""
    observations: Mapping[str, SpaceInfo] = field(default_factory=dict)
    """Each agent's observation space (multi-agent envs only)."""
    actions: Mapping[str, SpaceInfo] = field(default_factory=dict)
    """Each agent's action space (multi-agent envs only)."""

    @property
    def multi_agent(self) -> bool:
        """True when the env names its :attr:`agents` (batches are agent-keyed dicts)."""
        return bool(self.agents)


class Transition(NamedTuple):
    """One vector step. ``next_obs`` holds the true final observation where an episode ended
    (not the reset observation), so truncated episodes can be bootstrapped.

    In a multi-agent env (:attr:`EnvInfo.multi_agent`) ``obs``, ``actions``, ``rewards`` and
    ``next_obs`` are dicts keyed by agent name (every agent of :attr:`EnvInfo.agents`, each an
    array with the envs on the first axis), while ``terminated`` / ``truncated`` are per env:
    an episode ends for all its agents at once (an agent that leaves early gets zero
    observations and rewards until then). ``extras`` stays a flat dict of arrays."""

    obs: np.ndarray
    """The observations the actions were chosen from, ``(num_envs, *obs_shape)``."""
    actions: np.ndarray
    """The actions taken, as :meth:`Agent.sample` returned them."""
    rewards: np.ndarray
    """Rewards, ``(num_envs,)``."""
    next_obs: np.ndarray
    """Observations after the step; where an episode ended, its true final observation."""
    terminated: np.ndarray
    """Booleans ``(num_envs,)``: the episode reached a terminal state (do not bootstrap)."""
    truncated: np.ndarray
    """Booleans ``(num_envs,)``: the episode was cut (time limit; bootstrap from
    ``next_obs``)."""
    extras: Mapping[str, np.ndarray]
    """The per-step extras :meth:`Agent.sample` returned with the actions (``log_prob``,
    ``value``, ...), each with the envs on the first axis."""


@runtime_checkable
class Distribution(Protocol):
    """An action distribution over a batch."""

    def sample(self) -> Tensor:
        """One action per batch row, drawn from the backend's seeded generator."""
        ...

    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-probability (log-density for a normal, summed over the action axis) of
        ``actions``, one value per batch row."""
        ...

    def entropy(self) -> Tensor:
        """Entropy per batch row (summed over the action axis for a normal)."""
        ...

    def mode(self) -> Tensor:
        """The most likely action per batch row (the argmax, or the mean): greedy acting."""
        ...


@runtime_checkable
class Model(Protocol):
    """A network: call it on a tensor batch. Its parameters live behind the backend."""

    def __call__(self, x: Tensor) -> Tensor: ...


class Backend(Protocol):
    """Everything framework-specific an algorithm needs. Implemented by backend plugins.

    A backend plugin registers a :class:`harness.registry.BackendSpec` whose ``load(config)``
    returns an object with these methods; nothing inherits from this class (it is a
    :class:`typing.Protocol`). ``harness.testing.check_backend`` checks an implementation
    against numpy references. Models, optimisers and parameters are opaque handles that only
    the backend that made them understands.
    """

    name: str
    """The backend's registered name (``torch``, ``paddle``); checkpoints record it."""
    device: str
    """Where tensors live, in the framework's spelling (``cpu``, ``cuda:0``)."""

    # --- models -----------------------------------------------------------------------------
    def mlp(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dim: int,
        *,
        activation: str = "tanh",
        out_gain: float = 1.0,
        activate_output: bool = False,
    ) -> Model:
        """A fully connected network with orthogonal init taking ``(B, *obs_shape)`` and
        flattening every axis after the batch axis (so ``in_dim`` is the flat size);
        ``out_gain`` scales the last layer; ``activate_output`` applies the activation after it
        too (a feature trunk)."""
        ...

    def parallel_mlp(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dims: Sequence[int],
        *,
        activation: str = "tanh",
        out_gains: Sequence[float] | None = None,
    ) -> Any:
        """``len(out_dims)`` independent MLPs of the same hidden widths on the same input,
        evaluated together (batched matrix products): calling it returns one output per member.
        Same function as separate :meth:`mlp` s (e.g. an actor and a critic), a fraction of the
        per-operation overhead that dominates small networks. Called with a list of
        ``len(out_dims)`` batches (same batch size) instead of one, member ``j`` takes batch
        ``j`` (an ensemble's critics scoring each head's own action). ``model(x, member=j)``
        evaluates member ``j`` alone (``[output_j]``), e.g. TD3's actor loss, which reads only
        the first critic: the other members' products are skipped, not computed and dropped."""
        ...

    def cnn(
        self,
        in_shape: Sequence[int],
        out_dim: int = 512,
        *,
        channels: Sequence[int] = (32, 64, 64),
        kernels: Sequence[int] = (8, 4, 3),
        strides: Sequence[int] = (4, 2, 1),
        scale: float = 1.0 / 255.0,
    ) -> Model:
        """A convolutional feature trunk on image batches ``(B, C, H, W)`` with ``in_shape =
        (C, H, W)``, of any dtype (uint8 frames go in as they are): the input is multiplied by
        ``scale`` inside, then unpadded ReLU convolutions (``channels``, ``kernels``,
        ``strides``), flattened, and a ReLU linear layer of ``out_dim`` features; orthogonal
        init with gain sqrt(2). The defaults are the Nature-DQN trunk (Mnih et al. 2015)."""
        ...

    def recurrent(self, kind: str, in_dim: int, hidden_dim: int) -> Any:
        """An LSTM (``kind = "lstm"``) or GRU (``"gru"``) layer run over whole sequences by
        the framework's fused op. Called on ``(x, state, starts)``: time-major inputs ``x``
        ``(T, B, in_dim)``, the state before the first step ``(B, S)`` (one array whatever the
        kind: :func:`harness.sequences.state_dim`, an LSTM's ``h`` then ``c``) and optional
        episode-start flags ``starts`` ``(T, B)`` (numpy or a tensor; true: the state is zeroed
        before step ``t``), it returns the outputs ``(T, B, hidden_dim)`` and the state after
        the last step ``(B, S)``; with the keyword ``final=False`` the second value is None
        (a learner that reads only the outputs skips the extra work the final state can
        take). Starts inside the sequences cost no per-step loop: the sequences are cut into
        segments run side by side (:func:`harness.sequences.plan_segments`).
        Its :meth:`inference` copy steps one time step in numpy, ``(x (B, in_dim), state (B, S))
        -> (output (B, hidden_dim), state (B, S))``, the same arithmetic (torch's gate order;
        ``harness.testing.check_backend`` holds the two equal). Orthogonal weights (gain 1),
        zero biases; its parameters optimise, save and copy like an :meth:`mlp`'s."""
        ...

    def inference(self, model: Any) -> Callable[[np.ndarray], Any]:
        """A numpy-in, numpy-out copy of ``model`` with its current weights, for acting
        (rollouts, evaluation, actor processes that need no framework). Outputs are shaped like
        the model's (a list for :meth:`parallel_mlp`; a :meth:`recurrent` layer's copy steps
        one time step, see there). Take a new copy after the weights change.
        """
        ...

    def group(self, **models: Model) -> Any:
        """Bundle sub-networks into one object whose parameters optimise/save together."""
        ...

    # --- tensors ----------------------------------------------------------------------------
    def tensor(self, x: np.ndarray | float, dtype: str = "float32") -> Tensor:
        """A tensor on :attr:`device` from numpy data; ``dtype`` is one of "float32",
        "int64", "bool", "uint8"."""
        ...

    def numpy(self, x: Tensor) -> np.ndarray:
        """A numpy copy of ``x``, detached from the graph (low-precision floats come back as
        float32)."""
        ...

    def no_grad(self) -> AbstractContextManager[Any]:
        """A context in which no operation records gradients (targets, acting)."""
        ...

    def frozen(self, *models: Any) -> AbstractContextManager[Any]:
        """Inside it, ``models``' parameters take no gradient (forward passes through them
        still pass gradients to their inputs): an actor's loss through a critic then costs no
        critic weight gradients."""
        ...

    def autocast(self) -> AbstractContextManager[Any]:
        """Mixed precision for the forward passes and losses inside it when the backend's
        ``amp`` option is on (a no-op otherwise); call :meth:`update` outside it."""
        ...

    def gather(self, x: Tensor, index: Tensor) -> Tensor:
        """``x[i, index[i]]`` along the last axis (Q(s, a) from Q(s, .)); any leading axes,
        ``x[i, j, index[i, j]]`` for QMIX's ``(batch, agents, actions)``."""
        ...

    def clip(self, x: Tensor, low: float, high: float) -> Tensor:
        """``x`` limited to ``[low, high]`` elementwise (gradient zero outside)."""
        ...

    def minimum(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise minimum of two tensors of the same shape."""
        ...

    def maximum(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise maximum of two tensors of the same shape."""
        ...

    def exp(self, x: Tensor) -> Tensor:
        """Elementwise exponential."""
        ...

    def log(self, x: Tensor) -> Tensor:
        """Elementwise natural logarithm."""
        ...

    def tanh(self, x: Tensor) -> Tensor:
        """Elementwise hyperbolic tangent."""
        ...

    def softplus(self, x: Tensor) -> Tensor:
        """``log(1 + exp(x))``, computed stably."""
        ...

    def concat(self, xs: Sequence[Tensor], axis: int = -1) -> Tensor:
        """Join tensors along ``axis`` (a critic's observation and action inputs)."""
        ...

    def mean(self, x: Tensor, axis: int | None = None) -> Tensor:
        """The mean over ``axis`` (dropped from the shape), or over everything (a scalar)."""
        ...

    def sum(self, x: Tensor, axis: int | None = None) -> Tensor:
        """The sum over ``axis`` (dropped from the shape), or over everything (a scalar)."""
        ...

    def max(self, x: Tensor, axis: int) -> Tensor:
        """The largest values along ``axis`` (dropped from the shape), e.g. max_a Q(s, a)."""
        ...

    def argmax(self, x: Tensor, axis: int) -> Tensor:
        """The int64 indices of the largest values along ``axis``."""
        ...

    def mse(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise squared error (reduce with ``mean``; lets PER weight each sample)."""
        ...

    def smooth_l1(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise Huber loss with delta 1."""
        ...

    def item(self, x: Tensor) -> float:
        """A one-element tensor as a Python float (for metrics)."""
        ...

    # --- distributions ----------------------------------------------------------------------
    def categorical(self, logits: Tensor) -> Distribution:
        """A categorical distribution per row of ``logits`` ``(B, n)``; its samples and modes
        are int64 indices ``(B,)``."""
        ...

    def normal(self, mean: Tensor, log_std: Tensor) -> Distribution:
        """A diagonal Gaussian; ``log_std`` broadcasts against ``mean``. Its ``sample()`` is
        reparameterised (``mean + std * noise``): gradients flow through it (SAC)."""
        ...

    def parameter(self, value: np.ndarray) -> Any:
        """A free trainable tensor (e.g. a state-independent log-std)."""
        ...

    def assign(self, parameter: Any, value: np.ndarray) -> None:
        """Overwrite a :meth:`parameter` in place from numpy (no gradient)."""
        ...

    # --- training ---------------------------------------------------------------------------
    def optimizer(self, *models: Any, lr: float, eps: float = 1e-8) -> Any:
        """Adam over every parameter of ``models`` (Models, groups or parameters)."""
        ...

    def update(self, optimizer: Any, loss: Tensor, *, max_grad_norm: float | None = None) -> float:
        """Backward, optional global-norm clipping, step; returns the pre-clip grad norm."""
        ...

    def set_lr(self, optimizer: Any, lr: float) -> None:
        """Set the learning rate of every parameter group of ``optimizer`` (annealing)."""
        ...

    def copy_weights(self, target: Any, source: Any, tau: float = 1.0) -> None:
        """``target <- tau * source + (1 - tau) * target`` (tau=1: hard copy)."""
        ...

    def device_stats(self) -> dict[str, float]:
        """Metrics of the accelerator the learner runs on (``gpu/...``), logged with the
        run's metrics; empty on CPU."""
        ...

    # --- state ------------------------------------------------------------------------------
    def get_weights(self, model: Any) -> dict[str, np.ndarray]:
        """Numpy copies of every parameter/buffer, for broadcast to actors."""
        ...

    def set_weights(self, model: Any, weights: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`get_weights` returned into ``model`` (same architecture).
        :meth:`inference` copies taken before do not change: take new ones."""
        ...

    def state(self, obj: Any) -> Any:
        """A model's or optimiser's full state (backend-native, for checkpoints)."""
        ...

    def load_state(self, obj: Any, state: Any) -> None:
        """Restore what :meth:`state` returned into the same model or optimiser."""
        ...

    def save(self, payload: Mapping[str, Any], path: Path) -> None:
        """Write a dict of backend states, numpy arrays and plain values to one file
        (``agent.<name>`` in a checkpoint) as data that cannot carry code: through
        :func:`harness.safestate.save_state` with a codec for the framework's tensors, never a
        pickle. (A backend that can read its pickles of earlier versions adds
        ``load_legacy(path) -> dict`` for ``harness checkpoint convert --trust``.)"""
        ...

    def load(self, path: Path) -> dict[str, Any]:
        """Read what :meth:`save` wrote, with tensors on :attr:`device`, without unpickling
        (:func:`harness.safestate.load_state`); a malformed or legacy file raises
        :class:`harness.errors.CheckpointError`."""
        ...

    def seed(self, seed: int) -> None:
        """Seed the framework's generator (initialisation, dropout, distribution samples)."""
        ...

    def rng_state(self) -> Any:
        """The framework generator's state, checkpointed so a resumed run draws the same
        samples as an uninterrupted one."""
        ...

    def set_rng_state(self, state: Any) -> None:
        """Restore what :meth:`rng_state` returned."""
        ...


class Algorithm(abc.ABC):
    """Loss and update. Holds the model(s) and optimiser(s); knows nothing about envs."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @abc.abstractmethod
    def learn(self, batch: Any) -> dict[str, float]:
        """One update from ``batch``; returns namespaced metrics (``losses/...``)."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """Backend-native state of every model and optimiser, for checkpoints: the backend's
        :meth:`Backend.state` values, numpy arrays and plain data (dicts, lists, tuples,
        numbers, strings); anything else is refused when a checkpoint is written, naming its
        key (a checkpoint holds no pickle, :mod:`harness.safestate`)."""

    @abc.abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned (resume, ``harness eval``). Refresh any
        :meth:`Backend.inference` copy the algorithm acts with afterwards."""

    @abc.abstractmethod
    def policy_weights(self) -> dict[str, np.ndarray]:
        """The weights actors need to act, as numpy (broadcast by version)."""

    @abc.abstractmethod
    def set_policy_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`policy_weights` returned (in a farm actor, each new version).
        Refresh any :meth:`Backend.inference` copy the algorithm acts with afterwards."""


class Agent(abc.ABC):
    """Numpy in, numpy out; the data flow around an :class:`Algorithm`.

    ``rollout_len`` is the number of vector steps between two ``learn`` calls: one iteration
    (for an :attr:`offline` agent, the number of gradient updates one ``learn`` takes).
    The base class keeps what every agent checkpoints: the env-step and gradient-step counters
    and the numpy generator used for exploration and minibatch shuffling.
    """

    name: str = "agent"
    """The algorithm's registered name (log messages, checkpoint checks)."""
    rollout_len: int = 1
    """Vector steps between two :meth:`learn` calls (see above)."""
    on_policy: bool = False
    """True when ``learn`` needs experience from the current policy only (PPO): remote
    actors then wait for the newest weights before every rollout."""
    offline: bool = False
    """True when the agent learns from a fixed dataset instead of from the envs (offline RL):
    the runner then steps no env for training (evaluations still run episodes), one run step is
    one gradient update (``rollout_len`` of them per ``learn``), ``observe`` is never called,
    and :meth:`load_data` runs once at start-up, so a missing or mismatched dataset fails
    before any training."""
    independent_transitions: bool = False
    """True when ``observe`` takes each row of a transition on its own (one-step replay, no
    per-env sequences): it then accepts batches of any number of rows from any envs, and an
    actor farm streams rollouts to it as they arrive instead of waiting for every actor,
    each as one transition of ``steps x envs`` rows in time order."""

    def __init__(
        self,
        algorithm: Algorithm,
        env_info: EnvInfo,
        config: Any,
        *,
        seed: int = 0,
        total_steps: int = 1,
    ) -> None:
        self.algorithm = algorithm
        """The :class:`Algorithm` this agent feeds."""
        self.backend = algorithm.backend
        """The algorithm's :class:`Backend`."""
        self.env_info = env_info
        """The :class:`EnvInfo` the agent was made for."""
        self.config = config
        """The algorithm's config dataclass instance (the ``[algo]`` section)."""
        self.rng = np.random.default_rng(seed)
        """numpy generator for exploration and minibatch shuffling; checkpointed by
        :meth:`extra_state`, so draw numpy randomness from it, never from a global RNG."""
        self.total_steps = max(1, total_steps)
        """``[run] total_steps`` (at least 1), the horizon of schedules."""
        self.env_steps = 0
        """Env steps (rows) observed so far; the agent's :meth:`observe` counts them (a farm
        actor's copy is set from the learner's)."""
        self.updates = 0
        """Gradient steps taken so far."""

    def sample(self, obs: Any) -> tuple[Any, dict[str, np.ndarray]]:
        """Exploratory actions for a batch of observations, plus per-step extras
        (``log_prob``, ``value``) that ``observe`` will receive back. Deprecated as a hook
        (kept one release, :class:`~harness.policy.AgentPolicy`): implement :meth:`policy`.
        The default acts through :meth:`policy` for one fixed set of envs (callers that drive
        an agent directly)."""
        return _held(self).act(obs, explore=True)

    def predict(self, obs: Any) -> Any:
        """Greedy actions for evaluation; deprecated as a hook like :meth:`sample`."""
        return _held(self).act(obs, explore=False)[0]

    @abc.abstractmethod
    def observe(self, transition: Transition) -> None:
        """Take one vector step of experience (into replay or the rollout buffer)."""

    @abc.abstractmethod
    def learn(self) -> dict[str, float]:
        """Update if enough data is there; namespaced metrics (empty when nothing happened)."""

    # -- the acting hooks of agents without a policy of their own (deprecated, one release:
    # harness.policy.AgentPolicy and the policy server's by-row path still call them) --------
    @property
    def per_env_acting_state(self) -> bool:
        """True when :meth:`sample` depends on state kept per env between calls (reset in
        :meth:`episodes_ended`): a policy server (``run.inference = 'central'``) then
        refuses the agent unless :attr:`acts_by_rows`. A :class:`~harness.policy.Policy`
        keeps such state as rows instead, and is served by rows without these flags."""
        return False

    @property
    def acts_by_rows(self) -> bool:
        """True when the policy server may call :meth:`sample_rows` / :meth:`rows_ended`
        for any rows of a fixed set of envs (their state carried to a replaced server's
        agent through :meth:`data_state` / :meth:`load_data_state`)."""
        return False

    def sample_rows(
        self, obs: np.ndarray, rows: slice | np.ndarray, num_rows: int
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`sample` for rows ``rows`` (a slice or sorted indices) of ``num_rows`` envs,
        using and advancing only those rows' state (only called when :attr:`acts_by_rows`)."""
        if self.per_env_acting_state:
            raise NotImplementedError(
                f"{self.name} keeps per-env acting state: override sample_rows"
            )
        return self.sample(obs)

    def rows_ended(self, rows: np.ndarray, num_rows: int) -> None:  # noqa: B027 - optional
        """:meth:`episodes_ended` by row: rows ``rows`` of ``num_rows`` envs start over."""

    def episodes_ended(self, mask: np.ndarray) -> None:
        """Called by whoever steps the envs after a vector step in which the episodes of the
        envs in boolean ``mask`` ended, before the next ``sample`` (deprecated hook, as
        :meth:`sample`: a :class:`~harness.policy.Policy` resets its state rows itself)."""
        held = held_acting(self)
        if held is not None:
            held.ended(mask, explore=True)

    def predict_episodes_ended(self, mask: np.ndarray) -> None:
        """The same for :meth:`predict` (deprecated hook, as :meth:`sample`)."""
        held = held_acting(self)
        if held is not None:
            held.ended(mask, explore=False)

    def policy(self) -> Policy:
        """What acts for this agent (:class:`harness.policy.Policy`): the serial and farm
        steppers, the policy server, evaluation and export act through it and nothing else.
        Override it to return the algorithm's policy. The default, for agents written before
        ``Policy`` (deprecated, one release, with a ``DeprecationWarning``): an
        :class:`~harness.policy.AgentPolicy` over the acting hooks above."""
        return hooks_policy(self)

    def policy_program(self) -> PolicyProgram | None:
        """Optional (what :meth:`harness.policy.Policy.program` gives): the greedy policy as
        data (a :class:`harness.numpy_nets.PolicyProgram`: observation standardisation, the
        layers of the numpy copies acting uses with their current weights, the output
        transform) for ``harness export``'s framework-free ONNX graph; a recurrent policy
        starts from its initial state. None (the default): not exportable; an agent that
        can be but not as configured raises :class:`harness.errors.IncompatibleError`."""
        return None

    def load_data(self) -> None:  # noqa: B027 - optional
        """Offline agents (:attr:`offline`): read and check the dataset the config names. The
        runner calls it before training; an agent built only to act (``harness eval``, ``harness
        collect``) never does, so evaluating a checkpoint needs no dataset."""

    def data_state(self) -> dict[str, np.ndarray]:
        """Numpy state that must survive a resume (replay, rollout position, RNG)."""
        return {}

    def load_data_state(self, state: Mapping[str, np.ndarray]) -> None:  # noqa: B027 - optional
        """Restore what :meth:`data_state` returned."""

    def extra_state(self) -> dict[str, Any]:
        """Small counters (schedules, update counts); extend with ``super()``. Plain data
        only (what :mod:`harness.safestate` stores: dicts, lists, tuples, numbers, strings,
        numpy arrays): a checkpoint holds no pickle."""
        return {
            "env_steps": self.env_steps,
            "updates": self.updates,
            "rng": self.rng.bit_generator.state,
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned."""
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]

    # Saving is the same for every agent: models/optimisers through the backend, bulk numpy
    # data as .npz (no pickle), counters alongside. Callers make it atomic (harness.checkpoint).
    def save(self, directory: Path) -> None:
        """Write the agent into ``directory``: ``agent.<backend>`` (the algorithm's
        :meth:`Algorithm.state`, :meth:`extra_state` and the backend's RNG state) and, when
        :meth:`data_state` is not empty, ``data.npz``. Provided; extend the state methods
        rather than overriding this."""
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "algorithm": self.algorithm.state(),
            "extra": self.extra_state(),
            "rng": self.backend.rng_state(),
        }
        self.backend.save(payload, directory / f"agent.{self.backend.name}")
        data = self.data_state()
        objects = [k for k, v in data.items() if np.asarray(v).dtype.hasobject]
        if objects:  # np.savez would pickle them, and restore() never unpickles
            raise CheckpointError(
                f"data_state() of {type(self).__name__} returned arrays of Python objects "
                f"({', '.join(objects)}), which a checkpoint cannot hold: return numeric or "
                f"string arrays."
            )
        if data:
            np.savez(directory / "data.npz", **data)  # type: ignore[arg-type]

    def restore(self, directory: Path, *, with_data: bool = True) -> None:
        """Load what :meth:`save` wrote (``with_data=False`` skips ``data.npz``: evaluation
        needs no replay). Provided; it calls :meth:`Algorithm.load_state`, which must refresh
        the acting copies."""
        payload = self.backend.load(directory / f"agent.{self.backend.name}")
        self.__dict__.pop("_held_acting", None)  # (sample/predict callers: new episodes)
        self.algorithm.load_state(payload["algorithm"])
        self.load_extra_state(payload.get("extra", {}))
        self.backend.set_rng_state(payload["rng"])
        data_file = directory / "data.npz"
        if with_data and data_file.exists():
            self.load_data_state(_read_npz(data_file))

    def weights(self) -> dict[str, np.ndarray]:
        """The policy weights sent to actors: :meth:`Algorithm.policy_weights`; an agent whose
        acting state is more than the networks (observation statistics) adds it here."""
        return self.algorithm.policy_weights()

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`weights` returned (farm actors, each new version)."""
        self.algorithm.set_policy_weights(weights)


def _held(agent: Agent) -> HeldActing:
    held = held_acting(agent)
    if held is None:
        raise NotImplementedError(
            f"{type(agent).__name__} acts through neither a policy of its own (override "
            "Agent.policy() to return a harness.policy.Policy) nor sample()/predict()"
        )
    return held


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint's ``data.npz``, never unpickling (object arrays refused)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise CheckpointError(
            f"Checkpoint file {path} is corrupt or truncated ({type(exc).__name__}: {exc}); "
            f"harness cannot load it. Use another checkpoint of the run (checkpoints/step_*)."
        ) from None


Obs = Any
"""An observation batch: an array with the envs on the first axis, or (multi-agent) a dict of
them keyed by agent name."""


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """``fn`` applied to an array, or to each array of an agent-keyed dict (the same keys in
    ``rest``): one code path for single- and multi-agent batches."""
    if isinstance(tree, Mapping):
        return {key: fn(value, *(r[key] for r in rest)) for key, value in tree.items()}
    return fn(tree, *rest)


def team_reward(rewards: Any) -> np.ndarray:
    """Per-env rewards as one array: a multi-agent env's agent-keyed rewards summed over the
    agents (the team's return is what the runner reports as ``charts/episodic_return``; the
    env reports each agent's own as an episode metric)."""
    if isinstance(rewards, Mapping):
        return np.asarray(np.sum([np.asarray(r, np.float64) for r in rewards.values()], axis=0))
    return np.asarray(rewards)


def schedule_value(start: float, end: float, progress: float, span: float = 1.0) -> float:
    """Linear interpolation from ``start`` to ``end`` over the first ``span`` of progress."""
    frac = min(max(progress / span, 0.0), 1.0) if span > 0 else 1.0
    return start + frac * (end - start)
