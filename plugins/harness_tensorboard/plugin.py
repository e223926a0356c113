"""Registers the ``tensorboard`` tracker: event files under ``RUN_DIR/tensorboard``.

Writes the event files itself (TFRecord framing of the ``tensorboard`` package's ``Event``
protobufs; no torch, no TensorFlow, not even ``tensorboard.summary`` is imported). When the
package is missing, the tracker is reported unavailable and the run goes on without it.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import hookimpl
from harness.errors import MissingExtraError
from harness.registry import TrackerSpec


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # CRC-32C (Castagnoli)
        table.append(crc)
    return table


_CRC = _crc_table()


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C of TFRecord framing (what TensorBoard checks on every record)."""
    crc = 0xFFFFFFFF
    table = _CRC
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventFile:
    """A TensorBoard event file written in place: TFRecord framing (length, masked CRC of the
    length, the serialised ``Event``, masked CRC of the data), flushed after every record.
    tensorboard's own ``EventFileWriter`` imports the ``tensorboard.summary`` package
    (~0.2-0.3 s per process here) and adds a writer thread for a few dozen rows per run."""

    _uid = 0

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        EventFile._uid += 1
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{EventFile._uid}"
        )
        self.path = directory / name
        self._file = self.path.open("ab")

    def write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(
            header
            + struct.pack("<I", masked_crc32c(header))
            + data
            + struct.pack("<I", masked_crc32c(data))
        )
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardTracker:
    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.compat.proto.summary_pb2 import Summary
        except ImportError:
            raise MissingExtraError(
                "tensorboard", "tensorboard", "the tensorboard tracker"
            ) from None
        self._event, self._summary = Event, Summary
        self.writer = EventFile(Path(run_dir) / "tensorboard")
        self.writer.write(
            Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
        )
        if start_step:  # resumed: hide events logged after the checkpoint (TensorBoard purge)
            start = Event(step=start_step, session_log=SessionLog(status=SessionLog.START))
            self.writer.write(start.SerializeToString())

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        event = self._event(wall_time=time.time(), step=step, summary=self._summary(value=values))
        self.writer.write(event.SerializeToString())

    def close(self) -> None:
        self.writer.close()


@hookimpl
def harness_register_trackers() -> list[TrackerSpec]:
    return [
        TrackerSpec(
            "tensorboard",
            make=TensorBoardTracker,
            default=True,
            description="TensorBoard event files in RUN_DIR/tensorboard",
        )
    ]
