"""Completing futures nobody reads: the client's receiver thread (:class:`Receiver`), and
``harness.remote.completions`` for zmq futures, read in the calling thread
(:class:`ZmqCompletions`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import threading
import time
from concurrent.futures import Future
from typing import Any

from harness.remote import Completions
from harness_zmq.handle import DONE_STATES, ZmqActor
from harness_zmq.wakeup import WakePipe

log = logging.getLogger(__name__)

__all__ = ["SCAN_S", "SWEEP_S", "Receiver", "ZmqCompletions"]

SCAN_S = 0.02
"""``ZmqCompletions`` looks at all its futures at least this often (those done without an edge)."""
SWEEP_S = 0.1
"""How often the receiver thread looks at every watched socket even without a wake-up."""
_DONE = DONE_STATES


class ZmqCompletions(Completions):
    """``harness.remote.Completions`` that reads the actors' sockets in the calling thread.

    An epoll set holds the ``ZMQ_FD`` of every actor with futures here; ``next`` reads the
    sockets that signal (and those sent on since they were last read to the end: the
    descriptor is edge-triggered and a send may consume an edge) and hands back the futures
    at the head of each actor's queue that are done. O(1) per finished call, no thread
    hand-off: a learner can take rollouts from hundreds of actors in arrival order. A future
    can also finish without an edge here (read by a blocking call or the receiver thread's
    sweep, failed by the thread that watches actor processes): every ``SCAN_S`` all queue
    heads are looked at. Futures of other transports go through the generic version."""

    def __init__(self) -> None:
        super().__init__()
        self._epoll = select.epoll()
        self._fds: dict[int, ZmqActor] = {}
        self._waiting: dict[ZmqActor, collections.deque[tuple[Future[Any], Any]]] = {}
        self._dirty: set[ZmqActor] = set()
        self._done: collections.deque[tuple[Future[Any], Any]] = collections.deque()
        self._others = 0  # futures added through the generic version
        self._scanned = time.monotonic()

    def add(self, future: Future[Any], tag: Any) -> None:
        actor = getattr(future, "_actor", None)
        if not isinstance(actor, ZmqActor):
            self._others += 1
            super().add(future, tag)
            return
        waiting = self._waiting.get(actor)
        if waiting is None:
            waiting = self._waiting[actor] = collections.deque()
            if self._fds.get(actor.fd) is not actor:  # new, or a closed one's number reused
                with contextlib.suppress(OSError):
                    self._epoll.unregister(actor.fd)
                self._epoll.register(actor.fd, select.EPOLLIN)
                self._fds[actor.fd] = actor
        waiting.append((future, tag))
        actor._collected += 1
        if actor._unread:
            self._dirty.add(actor)

    def _take(self, actor: ZmqActor) -> None:
        waiting = self._waiting.get(actor)
        if waiting is None:
            return
        while waiting and waiting[0][0]._state in _DONE:  # (done() without its lock)
            self._done.append(waiting.popleft())
            actor._collected -= 1
        if not waiting:
            del self._waiting[actor]

    def next(self, timeout: float | None = None) -> tuple[Future[Any], Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._done:
                return self._done.popleft()
            if self._others:
                with contextlib.suppress(TimeoutError):
                    found = super().next(0)
                    self._others -= 1
                    return found
            for actor in self._dirty:
                actor._read_waiting()
                self._take(actor)
            self._dirty.clear()
            now = time.monotonic()
            if now - self._scanned >= SCAN_S:
                self._scanned = now
                for actor in list(self._waiting):
                    self._take(actor)
            if self._done:
                continue
            wait = SCAN_S
            if deadline is not None:
                if now >= deadline:
                    raise TimeoutError(f"no future finished within {timeout} s")
                wait = min(wait, deadline - now)
            try:
                events = self._epoll.poll(wait)
            except InterruptedError:
                events = []
            for fd, _ in events:
                owner = self._fds.get(fd)
                if owner is None:
                    with contextlib.suppress(OSError):
                        self._epoll.unregister(fd)
                    continue
                owner._read_waiting()
                self._take(owner)
                if owner not in self._waiting and (owner._closed or owner._dead is not None):
                    self._fds.pop(fd, None)  # gone: stop watching it
                    with contextlib.suppress(OSError):
                        self._epoll.unregister(fd)

    def close(self) -> None:
        for actor, waiting in self._waiting.items():
            actor._collected -= len(waiting)
        self._waiting.clear()
        self._epoll.close()


class Receiver:
    """Completes futures that nobody reads: reads the sockets of actors whose futures someone
    waits for without reading (``concurrent.futures.wait``, ``as_completed``, callbacks), and
    every ``SWEEP_S`` those of all actors with futures outstanding.

    A thread that sends a future does not read replies (so a loop sending futures does not
    fight this thread for the GIL), and a thread in ``result()`` reads the socket itself; only
    waiting without reading *wants* this thread. A sender marks the actor *dirty*: ZeroMQ's
    ``ZMQ_FD`` is edge-triggered and a send may consume the edge of a reply that already
    arrived, so a dirty socket is read here once nobody has sent on it for ``BACKOFF_S`` (and
    at least every ``MAX_DEFER_S``); a clean one is read when its descriptor signals. Whoever
    reads a socket to the end under its lock makes it clean again."""

    BACKOFF_S = 0.0005
    MAX_DEFER_S = 0.002

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: set[ZmqActor] = set()  # actors with futures outstanding
        self._dirty: dict[ZmqActor, float] = {}  # actor -> when it became dirty
        self._changed = False
        self._wake_at = float("inf")  # when the thread wakes by itself
        self._thread: threading.Thread | None = None
        self._stop = False
        self._wakeup = WakePipe()

    def touched(self, actor: ZmqActor) -> None:
        """A future was sent to ``actor`` (its socket lock is held)."""
        now = time.monotonic()
        actor._touched = now
        with self._lock:
            if self._stop:
                return
            if actor not in self._dirty:
                self._dirty[actor] = now
                self._watched.add(actor)
                self._changed = True
            # wanted: soon; else within a sweep (the thread may sleep for good when idle)
            wake = self._sleeps_past(now, None if actor._wanted else SWEEP_S)
        if wake:
            self._wake()

    def cleaned(self, actor: ZmqActor) -> None:
        """``actor``'s socket was read to the end (its lock is held)."""
        now = time.monotonic()
        with self._lock:
            if self._stop:
                return
            changed = self._dirty.pop(actor, None) is not None
            if not actor._pending:
                actor._wanted = False
                if actor in self._watched:
                    self._watched.discard(actor)
                    changed = True
            elif actor not in self._watched:
                self._watched.add(actor)
                changed = True
            if not changed:
                return
            self._changed = True
            # it must poll this socket now (wanted) or at least sweep it
            wake = self._sleeps_past(now, None if actor._wanted else SWEEP_S)
        if wake:
            self._wake()

    def idle(self, actor: ZmqActor) -> None:
        """``actor`` has no futures left but the one its reader just got (lock held)."""
        with self._lock:
            actor._wanted = False
            if actor in self._watched:
                self._watched.discard(actor)
                self._dirty.pop(actor, None)
                self._changed = True

    def wanted(self, actor: ZmqActor) -> None:
        """Someone waits on a future of ``actor`` without reading its socket."""
        now = time.monotonic()
        with self._lock:
            if self._stop or actor._wanted:
                return
            actor._wanted = True
            # whoever waits has most likely stopped sending: read a dirty socket now
            actor._touched = 0.0
            self._changed = True
            wake = self._sleeps_past(now)
        if wake:
            self._wake()

    def _sleeps_past(self, now: float, horizon: float | None = None) -> bool:
        """Whether the thread sleeps longer than ``horizon`` (MAX_DEFER_S), so that it must be
        woken (lock held; marks it woken). Starts the thread."""
        self._start()
        if self._wake_at > now + (self.MAX_DEFER_S if horizon is None else horizon):
            self._wake_at = now
            return True
        return False

    def _wake(self) -> None:
        self._wakeup.wake()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="harness-zmq-receiver", daemon=True
            )
            self._thread.start()

    def unwatch(self, actor: ZmqActor) -> None:
        with self._lock:
            if actor in self._watched:
                self._watched.discard(actor)
                self._dirty.pop(actor, None)
                self._changed = True

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wakeup.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._wakeup.close()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # a bug: say so, and let the next future start a new thread
            log.exception("the harness receiver thread failed")
            with self._lock:
                self._thread = None
                self._wake_at = float("inf")
                self._changed = True

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._wakeup.fd, select.POLLIN)
        registered: dict[int, ZmqActor] = {}
        dirty: dict[ZmqActor, float] = {}
        last_sweep = time.monotonic()
        while True:
            with self._lock:
                if self._stop:
                    return
                if self._changed:
                    self._changed = False
                    dirty = {a: t for a, t in self._dirty.items() if a._wanted}
                    wanted = {
                        a.fd: a
                        for a in self._watched
                        if a._wanted and a not in self._dirty and not a._closed
                    }
                    for fd in set(registered) - set(wanted):
                        with contextlib.suppress(KeyError, ValueError):
                            poller.unregister(fd)
                    for fd in set(wanted) - set(registered):
                        poller.register(fd, select.POLLIN)
                    registered = wanted
            now = time.monotonic()
            due: list[ZmqActor] = []
            wake = now + SWEEP_S
            for actor, since in dirty.items():
                ready_at = min(actor._touched + self.BACKOFF_S, since + self.MAX_DEFER_S)
                if ready_at <= now:
                    due.append(actor)
                else:
                    wake = min(wake, ready_at)
            if now - last_sweep >= SWEEP_S:  # futures nobody waits on, and a safety net
                last_sweep = now
                with self._lock:
                    everyone = list(self._watched)
                # (a Completions reads its actors itself: no safety net needed there)
                due.extend(a for a in everyone if not a._collected and a not in due)
            for actor in due:
                self._service(actor)
            if due:
                continue  # the sets changed: recompute before sleeping
            with self._lock:
                if self._changed:
                    continue
                if not self._watched and not dirty:
                    wake = float("inf")  # nothing to do until someone wakes us
                self._wake_at = wake
            timeout = None if wake == float("inf") else max(0, int((wake - now) * 1000 + 0.999))
            try:
                events = poller.poll(timeout)
            except InterruptedError:
                events = []
            with self._lock:
                self._wake_at = 0.0
            for fd, _ in events:
                if fd == self._wakeup.fd:
                    self._wakeup.drain()
                    continue
                found = registered.get(fd)
                if found is not None:
                    self._service(found)

    def _service(self, actor: ZmqActor) -> None:
        """Read the actor's waiting replies (or leave it dirty when another thread holds its
        socket: the holder either reads them or marks it dirty again)."""
        # a sender holds the lock for a moment: wait for it (it then waits for us); a
        # blocking call may hold it for long: then look again after a back-off
        if not actor._lock.acquire(timeout=self.BACKOFF_S):
            now = time.monotonic()
            actor._touched = now
            with self._lock:
                if actor in self._watched:
                    self._dirty[actor] = now
                    self._changed = True
            return
        received: list[tuple[dict[str, Any], list[Any]]] = []
        try:
            if not actor._closed:
                actor._drain(received)
            with self._lock:  # clean now: drop the mark while the socket is still ours
                if self._dirty.pop(actor, None) is not None:
                    self._changed = True
        finally:
            actor._lock.release()
        if received:
            actor._settle(received)
        with self._lock:
            if not actor._pending or actor._dead is not None or actor._closed:
                actor._wanted = False
                if actor in self._watched:
                    self._watched.discard(actor)
                    self._dirty.pop(actor, None)
                    self._changed = True
