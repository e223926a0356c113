"""The tensorboard tracker's own event-file writer against tensorboard's reader."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (
    masked_crc32c as reference_crc,
)

from harness_tensorboard.plugin import TensorBoardTracker, masked_crc32c


def test_masked_crc32c_matches_tensorboard() -> None:
    rng = random.Random(3)
    for size in (0, 1, 7, 8, 9, 255, 256, 4097):
        data = bytes(rng.randrange(256) for _ in range(size))
        assert masked_crc32c(data) == reference_crc(data), size


def test_event_files_read_back_in_tensorboard(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path)
    for step in range(0, 5000, 1000):
        tracker.record(step, {"charts/episodic_return": step / 10, "losses/td_loss": 0.5})
    tracker.close()
    (event_file,) = (tmp_path / "tensorboard").iterdir()
    assert (
        event_file.name.startswith("events.out.tfevents.") and str(os.getpid()) in event_file.name
    )
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"charts/episodic_return", "losses/td_loss"}
    returns = acc.Scalars("charts/episodic_return")
    assert [e.step for e in returns] == [0, 1000, 2000, 3000, 4000]
    assert [e.value for e in returns] == [0.0, 100.0, 200.0, 300.0, 400.0]
    # a corrupted record is noticed by tensorboard's reader: the CRCs are really checked
    data = bytearray(event_file.read_bytes())
    data[-6] ^= 0xFF
    event_file.write_bytes(bytes(data))
    broken = EventAccumulator(str(tmp_path / "tensorboard"))
    broken.Reload()
    assert [e.step for e in broken.Scalars("charts/episodic_return")] == [0, 1000, 2000, 3000]


def test_a_resumed_run_purges_later_events(tmp_path: Path) -> None:
    first = TensorBoardTracker(tmp_path)
    for step in (1000, 2000, 3000):
        first.record(step, {"charts/episodic_return": float(step)})
    first.close()
    resumed = TensorBoardTracker(tmp_path, start_step=2000)  # checkpoint at 2000
    resumed.record(3000, {"charts/episodic_return": 42.0})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    values = [(e.step, e.value) for e in acc.Scalars("charts/episodic_return")]
    assert values == [(1000, 1000.0), (3000, 42.0)]
