"""The ``jsonl`` tracker: ``metrics.jsonl`` in the run directory, one JSON object per record.

A tracker is any object with ``record(step, metrics)`` and ``close()``; the ``TrackerSpec``'s
``make`` (here the class itself) is called once per run as
``make(run_dir, config, start_step=N)``. The runner hands every tracker the same dict of
finite floats under namespaced keys (``charts/``, ``losses/``, ``perf/``, ``eval/``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class JsonlTracker:
    """Appends ``{"step": STEP, "charts/episodic_return": ..., ...}`` lines."""

    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if start_step > 0 and self.path.exists():
            # --resume from the checkpoint at start_step: the lines logged after it belong to
            # the interrupted tail, which the resumed run repeats
            lines = self.path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line and json.loads(line)["step"] <= start_step]
            self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()  # a crashed run keeps every row it logged

    def close(self) -> None:
        self._file.close()
