"""What every backend plugin shares and no framework does: the common [backend] options, the
argument checks of the :class:`harness.api.Backend` network builders with their error
messages, their defaults, and the layer geometry the builders compute before any tensor exists.

The torch and paddle backends each call these, so that a check or a message is written once and
both backends (and a third-party one) refuse the same arguments the same way. Numpy-free and
framework-free: the core imports no framework (``tests/unit/test_plugins.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

__all__ = [
    "AMP_MODES",
    "BackendOptions",
    "activation_class",
    "amp_in_effect",
    "cnn_layers",
    "conv_stack",
    "member_stacks",
    "out_gains_or_ones",
    "parallel_layout",
]

log = logging.getLogger(__name__)

AMP_MODES = ("off", "bf16", "fp16")
"""The values of ``[backend] amp``."""


@dataclass
class BackendOptions:
    """The [backend] keys every backend takes, so a pack's [backend] section works with any of
    them. A backend's own options class derives from this one, adds its own fields and may
    restate a field's docstring in its framework's terms (the docstrings are its ``--help``)."""

    device: str = "auto"
    """'auto' (an accelerator when present, else CPU), 'cpu', or the framework's device name."""
    threads: int = 0
    """Intra-op CPU threads; 0 sizes it to this process's CPU share (affinity / processes)."""
    processes_per_host: int = 1
    """How many harness processes share this host's CPUs (sets the automatic thread count)."""
    deterministic: bool = False
    """Use deterministic kernels (slower on an accelerator)."""
    amp: str = "off"
    """Mixed precision for the learner on an accelerator: 'off', 'bf16' (no loss scaling) or
    'fp16' (dynamic loss scaling). Weights and optimiser state stay float32; a CPU run ignores
    it (with a warning)."""
    pin_memory: bool = True
    """Accelerator only: copy big host batches through pinned host memory."""

    def __post_init__(self) -> None:
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp = {self.amp!r} is not one of {', '.join(AMP_MODES)}")


def amp_in_effect(
    amp: str, accelerated: bool, accelerator: str, device: str, logger: logging.Logger = log
) -> str | None:
    """The mixed precision a learner on ``device`` trains in: ``amp`` ('bf16', 'fp16'), or
    None for 'off' and for a device without an accelerator (``accelerated`` false), which
    ``logger`` warns about, naming the ``accelerator`` ('CUDA', 'GPU') the option needs."""
    if amp == "off":
        return None
    if not accelerated:
        logger.warning(
            "[backend] amp = %r applies to %s learners only: this %s run trains in float32",
            amp,
            accelerator,
            device,
        )
        return None
    return amp


def activation_class(table: Mapping[str, type[Any]], activation: str) -> type[Any]:
    """``table[activation]`` (a backend's activation layers by name), or a ConfigError
    listing the names it has."""
    act = table.get(activation)
    if act is None:
        raise ConfigError(f"activation {activation!r} is not one of {sorted(table)}.")
    return act


def out_gains_or_ones(out_gains: Sequence[float] | None, out_dims: Sequence[int]) -> list[float]:
    """``parallel_mlp``'s output-layer gains: the given ones, or 1.0 for every member."""
    return list(out_gains) if out_gains is not None else [1.0] * len(out_dims)


def parallel_layout(
    in_dim: int, hidden: Sequence[int], out_dims: Sequence[int], gains: Sequence[float]
) -> list[tuple[int, int, list[tuple[int, float]]]]:
    """The stacked layers of a ``parallel_mlp`` of ``len(out_dims)`` members, in order: per
    layer ``(fan_in, fan_out, [(width, gain) per member])``. Hidden layers are ``fan_out``
    wide with gain sqrt(2) (as in ``mlp``); the output layer is padded to the widest member, so
    member ``j`` fills its first ``out_dims[j]`` columns, initialised with ``gains[j]``."""
    sizes = [in_dim, *hidden, max(out_dims)]
    layout: list[tuple[int, int, list[tuple[int, float]]]] = []
    for layer in range(len(sizes) - 1):
        fan_in, fan_out = sizes[layer], sizes[layer + 1]
        if layer == len(sizes) - 2:
            members = [(dim, gain) for dim, gain in zip(out_dims, gains, strict=True)]
        else:
            members = [(fan_out, math.sqrt(2))] * len(out_dims)
        layout.append((fan_in, fan_out, members))
    return layout


def member_stacks(
    member: int,
    one_batch: bool,
    weights: Sequence[Any],
    biases: Sequence[Any],
    out_dims: Sequence[int],
) -> tuple[list[Any], list[Any], list[int]]:
    """A ``parallel_mlp`` called with ``member=j``: member ``j``'s slices of the stacked
    ``weights`` and ``biases`` (stacks of one) and its output width. ``one_batch`` says the
    call got one batch: a batch per member with ``member`` is a TypeError."""
    if not one_batch:
        raise TypeError("parallel_mlp(x, member=j) takes one batch, not one per member")
    return (
        [w[member : member + 1] for w in weights],
        [b[member : member + 1] for b in biases],
        [out_dims[member]],
    )


def cnn_layers(
    in_shape: Sequence[int],
    channels: Sequence[int],
    kernels: Sequence[int],
    strides: Sequence[int],
) -> tuple[tuple[int, ...], list[tuple[int, int, int]]]:
    """``cnn()``'s arguments checked: the ``(C, H, W)`` input shape as ints and the
    ``(channels, kernel, stride)`` of each convolution. A ConfigError unless the shape has three
    axes and there are as many channels, kernels and strides, at least one each."""
    shape = tuple(int(d) for d in in_shape)
    if len(shape) != 3 or not len(channels) == len(kernels) == len(strides) >= 1:
        raise ConfigError(
            f"cnn() takes a (C, H, W) in_shape and as many channels, kernels and strides "
            f"(at least one each); got {shape}, {channels}, {kernels}, {strides}."
        )
    return shape, list(zip(channels, kernels, strides, strict=True))


def conv_stack(
    in_shape: tuple[int, ...], layers: Sequence[tuple[int, int, int]]
) -> tuple[list[tuple[int, int, int, int]], int]:
    """The unpadded convolutions of a ``cnn()`` on a ``(C, H, W)`` input: per layer
    ``(in_channels, out_channels, kernel, stride)``, and the flat size of the last one's
    output (the linear layer's input). A ConfigError when the image is too small for the
    layers (an output side under one pixel)."""
    c, h, w = in_shape
    convs: list[tuple[int, int, int, int]] = []
    for out, kernel, stride in layers:
        convs.append((c, out, kernel, stride))
        c, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
        if h < 1 or w < 1:
            raise ConfigError(f"cnn(): a {in_shape} image is too small for the layers {layers}")
    return convs, c * h * w
