"""Built-in plugin: what the core itself registers (the CSV tracker). Built-ins are plugins too,
registered the same way, and can be blocked with ``-p no:builtin``."""

from __future__ import annotations

from harness.hookspecs import hookimpl
from harness.registry import TrackerSpec
from harness.tracking import CSVTracker


@hookimpl
def harness_register_trackers() -> list[TrackerSpec]:
    return [TrackerSpec("csv", make=CSVTracker, default=True, description="metrics.csv")]
