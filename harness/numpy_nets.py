"""Numpy forward passes of the fully connected networks every backend builds.

Acting (rollouts, evaluation, farm actors) runs the policy in numpy: for the small batches an
actor acts on, a numpy matmul chain costs a fraction of a framework's per-operation overhead
(torch: one 8-observation PPO action 257 -> 58 us). Backends hand their weights over in one
layout, ``(fan_in, fan_out)`` matrices, so the same functions serve torch and paddle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Array = np.ndarray
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0.0, x, np.expm1(np.minimum(x, 0.0))),
}


def sequential(steps: Sequence[tuple[Array, Array] | str]) -> Callable[[Array], Array]:
    """A chain of ``(weight (in, out), bias)`` affine layers and activation names, applied to
    the input flattened after its batch axis (float32)."""
    ops: list[Callable[[Array], Array]] = []
    for step in steps:
        if isinstance(step, str):
            ops.append(ACTIVATIONS[step])
        else:
            ops.append(_affine(*(np.ascontiguousarray(a, np.float32) for a in step)))

    def forward(x: Array) -> Array:
        h = np.asarray(x, np.float32).reshape(len(x), -1)
        for op in ops:
            h = op(h)
        return h

    return forward


def _affine(w: Array, b: Array) -> Callable[[Array], Array]:
    def apply(h: Array) -> Array:
        out: Array = h @ w + b
        return out

    return apply


def parallel(
    weights: Sequence[Array], biases: Sequence[Array], activation: str, out_dims: Sequence[int]
) -> Callable[[Any], list[Array]]:
    """k stacked MLPs (``Backend.parallel_mlp``): weights ``(k, in, out)``, biases
    ``(k, 1, out)``; the output layer padded to the widest member. Called with one batch (every
    member reads it) or a list of k batches (member j reads batch j)."""
    ws = [np.ascontiguousarray(w, np.float32) for w in weights]
    bs = [np.ascontiguousarray(b, np.float32) for b in biases]
    act, last, dims = ACTIVATIONS[activation], len(ws) - 1, list(out_dims)

    def forward(x: Any) -> list[Array]:
        if isinstance(x, list | tuple):  # one input per member: (k, B, in)
            h = np.stack([np.asarray(xi, np.float32).reshape(len(xi), -1) for xi in x])
        else:
            h = np.asarray(x, np.float32).reshape(len(x), -1)
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + b  # (B, in) or (k, B, in) @ (k, in, out) -> (k, B, out)
            if i < last:
                h = act(h)
        return [h[j, :, :d] for j, d in enumerate(dims)]

    return forward


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


def recurrent_step(
    kind: str, w_ih: Array, b_ih: Array, w_hh: Array, b_hh: Array
) -> Callable[[Array, Array], tuple[Array, Array]]:
    """One time step of a ``Backend.recurrent`` layer (actors step it once per env step):
    called on ``(x (B, in), state (B, S))`` it returns ``(output (B, H), next state (B, S))``.

    Weights are ``(fan_in, G * H)`` with the gates in torch's order: an LSTM's input, forget,
    cell and output gates (``G = 4``; its state is ``h`` then ``c``, ``S = 2H``), a GRU's reset,
    update and candidate (``G = 3``; ``S = H``, the output). ``harness.testing.check_backend``
    holds a backend's copy equal to its fused sequence op."""
    wi, bi, wh, bh = (np.ascontiguousarray(a, np.float32) for a in (w_ih, b_ih, w_hh, b_hh))
    size = wh.shape[0]
    if kind == "gru":
        cell = gru(wi, bi, wh, bh)

        def gru_step(x: Array, state: Array) -> tuple[Array, Array]:
            h = cell(x, state)
            return h, h

        return gru_step
    if kind != "lstm":
        raise ValueError(f"recurrent kind {kind!r}: expected 'lstm' or 'gru'")

    def lstm_step(x: Array, state: Array) -> tuple[Array, Array]:
        state = np.asarray(state, np.float32)
        h, c = state[:, :size], state[:, size:]
        gates = np.asarray(x, np.float32).reshape(len(x), -1) @ wi + bi + h @ wh + bh
        i, f, g, o = (gates[:, k * size : (k + 1) * size] for k in range(4))
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        return h, np.concatenate([h, c], axis=1)

    return lstm_step


def _sigmoid(x: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|
    return out
