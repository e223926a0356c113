"""State files that cannot carry code: a nested payload as named arrays plus a JSON skeleton.

A checkpoint's ``agent.<backend>`` holds the algorithm's networks and optimisers, the agent's
counters and the framework's RNG state. Pickle (``torch.save``, ``paddle.save``) would run
whatever a doctored file asks for when it is loaded, and run directories are passed between
people, so this module stores the same payload as data only:

* one ``.npz`` file (a zip of ``.npy`` members, read with ``np.load(allow_pickle=False)``:
  object arrays are refused by numpy itself);
* every array (and numpy scalar, and each framework tensor the backend turns into an array
  through its :class:`TensorCodec`) is one member ``a<N>.npy``;
* everything else (dicts, also with non-string keys such as optimiser param ids, lists,
  tuples, None, bool, ints of any size such as numpy's PCG64 state, floats incl. nan/inf,
  strings) is a JSON skeleton in the member ``__harness_state__.npy`` (UTF-8 bytes as uint8),
  with a format name and version.

Saving refuses anything else up front, naming its key path. Loading checks the structure and
raises :class:`harness.errors.CheckpointError` (one paragraph, the file named) for anything
malformed or truncated; a pickle of an earlier harness version raises
:class:`LegacyCheckpointError`, which names ``harness checkpoint convert``.

Skeleton nodes: JSON null/bool/int/str/finite float are themselves; every container or array
is a one-key object: ``{"m": {str: node}}`` (a dict with string keys), ``{"d": [[key, node],
...]}`` (any other dict), ``{"l": [...]}``, ``{"t": [...]}``, ``{"f": "nan"|"inf"|"-inf"}``,
``{"b": name}`` (bytes), ``{"a": name}`` (array), ``{"n": name}`` (numpy scalar) and
``{"x": name, "i": info}`` (a framework tensor: the codec's array and JSON info).
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.errors import CheckpointError

__all__ = [
    "FORMAT",
    "VERSION",
    "LegacyCheckpointError",
    "TensorCodec",
    "check_file",
    "is_state_file",
    "load_state",
    "save_state",
]

FORMAT = "harness-state"
VERSION = 1
SKELETON = "__harness_state__"
CONVERT = "harness checkpoint convert RUN --trust"


class LegacyCheckpointError(CheckpointError):
    """A checkpoint written by an earlier harness version (a framework pickle)."""


class TensorCodec(Protocol):
    """What a backend passes to store its tensors (and other framework objects) as arrays."""

    def encode(self, value: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
        """``(array, info)`` for a framework object (info: JSON-able, e.g. dtype and device),
        or None for a value this codec does not handle."""
        ...

    def decode(self, array: np.ndarray, info: Mapping[str, Any]) -> Any:
        """The object :meth:`encode` described. ``info`` comes from the file: check it."""
        ...


# --- saving ------------------------------------------------------------------------------


@dataclass
class _Writer:
    codec: TensorCodec | None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def array(self, value: np.ndarray, where: str) -> str:
        if value.dtype.hasobject:
            raise CheckpointError(
                f"{where}: an array of dtype {value.dtype} (Python objects) cannot be stored in "
                f"a checkpoint; store numbers, strings or nested dicts/lists instead."
            )
        name = f"a{len(self.arrays)}"
        self.arrays[name] = value
        return name

    def node(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.generic):  # before int/float: np.float64 is a float
            return {"n": self.array(np.asarray(value), where)}
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {"f": repr(value)}
        if isinstance(value, np.ndarray):
            return {"a": self.array(value, where)}
        if isinstance(value, bytes):
            return {"b": self.array(np.frombuffer(value, np.uint8), where)}
        if isinstance(value, Mapping):
            return self.mapping(value, where)
        if isinstance(value, (list, tuple)):
            items = [self.node(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return {"l" if isinstance(value, list) else "t": items}
        encoded = self.codec.encode(value) if self.codec is not None else None
        if encoded is None:
            raise CheckpointError(
                f"{where or 'the payload'}: type {type(value).__module__}."
                f"{type(value).__qualname__} cannot be stored in a checkpoint (only dicts, "
                f"lists, tuples, None, bool, int, float, str, bytes, numpy arrays and the "
                f"backend's tensors can). Convert it in the algorithm's state()."
            )
        array, info = encoded
        try:
            json.dumps(info, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{where}: the backend's tensor info is not JSON: {exc}"
            ) from None
        return {"x": self.array(np.asarray(array), where), "i": info}

    def mapping(self, value: Mapping[Any, Any], where: str) -> Any:
        if all(isinstance(k, str) for k in value):
            return {
                "m": {k: self.node(v, f"{where}.{k}" if where else k) for k, v in value.items()}
            }
        pairs = []
        for k, v in value.items():
            label = f"{where}[{k!r}]"
            pairs.append([self.node(k, label), self.node(v, label)])
        return {"d": pairs}


def save_state(path: Path | str, payload: Any, codec: TensorCodec | None = None) -> None:
    """Write ``payload`` to ``path`` (one file, any name). Raises
    :class:`~harness.errors.CheckpointError` naming the key path of a value it cannot store,
    before anything is written. Not atomic by itself: checkpoints are written into a temp
    directory that is renamed whole (``harness.checkpoint``)."""
    writer = _Writer(codec)
    tree = writer.node(payload, "")
    skeleton = json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}, allow_nan=False)
    members = {SKELETON: np.frombuffer(skeleton.encode("utf-8"), np.uint8), **writer.arrays}
    # an open file: np.savez would append ".npz" to a path that lacks it
    with open(path, "wb") as fh:
        # (object arrays were refused above: nothing is pickled)
        np.savez(fh, **members)  # type: ignore[arg-type]


# --- loading -----------------------------------------------------------------------------

_TAGS = frozenset("mdltfbanx")


def _bad(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"Checkpoint file {path} is corrupt or truncated ({what}); harness cannot load it. "
        f"Use another checkpoint of the run (checkpoints/step_*), or rerun."
    )


def legacy_message(path: Path) -> str:
    """The paragraph for a checkpoint of an earlier harness version at ``path``."""
    run = path.parent  # RUN/checkpoints/step_X/agent.torch -> RUN (RUN/best/... -> RUN too)
    if len(path.parts) > 3 and path.parts[-3] == "checkpoints":
        run = path.parents[3] if path.parents[2].name == "best" else path.parents[2]
    return (
        f"{path} is a checkpoint of an earlier harness version: a pickle, which can run "
        f"arbitrary code when it is loaded, so harness does not load it. If you trust whoever "
        f"wrote it, convert it once with `{CONVERT.replace('RUN', str(run))}` (this is the only "
        f"command that unpickles); checkpoints written from now on are plain arrays and JSON."
    )


def check_file(path: Path) -> None:
    """Refuse a file that is not of this format (a legacy pickle: :class:`LegacyCheckpointError`)
    from its first bytes and its zip directory, decoding nothing: cheap enough to run on every
    checkpoint before a command writes anything."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise CheckpointError(f"Checkpoint file {path} cannot be read: {exc}.") from None
    if head[:1] == b"\x80":  # pickle protocol 2+ (paddle.save, legacy torch.save)
        raise LegacyCheckpointError(legacy_message(path))
    if head != b"PK\x03\x04":
        raise _bad(path, "not a harness checkpoint file")
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _bad(path, f"not a readable zip: {exc}") from None
    if f"{SKELETON}.npy" not in names:
        if any(n.endswith(".pkl") for n in names):  # torch.save's zip: archive/data.pkl
            raise LegacyCheckpointError(legacy_message(path))
        raise _bad(path, f"no {SKELETON} member")


