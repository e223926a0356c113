"""int8 copies of the torch backend's CNN trunks for CPU acting (``[backend] int8_acting``).

An actor that runs the Nature CNN on its own CPU spends about as long on the forward pass as
on the Atari step itself (docs/benchmarks.md). On x86 CPUs with VNNI, torch's quantized
kernels run the same trunk 2.5-3x faster per observation (``tools/bench_impala.py
--policy-cost`` measures it beside the float layouts).

The copy is built from the float weights at each refresh:

- weights: symmetric int8, one scale per output channel (as torch's x86 default qconfig), in
  7 bits on CPUs without VNNI (:func:`weight_levels`);
- activations: unsigned 8-bit after each ReLU, one scale per layer, calibrated on the first
  batch after each refresh (the float trunk's maximum on up to ``CALIBRATION_ROWS`` of its
  observations times ``HEADROOM``; larger activations later saturate at that bound);
- the input: uint8 frames with the trunk's 1/255 scale are already 8-bit numbers, taken as
  they are; float inputs are quantized with their own calibrated range.

The features differ from the float trunk's by a few percent of their scale at most
(tests/unit/test_torch_backend.py bounds the worst feature at 4%, their correlation above
0.999). The acting policy is then not exactly the learner's: what the
behaviour policy's log-probabilities record is the int8 policy's, so IMPALA's V-trace (and
PPO's ratio) corrects for the difference as it does for policy lag.
"""

from __future__ import annotations

import warnings
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import nn

from harness.cpus import cpu_features

HEADROOM = 1.25
"""Activation ranges are the calibration batch's maximum times this."""
CALIBRATION_ROWS = 8
"""Observations of the first batch after a refresh that calibrate the ranges (a float
forward pass on them: a cost per refresh, not per batch)."""


ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")
"""torch's quantized CPU engines, preferred first (x86 picks fbgemm or oneDNN per op)."""


def supported() -> str | None:
    """Why int8 acting cannot run in this torch build, or None when it can."""
    if not set(ENGINES) & set(torch.backends.quantized.supported_engines):
        return f"torch {torch.__version__} has no quantized CPU engine"
    try:
        from torch.ao.nn.intrinsic import quantized  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no quantized modules ({exc})"
    return None


def _select_engine() -> None:
    available = torch.backends.quantized.supported_engines
    engine = next(e for e in ENGINES if e in available)  # (supported() checked there is one)
    if torch.backends.quantized.engine != engine:
        torch.backends.quantized.engine = engine


@cache
def weight_levels() -> float:
    """The largest |int8 weight|: 127 where the CPU multiplies u8 x s8 with VNNI (32-bit
    sums), 63 elsewhere. Without VNNI, x86 kernels add pairs of u8 x s8 products in int16,
    which saturates for 255 * 127 * 2; 7-bit weights keep every pair below 2^15 (torch's
    default qconfig halves the activations' range instead, which would cost the uint8
    frames their exactness). Measured on an AVX2-only AMD EPYC: the features' worst error
    went from 2-4% of their scale to 2-3%."""
    flags = cpu_features()[1]
    return 127.0 if {"avx512_vnni", "avx_vnni"} & flags else 63.0


def _per_channel(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 with one scale per output channel (|w| / scale <= weight_levels():
    no clamp)."""
    w = weight.detach().float()
    flat = w.reshape(len(w), -1)
    # amin and amax: 0.6 ms for the Nature CNN's 512 x 3136 layer, aminmax(dim=1) 3.5 ms
    levels = weight_levels()
    scales = (torch.maximum(-flat.amin(dim=1), flat.amax(dim=1)) / levels).clamp_min(1e-12)
    q = torch.round_(flat * (1.0 / scales)[:, None]).to(torch.int8).reshape(w.shape)
    zeros = torch.zeros(len(w), dtype=torch.long)
    return torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)


class Int8CNN:
    """A callable numpy -> numpy int8 copy of a ``_CNN`` (see the module docstring). Build it
    once per trunk; :meth:`load` re-reads the float weights (each policy refresh). The final
    linear layer is quantized too although it costs most of a refresh (the Nature CNN's 1.6M
    of 1.7M parameters: ~9 of ~12 ms): at acting batch sizes its float product reads 6.4 MB
    of weights per call, 100-170 us per observation at batch 4-16 (measured), which a 20-step
    rollout repays several times over."""

    def __init__(self, model: Any) -> None:
        from torch.ao.nn.intrinsic import quantized as nniq

        _select_engine()
        # torch marks quantized tensors deprecated (pytorch#184982); docs/backends.md says so
        # once, rather than every actor process's log
        warnings.filterwarnings(
            "ignore", r"torch\.quantize_per_tensor, torch\.quantize_per_channel", UserWarning
        )
        self.model = model
        self.floats = [m for m in model.convs if isinstance(m, nn.Conv2d)] + [model.fc]
        convs = [
            nniq.ConvReLU2d(c.in_channels, c.out_channels, c.kernel_size, c.stride)  # type: ignore[no-untyped-call]
            for c in self.floats[:-1]
        ]
        fc = nniq.LinearReLU(model.fc.in_features, model.fc.out_features)  # type: ignore[no-untyped-call]
        self.layers: list[Any] = [*convs, fc]
        self.calibrated = False
        self.in_scale, self.in_zero = 1.0, 0
        self.load()

    def load(self) -> None:
        """Quantize the trunk's current float weights; the activation ranges are calibrated
        again on the next batch."""
        with torch.no_grad():
            for q, f in zip(self.layers, self.floats, strict=True):
                assert f.bias is not None  # (cnn() builds its convolutions with biases)
                q.set_weight_bias(_per_channel(f.weight), f.bias.detach().float().clone())
        self.calibrated = False

    def _calibrate(self, x: torch.Tensor) -> None:
        """Activation scales from the float trunk on ``x``'s first ``CALIBRATION_ROWS`` rows
        (and the input's range, for float inputs)."""
        with torch.no_grad():
            h = x[:CALIBRATION_ROWS].float() * self.model.scale
            if x.is_floating_point():
                low, high = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
                self.in_scale = max((high - low) * HEADROOM / 255.0, 1e-8)
                self.in_zero = int(np.clip(round(-low * HEADROOM / self.in_scale), 0, 255))
            for q, f in zip(self.layers, self.floats, strict=True):
                h = torch.relu(f(h if isinstance(f, nn.Conv2d) else h.flatten(1)))
                q.scale = max(float(h.max()) * HEADROOM / 255.0, 1e-8)
                q.zero_point = 0
        self.calibrated = True

    def __call__(self, obs: Any) -> np.ndarray:
        x = torch.as_tensor(np.asarray(obs))
        if not self.calibrated:
            self._calibrate(x)
        with torch.no_grad():
            if x.dtype == torch.uint8:  # frames are 8-bit numbers already: exact
                h = torch._make_per_tensor_quantized_tensor(x, float(self.model.scale), 0)
            else:
                x = x.float() * self.model.scale
                h = torch.quantize_per_tensor(x, self.in_scale, self.in_zero, torch.quint8)
            *convs, fc = self.layers
            for conv in convs:
                h = conv(h)
            out: np.ndarray = fc(h.flatten(1)).dequantize().numpy()
        return out
