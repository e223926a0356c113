"""``ZmqOptions``: what ``connect(address, **options)`` of the zmq transport accepts.

One field per keyword of :func:`harness_zmq.client.connect` (and so of
``harness.connect(address, **options)``), each documented once, here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness_zmq.security import Keys

__all__ = ["LOCAL_ACTOR_NICE", "LOCAL_IPC", "ZmqOptions"]

LOCAL_ACTOR_NICE = 0
"""Default niceness added to the actors of an embedded local farm (``connect(actor_nice=)``).
0: a niced actor answers a blocking call ~10% slower (measured by tools/bench_remote.py), and
on the 256-actor farm benchmark nice 0, 10 and 19 were within noise of each other."""
LOCAL_IPC = False
"""Whether an embedded local farm's actors listen on Unix-domain sockets (``ipc://`` in each
actor's private 0700 directory) rather than loopback TCP (``connect(local_ipc=)``). Measured
by tools/bench_remote.py on the 2-core machine: a tiny call ~10% quicker over IPC, but a 1 MiB
argument ~60% slower (loopback TCP moves big messages in 64 KiB segments), hence TCP."""


@dataclass(frozen=True)
class ZmqOptions:
    """The options of a zmq connection (``connect(address, **options)``)."""

    keys: Keys | str | os.PathLike[str] | None = None
    """The cluster's CURVE key directory (or loaded :class:`~harness_zmq.security.Keys`).
    None: for a cluster, the keys this host recorded for its address (a ``harness cluster
    start`` here); for a local farm, fresh keys made in memory for it alone."""
    cpus: float | None = None
    """The local farm's size for placement accounting (default: this machine's cores; asking
    for more only logs a warning)."""
    heartbeat_s: float = 1.0
    """The client's heartbeat to the master."""
    connect_timeout_s: float = 5.0
    """How long to wait for the master's welcome."""
    start_timeout_s: float = 60.0
    """How long an actor may take to start and construct its object."""
    place_timeout_s: float = 300.0
    """How long the master may take to place an actor."""
    name: str | None = None
    """This client's name at the master (default: ``HOST:PID``)."""
    preload: Sequence[str] = ()
    """Modules the local farm's zygote imports before forking actors, so they share them (e.g.
    ``torch``; a cluster's workers read ``HARNESS_ACTOR_PRELOAD`` instead)."""
    actor_nice: int = LOCAL_ACTOR_NICE
    """Niceness added to the local farm's actors (a lower CPU priority than the caller's, for a
    learner sharing an oversubscribed machine with its actors)."""
    local_ipc: bool = LOCAL_IPC
    """The local farm's actors listen on Unix-domain sockets in their private directories
    instead of loopback TCP (see ``LOCAL_IPC`` for the trade-off)."""

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ZmqOptions:
        """The options from ``connect``'s keywords; an unknown one is a TypeError that lists
        the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in options:
            if key not in known:
                raise TypeError(
                    f"connect() got an unexpected keyword argument {key!r} (the zmq transport "
                    f"takes {', '.join(sorted(known))})"
                )
        return cls(**options)
