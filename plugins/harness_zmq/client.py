"""The ZeroMQ client: ``connect(address, **options)`` -> :class:`ZmqClient`.

``address=None`` starts an embedded local farm (:mod:`harness_zmq.farm`): the client owns an
:class:`~harness_zmq.launcher.ActorLauncher` on 127.0.0.1 and watches its actors' sentinels.
``address="tcp://HOST:PORT"`` joins a cluster (:mod:`harness_zmq.masterlink`): the master
places actors on its workers (``place``/``placed``), hears this client's heartbeats and reports
dead actors (``actor_died``). Either way the client then talks to each actor directly, over one
DEALER socket per actor (:mod:`harness_zmq.handle`); futures nobody reads are completed by the
receiver thread (:mod:`harness_zmq.receiver`). Local code reaches the actors as described in
:mod:`harness_zmq.shipping`. The options are :class:`~harness_zmq.options.ZmqOptions`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import resource
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import zmq

from harness.errors import HarnessError
from harness.remote import ActorOptions, Completions
from harness_zmq.clusters import cluster_keys
from harness_zmq.farm import LocalFarm
from harness_zmq.farm import local_gpus as _local_gpus
from harness_zmq.handle import POLL_MS, ZmqActor
from harness_zmq.masterlink import MasterLink
from harness_zmq.options import LOCAL_ACTOR_NICE, LOCAL_IPC, ZmqOptions
from harness_zmq.receiver import Receiver, ZmqCompletions
from harness_zmq.security import Guard, Keys, ephemeral_keys, load_keys
from harness_zmq.shipping import InitPayload, shipped_sources

# LOCAL_ACTOR_NICE, LOCAL_IPC, POLL_MS, shipped_sources and _local_gpus were defined here
# before the split by job: their old import path keeps working
__all__ = [
    "LOCAL_ACTOR_NICE",
    "LOCAL_IPC",
    "POLL_MS",
    "ZmqActor",
    "ZmqClient",
    "ZmqOptions",
    "_local_gpus",
    "connect",
    "shipped_sources",
]


def connect(address: str | None = None, **options: Any) -> ZmqClient:
    """A client of an embedded local farm (``address=None``) or of the cluster whose master
    listens at ``address`` (``tcp://HOST:PORT``). ``options`` are the fields of
    :class:`~harness_zmq.options.ZmqOptions` (``keys``, ``cpus``, ``heartbeat_s``,
    ``connect_timeout_s``, ``start_timeout_s``, ``place_timeout_s``, ``name``, ``preload``,
    ``actor_nice``, ``local_ipc``)."""
    return ZmqClient(address, ZmqOptions.of(options))


# ------------------------------------------------------------------------------------------
# the client


_LIVE: weakref.WeakSet[ZmqClient] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for client in list(_LIVE):
        with contextlib.suppress(Exception):
            client.close()


class ZmqClient:
    """A connection to a local farm or a cluster (implements ``harness.remote.Client``)."""

    def __init__(self, address: str | None, options: ZmqOptions | None = None) -> None:
        self._closed = True  # until constructed (close() and __del__ may run on a failure)
        options = options if options is not None else ZmqOptions()
        keys = options.keys
        if keys is not None and not isinstance(keys, Keys):
            keys = load_keys(os.fspath(keys))
        if keys is None:
            # a local farm's actors admit keys made for this client alone (in memory); a
            # cluster's are the ones its start recorded on this host
            keys = ephemeral_keys() if address is None else cluster_keys(address)
        self.address = address
        self.options = options
        self.keys: Keys = keys
        self.start_timeout_s = float(options.start_timeout_s)
        self.place_timeout_s = float(options.place_timeout_s)
        self.metrics: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._actors: dict[str, ZmqActor] = {}
        self._died: dict[str, str] = {}  # death notices that came before their handle
        self._ids = itertools.count(1)
        self._shipping: dict[str, tuple[dict[str, Any], list[str]]] = {}
        _raise_fd_limit()
        self.context: zmq.Context[Any] = zmq.Context(1)
        self.context.max_sockets = 1 << 16
        self.guard = Guard(self.context, keys)
        self._receiver = Receiver()
        self._farm: LocalFarm | None = None
        self._master: MasterLink | None = None
        self._closed = False
        try:
            if address is None:
                self._farm = LocalFarm(self, keys, options)
            else:
                self._master = MasterLink(self, address, options)
        except BaseException:
            self.close()
            raise
        _LIVE.add(self)

    def __repr__(self) -> str:
        where = self.address or "local farm"
        return f"<ZmqClient {where} actors={len(self._actors)}>"

    def __enter__(self) -> ZmqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @property
    def actors(self) -> list[ZmqActor]:
        with self._lock:
            return list(self._actors.values())

    @property
    def peer_id(self) -> str | None:
        """This client's id at the master (None for a local farm)."""
        return self._master.peer_id if self._master is not None else None

    def report_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Run metrics sent with the next heartbeats (shown by the cluster status)."""
        self.metrics = dict(metrics)

    def completions(self) -> Completions:
        """``harness.remote.completions`` for this client's futures (see ZmqCompletions)."""
        return ZmqCompletions()

    def serve_inference(self, link: Any) -> Any:
        """``harness.remote.SupportsRemoteInference``: a relay of remote actors' requests
        into the policy server of ``link`` (:mod:`harness_zmq.inference`; a cluster only:
        a local farm's actors use the shared arrays directly)."""
        from harness_zmq.inference import ZmqRelay

        return ZmqRelay(self, link)

    # -- actors --------------------------------------------------------------------------
    def create_actor(
        self,
        cls: type[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
    ) -> ZmqActor:
        if self._closed:
            raise HarnessError("this harness connection is closed")
        sources = self._ship(cls)
        payload = InitPayload(cls, args, kwargs, sources)
        if self._farm is not None:
            actor = self._farm.start(options)
        else:
            assert self._master is not None
            actor = self._master.place(options, self.place_timeout_s)
        with self._lock:
            self._actors[actor.actor_id] = actor
            died = self._died.pop(actor.actor_id, None)
        if died is not None:
            actor._lost(died)
        if self._closed:  # closed meanwhile
            actor.close()
            raise HarnessError("this harness connection is closed")
        try:
            actor._initialise(payload, self.start_timeout_s)
        except BaseException:
            actor.close()
            raise
        return actor

    def _ship(self, cls: type[Any]) -> dict[str, Any]:
        key = f"{cls.__module__}:{cls.__qualname__}:{id(cls)}"
        cached = self._shipping.get(key)
        if cached is None:
            cached = self._shipping[key] = shipped_sources(cls)
        return cached[0]

    def _forget(self, actor: ZmqActor) -> None:
        with self._lock:
            self._actors.pop(actor.actor_id, None)

    def _actor_died(self, actor_id: str, reason: str) -> None:
        with self._lock:
            actor = self._actors.get(actor_id)
            if actor is None:  # reported before its handle exists: remembered for it
                self._died[actor_id] = reason
                while len(self._died) > 10_000:
                    self._died.pop(next(iter(self._died)))
        if actor is not None:
            actor._lost(reason)

    def close(self) -> None:
        """Release every actor and disconnect (idempotent)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        actors = self.actors
        if self._farm is not None:  # all at once: their exits are then reported together
            for actor in actors:
                if actor.process is not None:
                    actor.process.kill()
        for actor in actors:
            with contextlib.suppress(Exception):
                actor.close()
        if self._farm is not None:
            self._farm.close()
        if self._master is not None:
            self._master.close()
        self._receiver.stop()
        with contextlib.suppress(Exception):
            self.guard.close()
        with contextlib.suppress(Exception):
            self.context.destroy(linger=0)


def _raise_fd_limit() -> None:
    """A farm of hundreds of actors needs a few descriptors each."""
    with contextlib.suppress(Exception):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
