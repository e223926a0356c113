"""Checkpoint files of the paddle backend: :mod:`harness.safestate` with paddle tensors and
generator states as arrays.

``agent.paddle`` is a ``harness.safestate`` file (arrays + JSON, loaded without unpickling).
A tensor is stored as its numpy array (paddle gives bfloat16 as uint16 and takes uint16 back as
bfloat16) with its dtype and place in the JSON. ``paddle.get_rng_state()`` returns a list of
``GeneratorState`` objects; each is stored as the integers of its ``__getstate__`` (device,
seed, offset, and the MT19937 state as a byte list). :func:`load_legacy` reads a
``paddle.save`` pickle of an earlier harness version: only ``harness checkpoint convert
--trust`` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import CheckpointError
from harness.safestate import load_state, save_state
from harness_paddle.framework import core, paddle

__all__ = ["PaddleCodec", "load_legacy", "load_payload", "save_payload"]

_DTYPES = frozenset(
    ("float16", "bfloat16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64")
) | {"bool", "complex64", "complex128"}
_GENERATOR = core.GeneratorState


class PaddleCodec:
    """Paddle tensors and generator states <-> (numpy array, JSON info); tensors come back on
    the default (the backend's) place when they were on a GPU, else on the CPU."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu

    def encode(self, value: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
        if isinstance(value, _GENERATOR):
            device, seed, offset, mt_state = value.__getstate__()
            info = {"generator": [int(device), int(seed), int(offset)]}
            return np.asarray(mt_state, np.int64), info
        if not isinstance(value, paddle.Tensor):
            return None
        name = str(value.dtype).removeprefix("paddle.")
        if name not in _DTYPES:
            return None  # refused at save time with the key path
        place = "gpu" if value.place.is_gpu_place() else "cpu"
        return np.ascontiguousarray(value.numpy()), {"dtype": name, "place": place}

    def decode(self, array: np.ndarray, info: Mapping[str, Any]) -> Any:
        if "generator" in info:
            head = info["generator"]
            if not (isinstance(head, list) and len(head) == 3 and array.ndim == 1):
                raise CheckpointError(f"a generator state {dict(info)!r} is malformed")
            generator = _GENERATOR.__new__(_GENERATOR)
            generator.__setstate__((*(int(v) for v in head), [int(v) for v in array]))
            return generator
        name, place = info.get("dtype"), info.get("place")
        if name not in _DTYPES or place not in ("cpu", "gpu"):
            raise CheckpointError(f"a tensor's recorded dtype/place {dict(info)!r} is unknown")
        target = None if place == "gpu" and self.gpu else paddle.CPUPlace()
        return paddle.to_tensor(array, dtype=name, place=target)


def save_payload(payload: Mapping[str, Any], path: Path, gpu: bool) -> None:
    save_state(path, dict(payload), PaddleCodec(gpu))


def load_payload(path: Path, gpu: bool) -> dict[str, Any]:
    payload = load_state(path, PaddleCodec(gpu))
    if not isinstance(payload, dict):
        raise CheckpointError(f"Checkpoint file {path} does not hold a dict of states.")
    return payload


def load_legacy(path: Path) -> dict[str, Any]:
    """A ``paddle.save`` checkpoint of an earlier harness version. UNPICKLES: code in the file
    runs. Only ``harness checkpoint convert --trust`` calls this."""
    payload: dict[str, Any] = paddle.load(str(path))
    return payload
