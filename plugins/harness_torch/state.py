"""Checkpoint files of the torch backend: :mod:`harness.safestate` with torch tensors as arrays.

``agent.torch`` is a ``harness.safestate`` file (arrays + JSON, loaded without unpickling).
A tensor is stored as its CPU numpy array with its dtype and device in the JSON; a dtype that
numpy lacks (bfloat16, the float8 kinds) is stored as the unsigned-integer view of the same
width and viewed back on load. :func:`load_legacy` reads a ``torch.save`` pickle of an earlier
harness version: only ``harness checkpoint convert --trust`` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.errors import CheckpointError
from harness.safestate import load_state, save_state

__all__ = ["TorchCodec", "load_legacy", "load_payload", "save_payload"]

# the dtypes a checkpoint may name (a name from the file is looked up here, never getattr'd)
_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)),
    )
}
# numpy has no bfloat16/float8: those travel as the integer view of the same width
_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_NATIVE = frozenset(
    n for n in _DTYPES if n not in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
)


class TorchCodec:
    """Tensors <-> (numpy array, {dtype, device}); decoded onto ``device`` when they were on
    an accelerator of its type, else onto the CPU (RNG states, CPU optimiser steps)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def encode(self, value: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
        if not isinstance(value, torch.Tensor):
            return None
        name = str(value.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            return None  # refused at save time with the key path
        tensor = value.detach().cpu()
        if name not in _NUMPY_NATIVE:
            tensor = tensor.view(_VIEWS[tensor.element_size()])
        return tensor.contiguous().numpy(), {"dtype": name, "device": value.device.type}

    def decode(self, array: np.ndarray, info: Mapping[str, Any]) -> torch.Tensor:
        name, device = info.get("dtype"), info.get("device")
        if name not in _DTYPES or not isinstance(device, str):
            raise CheckpointError(f"a tensor's recorded dtype/device {dict(info)!r} is unknown")
        dtype = _DTYPES[name]
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if name not in _NUMPY_NATIVE:
            if tensor.element_size() != dtype.itemsize:  # (a view would change the shape)
                raise CheckpointError(f"a {name} tensor stored as {array.dtype}")
            tensor = tensor.view(dtype)
        if tensor.dtype != dtype:
            raise CheckpointError(f"a tensor stored as {array.dtype} claims dtype {name}")
        if device != "cpu" and device == self.device.type:
            return tensor.to(self.device)
        return tensor


def save_payload(payload: Mapping[str, Any], path: Path, device: torch.device) -> None:
    save_state(path, dict(payload), TorchCodec(device))


def load_payload(path: Path, device: torch.device) -> dict[str, Any]:
    payload = load_state(path, TorchCodec(device))
    if not isinstance(payload, dict):
        raise CheckpointError(f"Checkpoint file {path} does not hold a dict of states.")
    return payload


def load_legacy(path: Path) -> dict[str, Any]:
    """A ``torch.save`` checkpoint of an earlier harness version. UNPICKLES: code in the file
    runs. Only ``harness checkpoint convert --trust`` calls this."""
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return payload
