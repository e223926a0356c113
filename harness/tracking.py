"""Metrics routing: one ``record(step, metrics)`` call fans out to every tracker plugin.

Keys are namespaced CleanRL-style: ``charts/`` (returns, lengths), ``losses/``, ``perf/``
(steps/s), ``eval/``. A tracker that raises is reported once and disabled; training goes on.
A tracker whose ``close()`` raises at the end of the run is reported by name.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

log = logging.getLogger(__name__)


class Tracker(Protocol):
    """What a tracker plugin's factory returns."""

    def record(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class CSVTracker:
    """``metrics.csv`` in the run directory; new keys widen the header (the file is rewritten
    only when a new key appears, which happens a handful of times per run)."""

    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        self.path = run_dir / "metrics.csv"
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, float]] = []
        self._fh: TextIO | None = None
        if self.path.exists():  # resumed run: keep the history
            with open(self.path, newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                self.columns = list(reader.fieldnames or ["step"])
                rows = [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in reader]
            # rows past the checkpoint we resume from were logged by the crashed tail: drop them
            self.rows = [r for r in rows if r.get("step", 0.0) <= start_step]

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": float(step), **{k: float(v) for k, v in metrics.items()}}
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new or self._fh is None:
            self.columns.extend(new)
            self._rewrite()
        else:
            csv.DictWriter(self._fh, self.columns).writerow(row)
            self._fh.flush()

    def _rewrite(self) -> None:
        if self._fh is not None:
            self._fh.close()
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, self.columns)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)
        self._fh = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class MetricsRouter:
    """Fans metrics out to trackers; isolates failures."""

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        self.trackers = dict(trackers)

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        for name in list(self.trackers):
            try:
                self.trackers[name].record(step, clean)
            except Exception:
                log.exception("tracker %r failed and is disabled for the rest of the run", name)
                self._drop(name)

    def _drop(self, name: str) -> None:
        tracker = self.trackers.pop(name)
        try:
            tracker.close()
        except Exception:
            log.debug("closing failed tracker %r raised too", name, exc_info=True)

    def close(self) -> None:
        """Close every tracker; one whose ``close()`` raises is reported by name (its last
        rows may not have been written) and the others are closed all the same."""
        for name in list(self.trackers):
            tracker = self.trackers.pop(name)
            try:
                tracker.close()
            except Exception as exc:
                log.warning(
                    "tracker %r failed to close (its last metrics may be missing): %s: %s",
                    name,
                    type(exc).__name__,
                    exc,
                )
