"""The self-pipe that wakes a poll loop (the client's receiver, the local farm's monitor, the
link to a master, a cluster worker).

A file descriptor is only a number: once closed, the next ``socket()``, ``open()`` or
``eventfd()`` in the process may get the same one. A wake-up written after ``close`` then
lands in a file being written or a ZeroMQ connection's stream, a drain reads someone else's
bytes, and a second close closes someone else's descriptor (libzmq aborts with
``Assertion failed: pfd.revents & POLLIN`` when that is one of its signalers). A
:class:`WakePipe` never touches its descriptors after :meth:`close`, whichever thread calls
what, and :meth:`close` runs once."""

from __future__ import annotations

import contextlib
import os
import threading


class WakePipe:
    """A non-blocking pipe: register :attr:`fd` in a poller, :meth:`wake` it from any thread,
    :meth:`drain` it in the loop when it is readable."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        # reentrant: a signal handler may wake the loop of the thread it interrupted
        self._lock = threading.RLock()
        self._closed = False

    @property
    def fd(self) -> int:
        """The read end (for a poller). After :meth:`close` the number may be another file's:
        a poller still holding it only sees spurious readiness, which :meth:`drain` ignores."""
        return self._r

    @property
    def closed(self) -> bool:
        return self._closed

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):  # full: it is awake already
                    os.write(self._w, b"\0")

    def drain(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):  # empty
                    while os.read(self._r, 4096):
                        pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._r, self._w):
                with contextlib.suppress(OSError):
                    os.close(fd)
