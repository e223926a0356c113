"""Numpy forward passes of the fully connected networks every backend builds, and the greedy
policy as data (:class:`PolicyProgram`).

Acting (rollouts, evaluation, farm actors) runs the policy in numpy: for the small batches an
actor acts on, a numpy matmul chain costs a fraction of a framework's per-operation overhead
(torch: one 8-observation PPO action 257 -> 58 us). Backends hand their weights over in one
layout, ``(fan_in, fan_out)`` matrices, so the same functions serve torch and paddle.

The copies are made of layers that are also data (:class:`Dense`, :class:`Activation`,
:class:`Recurrent`): an agent describes its greedy policy (``Agent.policy_program``) by listing
the layers of the very copies it acts with, plus the steps around them (observation
standardisation, the squash and the action bounds), and ``harness export`` writes that list
as an ONNX graph. A :class:`PolicyProgram` evaluates itself in numpy with the same layer
objects, so acting, the description and its tests cannot each hold their own arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Array = np.ndarray
"""A numpy array (weights, activations, observations)."""
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0.0, x, np.expm1(np.minimum(x, 0.0))),
}
"""The hidden activations backends build, by name, as numpy functions."""


# --- layers as data ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Dense:
    """An affine layer ``h @ w + b``: ``w`` ``(in, out)`` and ``b`` ``(out,)``, float32."""

    w: Array
    """The weight matrix, ``(fan_in, fan_out)`` (the layout every backend hands over)."""
    b: Array
    """The bias, ``(fan_out,)``."""

    def __call__(self, h: Array) -> Array:
        out: Array = h @ self.w + self.b
        return out


@dataclass(frozen=True)
class Activation:
    """An elementwise activation by name (a key of :data:`harness.numpy_nets.ACTIVATIONS`:
    tanh, relu, elu)."""

    name: str
    """tanh, relu or elu."""

    def __post_init__(self) -> None:
        if self.name not in ACTIVATIONS:
            raise ValueError(f"activation {self.name!r}: expected one of {sorted(ACTIVATIONS)}")

    def __call__(self, h: Array) -> Array:
        return ACTIVATIONS[self.name](h)


Layer = Dense | Activation
"""One step of a feed-forward chain."""


def _f32(a: Array) -> Array:
    return np.ascontiguousarray(a, np.float32)


class Sequential:
    """The numpy copy of an MLP (:func:`sequential`): its :attr:`layers` applied to the input
    flattened after its batch axis (float32)."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.layers: tuple[Layer, ...] = tuple(layers)
        """The chain, first layer first."""
        # activations called as the numpy functions themselves: one Python call fewer a layer
        self._ops = [ACTIVATIONS[s.name] if isinstance(s, Activation) else s for s in self.layers]

    def __call__(self, x: Array) -> Array:
        h = np.asarray(x, np.float32).reshape(len(x), -1)
        for op in self._ops:
            h = op(h)
        return h


def sequential(steps: Sequence[tuple[Array, Array] | str]) -> Sequential:
    """A chain of ``(weight (in, out), bias)`` affine layers and activation names, applied to
    the input flattened after its batch axis (float32)."""
    return Sequential(
        [Activation(s) if isinstance(s, str) else Dense(_f32(s[0]), _f32(s[1])) for s in steps]
    )


