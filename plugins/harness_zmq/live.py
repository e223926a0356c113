"""What the monitor's live view shows, kept by the master: the actors' recent output and the
runs' recent metrics, both bounded.

- **Actor output.** Workers push what their actors wrote with each heartbeat
  (``[actor_id, start, end, text]``, byte offsets into the actor's output; see
  :meth:`harness_zmq.capture.ActorLogs.updates`). :class:`LiveStore` keeps the newest
  ``log_chars`` characters per actor as chunks with those offsets, so the page can follow one
  actor by asking for what came after the offset it has (``since``); a jump in offsets (a
  chatty actor's output the worker did not send) becomes a ``[... N bytes not shown ...]``
  line. The output of at most ``keep_ended`` ended actors is kept.
- **Runs.** A client whose heartbeat metrics carry ``step`` (the actor farm's learner sends
  ``step``, ``steps_per_s``, ``episode_return`` and ``score`` each iteration) gets a point per
  new step, the newest ``points`` of them per run; ``keep_ended`` bounds the runs kept after
  their client left too.

So the master's memory is bounded by (running actors + ``keep_ended``) x ``log_chars`` plus
(clients + ``keep_ended``) x ``points`` x a few numbers, whatever peers send: 16 KiB x (256 +
64) actors is ~5 MiB.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOG_CHARS", "POINTS", "RUN_SERIES", "LiveStore"]

LOG_CHARS = 16 * 1024
"""The newest output kept per actor on the master (the worker keeps 64 KiB)."""
POINTS = 300
"""Points kept per run (one per heartbeat with a new step: 5 minutes at 1 s)."""
KEEP_ENDED = 64
"""Ended actors (and ended runs) whose data is still kept."""
RUN_SERIES = ("steps_per_s", "episode_return", "score")
"""The numbers of a run's heartbeat metrics the live view charts."""
TAIL_LINES = 5
"""Lines per actor in the list of all actors' tails."""


@dataclass(eq=False)
class _ActorLog:
    worker_id: str
    chunks: collections.deque[tuple[int, int, str]] = field(default_factory=collections.deque)
    chars: int = 0
    end: int = 0  # byte offset of the end of what arrived
    ended: bool = False
    updated: float = 0.0

    def add(self, start: int, end: int, text: str, limit: int) -> None:
        if end <= self.end:  # a repeat (or older): nothing new
            return
        if start > self.end:
            gap = f"[... {start - self.end} bytes not shown ...]\n"
            self.chunks.append((self.end, start, gap))
            self.chars += len(gap)
        self.chunks.append((start, end, text))
        self.chars += len(text)
        self.end = end
        while self.chars > limit and len(self.chunks) > 1:
            self.chars -= len(self.chunks.popleft()[2])
        if self.chars > limit:  # one chunk bigger than the limit: keep its end
            s, e, t = self.chunks.popleft()
            self.chunks.append((s, e, t[-limit:]))
            self.chars = limit
        self.updated = time.time()

    def text_since(self, since: int) -> tuple[int, str]:
        kept = [c for c in self.chunks if c[1] > since]
        return (kept[0][0] if kept else self.end), "".join(c[2] for c in kept)


@dataclass(eq=False)
class _Run:
    name: str
    host: str
    points: collections.deque[dict[str, float | None]]
    ended: bool = False
    last_step: float | None = None


