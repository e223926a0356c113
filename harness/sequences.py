"""Recurrent sequences as every backend runs them: the state layout of ``Backend.recurrent``
layers and the plan that turns time-major sequences with episode starts inside them into
packed segments a fused LSTM/GRU runs in one call.

A recurrent layer's state is one array per env, ``(B, S)``: a GRU's hidden state (``S = H``),
an LSTM's ``h`` then ``c`` (``S = 2H``). Algorithms keep it, ship it and checkpoint it as that
one array, whatever the kind.

A fused op (cuDNN, oneDNN, paddle's ``rnn``) cannot zero its state in the middle of a sequence,
yet a rollout chunk of ``T`` steps from ``B`` envs holds episode ends anywhere. Stepping the
cell one time step at a time is what that costs in a loop (QMIX did so); instead
:func:`plan_segments` cuts every env's sequence at its episode starts into segments that run
without a reset, lays them side by side (padded to the longest), and says how to put the
outputs back in ``(T, B)`` order. One fused call then runs all of them: the torch backend packs
them (``pack_padded_sequence``), paddle passes their lengths. Numpy only, framework-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RECURRENT_KINDS", "SegmentPlan", "plan_segments", "state_dim"]

RECURRENT_KINDS = ("lstm", "gru")
"""The layer kinds ``Backend.recurrent`` builds."""


def state_dim(kind: str, hidden: int) -> int:
    """The width ``S`` of a ``kind`` layer's state with ``hidden`` units: ``2 * hidden`` for an
    LSTM (``h`` then ``c``), ``hidden`` for a GRU."""
    if kind not in RECURRENT_KINDS:
        raise ValueError(f"recurrent kind {kind!r}: expected one of {', '.join(RECURRENT_KINDS)}")
    return 2 * hidden if kind == "lstm" else hidden


@dataclass(frozen=True)
class SegmentPlan:
    """Segments of ``(T, B)`` sequences that run without a reset (see :func:`plan_segments`).
    Row indices refer to the sequences flattened time-major, ``t * B + b``; row ``T * B`` is a
    padding row of zeros the backend appends."""

    gather: np.ndarray
    """``(L, N)`` int64: the input row of step ``l`` of segment ``n`` (``T * B``: padding)."""
    lengths: np.ndarray
    """``(N,)`` int64: each segment's length (``L`` is the longest)."""
    env: np.ndarray
    """``(N,)`` int64: the env (batch column) each segment belongs to."""
    keeps_state: np.ndarray
    """``(N,)`` bool: the segment starts from the given initial state (it begins the
    sequence and no episode starts there); the others start from zeros."""
    scatter: np.ndarray
    """``(T * B,)`` int64: where each input row's output is in the segment outputs flattened
    ``(L * N)``."""
    last: np.ndarray
    """``(B,)`` int64: the segment that ends each env's sequence (its final state is the env's)."""


def plan_segments(starts: Any) -> SegmentPlan | None:
    """The segment plan of episode-start flags ``starts`` ``(T, B)`` (true: an episode starts at
    step ``t``, the state is zeroed before it), or None when no episode starts after the first
    step, so the whole sequences run in one fused call from the (masked) initial state."""
    flags = np.asarray(starts, bool)
    if flags.ndim != 2:
        raise ValueError(f"starts must be (T, B), got shape {flags.shape}")
    steps, width = flags.shape
    if not flags[1:].any():
        return None
    begins = flags.copy()
    begins[0] = True  # every env's sequence begins a segment
    env, t0 = np.nonzero(begins.T)  # ordered by env, then time
    same_env_next = np.append(env[1:] == env[:-1], False)
    t_end = np.where(same_env_next, np.append(t0[1:], steps), steps)
    lengths = (t_end - t0).astype(np.int64)
    count, longest = len(env), int(lengths.max())
    step = np.arange(longest)[:, None]
    valid = step < lengths[None]
    rows = (t0[None] + step) * width + env[None]
    gather = np.where(valid, rows, steps * width).astype(np.int64)
    scatter = np.empty(steps * width, np.int64)
    scatter[gather[valid]] = (step * count + np.arange(count)[None])[valid]
    return SegmentPlan(
        gather=gather,
        lengths=lengths,
        env=env.astype(np.int64),
        keeps_state=(t0 == 0) & ~flags[0, env],
        scatter=scatter,
        last=np.flatnonzero(~same_env_next).astype(np.int64),
    )
