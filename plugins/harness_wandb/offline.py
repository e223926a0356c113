"""Read an offline W&B run back from its ``run-ID.wandb`` transaction log, without a server.

wandb >= 0.18 writes the log from its Go core and no longer ships a Python reader (the old
``wandb.sdk.internal.datastore``). The format is small and stable: a 7-byte header (``:W&B``,
magic ``0xBEE1`` little-endian, version 0), then LevelDB log blocks of 32 KiB. Each block holds
chunks with a 7-byte header (CRC-32/IEEE of the type byte and payload, 2-byte length, 1-byte type:
FULL, FIRST, MIDDLE, LAST); the chunks of one record concatenate to a serialized
``wandb.proto.wandb_internal_pb2.Record``, wandb's own protobuf message. Every chunk's checksum is
verified, so a format change fails loudly instead of returning wrong data.

    >>> history = read_history(Path("runs/r/wandb/offline-run-20250101_000000-abc123"))
    >>> history[0]["charts/episodic_return"]
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbLogError(ValueError):
    """The file is not a W&B transaction log, or it is corrupt."""


def _chunks(data: bytes, path: Path) -> Iterator[tuple[int, bytes]]:
    pos = len(HEADER)
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # block trailer padding
            pos += left_in_block
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if crc == 0 and length == 0 and kind == 0:  # zero padding (preallocated tail)
            pos += left_in_block
            continue
        start = pos + CHUNK_HEADER
        payload = data[start : start + length]
        if len(payload) < length:
            return  # a record cut short by a crash: the rest of the log is unreadable
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise WandbLogError(f"{path}: checksum mismatch at byte {pos}")
        yield kind, payload
        pos = start + length


def read_records(path: Path) -> Iterator[Any]:
    """Every ``wandb_internal_pb2.Record`` in a ``.wandb`` file, in write order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise WandbLogError(f"{path} is not a W&B transaction log (bad header)")
    parts: list[bytes] = []
    for kind, payload in _chunks(data, Path(path)):
        if kind == FULL:
            parts = [payload]
        elif kind == FIRST:
            parts = [payload]
            continue
        elif kind == MIDDLE:
            parts.append(payload)
            continue
        elif kind == LAST:
            parts.append(payload)
        else:
            raise WandbLogError(f"{path}: unknown chunk type {kind}")
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated, no stubs
        record.ParseFromString(b"".join(parts))
        yield record
        parts = []


def log_file(run_dir: Path) -> Path:
    """The ``run-ID.wandb`` file of one ``offline-run-*`` (or ``run-*``) directory."""
    found = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(found) != 1:
        raise WandbLogError(f"expected one run-*.wandb file in {run_dir}, found {len(found)}")
    return found[0]


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The rows given to ``wandb.log``, in order, with JSON-decoded values (wandb adds
    ``_step``, ``_runtime`` and ``_timestamp`` to each)."""
    rows = []
    for record in read_records(log_file(run_dir)):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """The run record: id, project, group, config (decoded) and the names of logged files,
    media and artifacts; enough to check what an offline run will upload on ``wandb sync``."""
    info: dict[str, Any] = {"config": {}, "files": [], "artifacts": []}
    for record in read_records(log_file(run_dir)):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info.update(
                id=record.run.run_id, project=record.run.project, group=record.run.run_group
            )
            for item in record.run.config.update:
                info["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                info["config"][item.key] = json.loads(item.value_json)
        elif kind == "files":
            info["files"].extend(f.path for f in record.files.files)
        elif kind == "artifact":
            info["artifacts"].append({"name": record.artifact.name, "type": record.artifact.type})
    return info