def is_state_file(path: Path | str) -> bool:
    """Whether ``path`` is a file of this format (by its members; nothing is decoded)."""
    try:
        check_file(Path(path))
    except CheckpointError:
        return False
    return True


@dataclass
class _Reader:
    path: Path
    npz: Any
    codec: TensorCodec | None

    def array(self, name: Any) -> np.ndarray:
        if not isinstance(name, str) or name == SKELETON or name not in self.npz.files:
            raise _bad(self.path, f"the skeleton names a missing array {name!r}")
        value: np.ndarray = self.npz[name]
        return value

    def node(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not (isinstance(node, dict) and node and next(iter(node)) in _TAGS):
            raise _bad(self.path, f"unknown skeleton node {str(node)[:60]!r}")
        tag, body = next(iter(node.items()))
        if tag == "m" and isinstance(body, dict):
            return {k: self.node(v) for k, v in body.items()}
        if tag == "d" and isinstance(body, list) and all(_is_pair(p) for p in body):
            return {_hashable(self.node(k), self): self.node(v) for k, v in body}
        if tag in "lt" and isinstance(body, list):
            items = [self.node(v) for v in body]
            return items if tag == "l" else tuple(items)
        if tag == "f" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "b":
            return self.array(body).tobytes()
        if tag == "a":
            return self.array(body)
        if tag == "n":
            return self.array(body)[()]
        if tag == "x" and isinstance(node.get("i"), dict) and self.codec is not None:
            return self.tensor(self.array(body), node["i"])
        raise _bad(self.path, f"malformed skeleton node {str(node)[:60]!r}")

    def tensor(self, array: np.ndarray, info: dict[str, Any]) -> Any:
        assert self.codec is not None
        try:
            return self.codec.decode(array, info)
        except CheckpointError as exc:
            raise _bad(self.path, str(exc)) from None
        except Exception as exc:  # whatever the framework raises on an array it cannot take
            raise _bad(
                self.path, f"a tensor cannot be rebuilt: {type(exc).__name__}: {exc}"
            ) from None


def _is_pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2


def _hashable(key: Any, reader: _Reader) -> Any:
    try:
        hash(key)
    except TypeError:
        raise _bad(reader.path, f"a dict key of type {type(key).__name__}") from None
    return key


_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    ValueError,  # numpy's header checks, object arrays refused, bad JSON
    KeyError,
    RecursionError,
    UnicodeDecodeError,
)


def load_state(path: Path | str, codec: TensorCodec | None = None) -> Any:
    """Read what :func:`save_state` wrote. Never unpickles; raises
    :class:`~harness.errors.CheckpointError` (or :class:`LegacyCheckpointError`) naming
    ``path`` for anything else."""
    path = Path(path)
    check_file(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            raw = npz[SKELETON]
            if raw.dtype != np.uint8 or raw.ndim != 1:
                raise _bad(path, "the skeleton is not a byte array")
            head = json.loads(raw.tobytes().decode("utf-8"))
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                raise _bad(path, f"format is not {FORMAT!r}")
            version = head.get("version")
            if not isinstance(version, int) or version > VERSION:
                raise CheckpointError(
                    f"Checkpoint file {path} has format version {version!r}; this harness reads "
                    f"up to {VERSION}. Upgrade harness to load it."
                )
            return _Reader(path, npz, codec).node(head.get("tree"))
    except CheckpointError:
        raise
    except _READ_ERRORS as exc:
        raise _bad(path, f"{type(exc).__name__}: {exc}") from None
