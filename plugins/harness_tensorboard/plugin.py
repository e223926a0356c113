"""Registers the ``tensorboard`` tracker: event files under ``RUN_DIR/tensorboard``.

Uses the ``tensorboard`` package's own event writer (no torch, no TensorFlow needed). When the
package is missing, the tracker is reported unavailable and the run goes on without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import hookimpl
from harness.errors import PluginError
from harness.registry import TrackerSpec


class TensorBoardTracker:
    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise PluginError(
                f"the tensorboard tracker needs the tensorboard package ({exc}); "
                f"pip install 'harness[tensorboard]'"
            ) from None
        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(str(run_dir / "tensorboard"))
        if start_step:  # resumed: hide events logged after the checkpoint (TensorBoard purge)
            from tensorboard.compat.proto.event_pb2 import SessionLog

            self.writer.add_event(
                Event(step=start_step, session_log=SessionLog(status=SessionLog.START))
            )

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        import time

        self.writer.add_event(
            self._event(wall_time=time.time(), step=step, summary=self._summary(value=values))
        )

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