class LiveStore:
    """The master's bounded store for the live view (thread-safe: the monitor's HTTP threads
    read it while the master's loop writes it)."""

    def __init__(
        self, log_chars: int = LOG_CHARS, points: int = POINTS, keep_ended: int = KEEP_ENDED
    ) -> None:
        self.log_chars = int(log_chars)
        self.points = int(points)
        self.keep_ended = int(keep_ended)
        self._lock = threading.Lock()
        self._logs: dict[str, _ActorLog] = {}
        self._ended_logs: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._runs: dict[str, _Run] = {}
        self._ended_runs: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._started = time.monotonic()

    # -- actors' output ---------------------------------------------------------------------

    def add_output(self, actor_id: str, worker_id: str, start: int, end: int, text: str) -> bool:
        """One chunk a worker pushed for one of its actors; False (dropped) when the actor is
        known to run on another worker."""
        with self._lock:
            entry = self._logs.get(actor_id)
            if entry is None:
                if actor_id in self._ended_logs:  # ended and already dropped again
                    return False
                entry = self._logs[actor_id] = _ActorLog(worker_id)
            elif entry.worker_id != worker_id:
                return False
            entry.add(start, end, text, self.log_chars)
            return True

    def actor_ended(self, actor_id: str, worker_id: str) -> None:
        """The actor's process is gone: its output stays among the ``keep_ended`` newest."""
        with self._lock:
            entry = self._logs.get(actor_id)
            if entry is None:
                entry = self._logs[actor_id] = _ActorLog(worker_id)
            entry.ended = True
            self._ended_logs[actor_id] = None
            self._ended_logs.move_to_end(actor_id)
            while len(self._ended_logs) > self.keep_ended:
                gone, _ = self._ended_logs.popitem(last=False)
                self._logs.pop(gone, None)

    def owner(self, actor_id: str) -> str | None:
        """The worker an actor's output came from (None when none is kept)."""
        with self._lock:
            entry = self._logs.get(actor_id)
            return entry.worker_id if entry is not None else None

    def tails(self, lines: int = TAIL_LINES) -> list[dict[str, Any]]:
        """Every actor with output: its last ``lines`` lines (the list on the page)."""
        with self._lock:
            out = []
            for actor_id, entry in self._logs.items():
                if not entry.chunks:
                    continue
                text = "".join(c[2] for c in list(entry.chunks)[-lines:])
                out.append(
                    {
                        "actor_id": actor_id,
                        "worker_id": entry.worker_id,
                        "ended": entry.ended,
                        "end": entry.end,
                        "updated": entry.updated,
                        "lines": text.splitlines()[-lines:],
                    }
                )
        return out

    def output(self, actor_id: str, since: int = 0) -> dict[str, Any] | None:
        """What the master holds of one actor's output after byte offset ``since`` (None for
        an actor it knows nothing of): ``{"actor_id", "worker_id", "start", "end", "text",
        "ended"}``; the page follows an actor by passing the ``end`` it got as ``since``."""
        with self._lock:
            entry = self._logs.get(actor_id)
            if entry is None:
                return None
            start, text = entry.text_since(since)
            return {
                "actor_id": actor_id,
                "worker_id": entry.worker_id,
                "start": start,
                "end": entry.end,
                "text": text,
                "ended": entry.ended,
            }

    # -- runs -------------------------------------------------------------------------------

    def add_metrics(self, client_id: str, name: str, host: str, metrics: dict[str, Any]) -> None:
        """A client's heartbeat metrics: a point when they carry a new ``step``."""
        step = metrics.get("step")
        if not isinstance(step, int | float) or isinstance(step, bool):
            return
        with self._lock:
            run = self._runs.get(client_id)
            if run is None:
                run = self._runs[client_id] = _Run(
                    name, host, collections.deque(maxlen=self.points)
                )
            if run.last_step == step:
                return
            run.last_step = step
            point: dict[str, float | None] = {
                "t": round(time.monotonic() - self._started, 3),
                "step": float(step),
            }
            for key in RUN_SERIES:
                value = metrics.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    point[key] = float(value) if math.isfinite(value) else None
                else:
                    point[key] = None
            run.points.append(point)

    def run_ended(self, client_id: str) -> None:
        with self._lock:
            run = self._runs.get(client_id)
            if run is None:
                return
            run.ended = True
            self._ended_runs[client_id] = None
            while len(self._ended_runs) > self.keep_ended:
                gone, _ = self._ended_runs.popitem(last=False)
                self._runs.pop(gone, None)

    def runs(self) -> list[dict[str, Any]]:
        """Every run with points: ``{"id", "name", "host", "ended", "points": [...]}``."""
        with self._lock:
            return [
                {
                    "id": client_id,
                    "name": run.name,
                    "host": run.host,
                    "ended": run.ended,
                    "points": list(run.points),
                }
                for client_id, run in self._runs.items()
            ]

    def sizes(self) -> dict[str, int]:
        """Counts that the memory bound is about (for tests and benchmarks)."""
        with self._lock:
            return {
                "actors": len(self._logs),
                "chars": sum(e.chars for e in self._logs.values()),
                "runs": len(self._runs),
                "points": sum(len(r.points) for r in self._runs.values()),
            }