class Parallel:
    """The numpy copy of k stacked MLPs (:func:`parallel`)."""

    def __init__(
        self,
        weights: Sequence[Array],
        biases: Sequence[Array],
        activation: str,
        out_dims: Sequence[int],
    ) -> None:
        self.weights = [_f32(w) for w in weights]
        """Per layer, every member's weights: ``(k, in, out)``."""
        self.biases = [_f32(b) for b in biases]
        """Per layer, every member's biases: ``(k, 1, out)``."""
        self.activation = Activation(activation)
        """The hidden layers' activation."""
        self.out_dims = list(out_dims)
        """Each member's output width (the last layer is padded to the widest)."""
        self._act = ACTIVATIONS[activation]

    def __call__(self, x: Any) -> list[Array]:
        if isinstance(x, list | tuple):  # one input per member: (k, B, in)
            h = np.stack([np.asarray(xi, np.float32).reshape(len(xi), -1) for xi in x])
        else:
            h = np.asarray(x, np.float32).reshape(len(x), -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b  # (B, in) or (k, B, in) @ (k, in, out) -> (k, B, out)
            if i < last:
                h = self._act(h)
        return [h[j, :, :d] for j, d in enumerate(self.out_dims)]

    def member(self, j: int) -> tuple[Layer, ...]:
        """Member ``j`` alone as a chain of layers (its output layer cut to its own width):
        what a policy that reads one head of an actor-critic pair computes."""
        layers: list[Layer] = []
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            width = self.out_dims[j] if i == last else w.shape[-1]
            layers.append(Dense(_f32(w[j][:, :width]), _f32(b[j].reshape(-1)[:width])))
            if i < last:
                layers.append(self.activation)
        return tuple(layers)


def parallel(
    weights: Sequence[Array], biases: Sequence[Array], activation: str, out_dims: Sequence[int]
) -> Parallel:
    """k stacked MLPs (``Backend.parallel_mlp``): weights ``(k, in, out)``, biases
    ``(k, 1, out)``; the output layer padded to the widest member. Called with one batch (every
    member reads it) or a list of k batches (member j reads batch j)."""
    return Parallel(weights, biases, activation, out_dims)


def framework_forward(
    model: Any,
    to_tensor: Callable[[Array], Any],
    to_numpy: Callable[[Any], Array],
    no_grad: Callable[[], Any],
) -> Callable[[Array], Any]:
    """The fallback for networks without a numpy copy (a CNN): a framework forward under
    ``no_grad``, numpy in and out (a list of arrays for a list of outputs)."""

    def forward(x: Array) -> Any:
        with no_grad():
            out = model(to_tensor(x))
        if isinstance(out, list | tuple):
            return [to_numpy(o) for o in out]
        return to_numpy(out)

    return forward


def gru(w_ih: Array, b_ih: Array, w_hh: Array, b_hh: Array) -> Callable[[Array, Array], Array]:
    """A GRU cell (one step of a ``Backend.recurrent("gru", ...)`` layer) from its input and
    hidden projections, ``(fan_in, 3H)`` weights with the gates in the order reset, update,
    candidate (torch's ``GRUCell`` arithmetic): called on ``(x (B, in), h (B, H))`` it returns
    the next hidden state."""
    wi, bi, wh, bh = (np.ascontiguousarray(a, np.float32) for a in (w_ih, b_ih, w_hh, b_hh))
    size = wh.shape[0]

    def forward(x: Array, h: Array) -> Array:
        h = np.asarray(h, np.float32)
        gi = np.asarray(x, np.float32).reshape(len(x), -1) @ wi + bi
        gh = h @ wh + bh
        r = 1.0 / (1.0 + np.exp(-(gi[:, :size] + gh[:, :size])))
        z = 1.0 / (1.0 + np.exp(-(gi[:, size : 2 * size] + gh[:, size : 2 * size])))
        n = np.tanh(gi[:, 2 * size :] + r * gh[:, 2 * size :])
        out: Array = (1.0 - z) * n + z * h
        return out

    return forward


@dataclass(frozen=True, eq=False)
class Recurrent:
    """One time step of a ``Backend.recurrent`` layer (:func:`recurrent_step`), as data and
    as its numpy copy: called on ``(x (B, in), state (B, S))`` it returns ``(output (B, H),
    next state (B, S))``."""

    kind: str
    """"lstm" (state ``h`` then ``c``, ``S = 2H``) or "gru" (``S = H``, the output)."""
    w_ih: Array
    """Input projection ``(fan_in, G * H)``, gates in torch's order (LSTM: input, forget,
    cell, output; GRU: reset, update, candidate)."""
    b_ih: Array
    """Input projection bias ``(G * H,)``."""
    w_hh: Array
    """Hidden projection ``(H, G * H)``."""
    b_hh: Array
    """Hidden projection bias ``(G * H,)``."""
    _step: Callable[[Array, Array], tuple[Array, Array]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("lstm", "gru"):
            raise ValueError(f"recurrent kind {self.kind!r}: expected 'lstm' or 'gru'")
        for name in ("w_ih", "b_ih", "w_hh", "b_hh"):
            object.__setattr__(self, name, _f32(getattr(self, name)))
        object.__setattr__(self, "_step", self._lstm_step if self.kind == "lstm" else self._gru())

    @property
    def hidden(self) -> int:
        """The layer's width ``H`` (its output's)."""
        return int(self.w_hh.shape[0])

    @property
    def state_size(self) -> int:
        """``S``: the width of the state a step reads and returns."""
        return 2 * self.hidden if self.kind == "lstm" else self.hidden

    def __call__(self, x: Array, state: Array) -> tuple[Array, Array]:
        return self._step(x, state)

    def _gru(self) -> Callable[[Array, Array], tuple[Array, Array]]:
        cell = gru(self.w_ih, self.b_ih, self.w_hh, self.b_hh)

        def gru_step(x: Array, state: Array) -> tuple[Array, Array]:
            h = cell(x, state)
            return h, h

        return gru_step

    def _lstm_step(self, x: Array, state: Array) -> tuple[Array, Array]:
        size = self.hidden
        state = np.asarray(state, np.float32)
        h, c = state[:, :size], state[:, size:]
        gates = (
            np.asarray(x, np.float32).reshape(len(x), -1) @ self.w_ih
            + self.b_ih
            + h @ self.w_hh
            + self.b_hh
        )
        i, f, g, o = (gates[:, k * size : (k + 1) * size] for k in range(4))
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        return h, np.concatenate([h, c], axis=1)


def recurrent_step(kind: str, w_ih: Array, b_ih: Array, w_hh: Array, b_hh: Array) -> Recurrent:
    """One time step of a ``Backend.recurrent`` layer (actors step it once per env step):
    called on ``(x (B, in), state (B, S))`` it returns ``(output (B, H), next state (B, S))``.

    Weights are ``(fan_in, G * H)`` with the gates in torch's order: an LSTM's input, forget,
    cell and output gates (``G = 4``; its state is ``h`` then ``c``, ``S = 2H``), a GRU's reset,
    update and candidate (``G = 3``; ``S = H``, the output). ``harness.testing.check_backend``
    holds a backend's copy equal to its fused sequence op."""
    return Recurrent(kind, w_ih, b_ih, w_hh, b_hh)


def _sigmoid(x: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|
    return out


def layers_of(copy: Any, member: int = 0) -> tuple[Layer, ...] | None:
    """The layers of a numpy copy: a :class:`Sequential`'s chain, or member ``member`` of a
    :class:`Parallel` (an actor-critic's policy head); None for another callable (a
    :func:`framework_forward` fallback, a CNN), which has no description."""
    if isinstance(copy, Sequential):
        return copy.layers
    if isinstance(copy, Parallel):
        return copy.member(member)
    return None


# --- the greedy policy as data (Agent.policy_program, harness export) ----------------------------
@dataclass(frozen=True, eq=False)
class Standardize:
    """Observation standardisation as the on-policy agents' ``normalize_obs`` does it:
    ``clip((x - mean) / std, -clip, clip)`` in float64, returned as float32."""

    mean: Array
    """Per-feature running mean ``(obs_dim,)``, float64."""
    std: Array
    """Per-feature ``sqrt(var + eps)`` ``(obs_dim,)``, float64."""
    clip: float
    """The bound of the standardised values."""

    def __call__(self, h: Array) -> Array:
        out: Array = (np.asarray(h, np.float64) - self.mean) / self.std
        clipped: Array = np.clip(out, -self.clip, self.clip)
        return clipped.astype(np.float32)


@dataclass(frozen=True)
class Columns:
    """Columns ``start:stop`` of the features (SAC's actor emits means, then log-stds)."""

    start: int
    """First column kept."""
    stop: int
    """One past the last column kept."""

    def __call__(self, h: Array) -> Array:
        return h[:, self.start : self.stop]


@dataclass(frozen=True, eq=False)
class Clip:
    """Per-dimension bounds ``min(max(h, low), high)`` (Gaussian means clipped to the box)."""

    low: Array
    """Lower bounds ``(act_dim,)``, float32."""
    high: Array
    """Upper bounds ``(act_dim,)``, float32."""

    def __call__(self, h: Array) -> Array:
        out: Array = np.clip(h, self.low, self.high)
        return out


@dataclass(frozen=True, eq=False)
class Rescale:
    """``centre + half * h`` as float32: a tanh actor's [-1, 1] onto the env's action box."""

    centre: Array
    """The box's centre ``(act_dim,)``, float32."""
    half: Array
    """The box's half range ``(act_dim,)``, float32."""

    def __call__(self, h: Array) -> Array:
        out: Array = (self.centre + self.half * h).astype(np.float32)
        return out


@dataclass(frozen=True)
class Argmax:
    """The index of each row's largest value (first on ties), int64 ``(B,)``: a discrete
    action from logits or Q-values."""

    def __call__(self, h: Array) -> Array:
        return np.asarray(h.argmax(-1), np.int64)


Op = Standardize | Dense | Activation | Recurrent | Columns | Clip | Rescale | Argmax
"""One step of a :class:`PolicyProgram`."""


def _widths(op: Op, width: int) -> tuple[int, int]:
    """(features ``op`` reads, features it writes) after ``width`` features."""
    if isinstance(op, Dense):
        return op.w.shape[0], op.w.shape[1]
    if isinstance(op, Recurrent):
        return op.w_ih.shape[0], op.hidden
    if isinstance(op, Standardize):
        return op.mean.size, op.mean.size
    if isinstance(op, Clip):
        return op.low.size, op.low.size
    if isinstance(op, Rescale):
        return op.centre.size, op.centre.size
    if isinstance(op, Columns):
        valid = 0 <= op.start < op.stop <= width
        return (width if valid else op.stop), op.stop - op.start
    if isinstance(op, Argmax):
        return width, 1
    return width, width  # an activation


@dataclass(frozen=True)
class PolicyProgram:
    """An agent's greedy policy, env observations in, env actions out, as data
    (``Agent.policy_program``): what ``harness export`` writes as an ONNX graph. Calling it
    evaluates it in numpy with the same layer objects the agent acts with.

    :attr:`ops` run in order on the observations flattened to ``(B, obs_dim)`` float32; a
    :class:`Recurrent` op (at most one) also reads the state ``(B, state_size)`` and writes
    the next one (zeros at an episode's start). A discrete policy ends in :class:`Argmax`
    (int64 actions ``(B,)``); a box one returns ``(B, act_dim)`` float32."""

    ops: tuple[Op, ...]
    """The steps, first applied first."""
    obs_dim: int
    """Values in one observation (flattened)."""
    act_dim: int
    """A box action's values, or the number of discrete actions."""
    discrete: bool
    """True when the actions are indices (the program ends in :class:`Argmax`)."""

    def __post_init__(self) -> None:
        cells = [op for op in self.ops if isinstance(op, Recurrent)]
        if len(cells) > 1:
            raise ValueError(f"a policy program has at most one Recurrent op, got {len(cells)}")
        if self.discrete != (bool(self.ops) and isinstance(self.ops[-1], Argmax)):
            raise ValueError("a discrete policy program ends in Argmax, and only a discrete one")
        width = self.obs_dim  # each op must read the width the one before it wrote
        for i, op in enumerate(self.ops):
            reads, writes = _widths(op, width)
            if reads != width:
                raise ValueError(
                    f"policy program op {i} ({type(op).__name__}) reads {reads} features, but "
                    f"{'the observation has' if i == 0 else 'the op before it writes'} {width}"
                )
            width = writes
        if width != (1 if self.discrete else self.act_dim):
            raise ValueError(f"a policy program for {self.act_dim} actions ends {width} wide")

    @property
    def recurrent(self) -> Recurrent | None:
        """The recurrent layer, or None for a feed-forward policy."""
        return next((op for op in self.ops if isinstance(op, Recurrent)), None)

    @property
    def state_size(self) -> int:
        """Width of the recurrent state (0 for a feed-forward policy)."""
        cell = self.recurrent
        return 0 if cell is None else cell.state_size

    def initial_state(self, batch: int) -> Array:
        """The state at an episode's start: zeros ``(batch, state_size)``."""
        return np.zeros((batch, self.state_size), np.float32)

    def __call__(self, obs: Array, state: Array | None = None) -> tuple[Array, Array | None]:
        """Greedy actions for ``obs`` ``(B, ...)`` and, for a recurrent policy, the state
        after this step from ``state`` (zeros when None); None for a feed-forward one."""
        h = np.asarray(obs).reshape(len(obs), -1)
        if not (self.ops and isinstance(self.ops[0], Standardize)):  # (it takes float64)
            h = h.astype(np.float32, copy=False)
        after = None
        for op in self.ops:
            if isinstance(op, Recurrent):
                h, after = op(h, self.initial_state(len(h)) if state is None else state)
            else:
                h = op(h)
        return h, after
