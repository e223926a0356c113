"""The ZeroMQ client: ``connect(address)`` -> :class:`ZmqClient`, actor handles and futures.

``address=None`` starts an embedded local farm: the client owns an
:class:`~harness_zmq.actor.ActorLauncher` on 127.0.0.1 and watches its actors' sentinels.
``address="tcp://HOST:PORT"`` joins a cluster: the master places actors on its workers
(``place``/``placed``), hears this client's heartbeats and reports dead actors
(``actor_died``). Either way the client then talks to each actor directly, over one DEALER
socket per actor.

**Calls without hand-offs.** A blocking call is made by the calling thread itself: it takes the
actor's socket lock, sends, and receives until its own reply arrives (replies to futures it
reads on the way are handed to those futures). A future is sent the same way; its reply is read
by a thread waiting on it (``result()`` reads the socket itself), by the sending thread every
``DRAIN_EVERY`` sends, or by the client's receiver thread, which polls the sockets of actors
with futures outstanding (and sleeps when there are none) and stays off a socket while a thread
is sending on it (see :class:`_Receiver`). So a future completes without anyone waiting on it
(``concurrent.futures.wait``, ``as_completed`` and ``add_done_callback`` work), and a loop
sending futures does not fight a second thread for the GIL. Calls on one actor run in the order
they were sent. Large buffers (numpy arrays) travel as their own frames: a blocking call sends
them without copying, a future copies them once (the caller may change them at once), and
received ones are used where they landed (``copy=False``).

**Shipping code.** Classes from ``__main__`` travel by value (cloudpickle); so do classes from
local modules (not installed: files next to the script, in the cwd or on a path entry outside
the interpreter's prefixes), whose top-level modules are registered with
``cloudpickle.register_pickle_by_value``. The source files of every local module or package
reachable from the class's module (its globals, recursively) are shipped too, and the actor
installs them on its ``sys.path`` before it unpickles the class.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import itertools
import logging
import os
import pickle
import queue
import resource
import select
import site
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from concurrent.futures._base import RUNNING as _RUNNING
from multiprocessing.connection import wait as wait_handles
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import zmq
import zmq.backend

from harness.errors import HarnessError
from harness.remote import ActorLost, ActorOptions, Completions, RemoteError
from harness_zmq import wire
from harness_zmq.actor import (
    STATS_ATTRIBUTE,
    ActorLauncher,
    ActorProcess,
    InitPayload,
    recv_frames,
    send_frames,
)
from harness_zmq.security import Guard, Keys, host_of, is_loopback, load_keys
from harness_zmq.wakeup import WakePipe

__all__ = ["ZmqActor", "ZmqClient", "connect", "shipped_sources"]

log = logging.getLogger(__name__)

Kind = wire.Kind
PROTOCOL = wire.PROTOCOL
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_loads = pickle.loads
_dumps = wire.dumps
_SNDMORE = int(zmq.SNDMORE)
_send = zmq.backend.Socket.send  # without pyzmq's Python wrapper
_RCVMORE = int(zmq.RCVMORE)
_INLINE_MAX = wire.INLINE_MAX
_P_KEY = wire.P_KEY
_A_KEY = wire.A_KEY
_SCALARS = wire.SCALARS
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})  # Future.done()'s states
_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})
_CALL_HEADS: dict[str, bytes] = {}


def _call_head(method: str) -> bytes:
    """The CALL header of ``method`` up to its id: a msgpack map {"v", "k", "m", "id": ...,
    "p": ...} whose last two values (the id, the inline payload) are appended per call."""
    head = b"\x85" + b"".join(_packb(x) for x in ("v", PROTOCOL, "k", "call", "m", method, "id"))
    if len(_CALL_HEADS) < 10_000:
        _CALL_HEADS[method] = head
    return head


def _scalar_call(method: str, rid: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The one-frame CALL with msgpack arguments ("a"), or None when some argument is not a
    plain scalar (or an int too big for msgpack) or there are keyword arguments."""
    if kwargs:
        return None
    for arg in args:
        if type(arg) not in _SCALARS:
            return None
    try:
        packed = _packb(args)
    except OverflowError:
        return None
    head = _CALL_HEADS.get(method) or _call_head(method)
    return head + _packb(rid) + _A_KEY + packed


def _call_frames(method: str, rid: int, body: list[Any]) -> list[Any]:
    """The frames of a CALL: the pickle inline when it fits (wire.INLINE_MAX), followed by its
    out-of-band buffers if any; else the header (without "p") and the payload frames."""
    head = _CALL_HEADS.get(method) or _call_head(method)
    if len(body[0]) <= _INLINE_MAX:
        inline = head + _packb(rid) + _P_KEY + _packb(body[0])
        return [inline] if len(body) == 1 else [inline, *body[1:]]
    return [b"\x84" + head[1:] + _packb(rid), *body]


def _encode_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The CALL payload: the C pickler when every argument is plain (numbers, strings,
    numpy arrays: the common case, and much cheaper), else cloudpickle (wire.dumps)."""
    if len(args) + len(kwargs) <= 8:
        scalars = True
        for arg in args:
            if type(arg) not in _PLAIN:
                if not _plain(arg):
                    return _dumps((args, kwargs))
                scalars = False
        for arg in kwargs.values():
            if type(arg) not in _PLAIN:
                if not _plain(arg):
                    return _dumps((args, kwargs))
                scalars = False
        if scalars:  # nothing can go out of band
            return [_pdumps((args, kwargs), 5)]
        return _dumps_plain((args, kwargs))
    return _dumps((args, kwargs))


_plain = wire.plain
_dumps_plain = wire.dumps_plain
_pdumps = pickle.dumps
POLL_MS = 200
"""How often a caller blocked on a reply checks whether its actor died."""
LOCAL_ACTOR_NICE = 0
"""Default niceness added to the actors of an embedded local farm (``connect(actor_nice=)``).
0: a niced actor answers a blocking call ~10% slower (measured by tools/bench_remote.py), and
on the 256-actor farm benchmark nice 0, 10 and 19 were within noise of each other."""
LOCAL_IPC = False
"""Whether an embedded local farm's actors listen on Unix-domain sockets (``ipc://`` in each
actor's private 0700 directory) rather than loopback TCP (``connect(local_ipc=)``). Measured
by tools/bench_remote.py on the 2-core machine: a tiny call ~10% quicker over IPC, but a 1 MiB
argument ~60% slower (loopback TCP moves big messages in 64 KiB segments), hence TCP."""
SCAN_S = 0.02
"""``_Completions`` looks at all its futures at least this often (those done without an edge)."""
SWEEP_S = 0.1
"""How often the receiver thread looks at every watched socket even without a wake-up."""
DRAIN_EVERY = 16
"""A thread sending futures reads the replies waiting every this many sends."""
MAX_SHIPPED_BYTES = 20 * 2**20


def connect(
    address: str | None = None,
    *,
    keys: Keys | str | os.PathLike[str] | None = None,
    cpus: float | None = None,
    heartbeat_s: float = 1.0,
    connect_timeout_s: float = 5.0,
    start_timeout_s: float = 60.0,
    place_timeout_s: float = 300.0,
    name: str | None = None,
    preload: Sequence[str] = (),
    actor_nice: int = LOCAL_ACTOR_NICE,
    local_ipc: bool = LOCAL_IPC,
) -> ZmqClient:
    """A client of an embedded local farm (``address=None``) or of the cluster whose master
    listens at ``address`` (``tcp://HOST:PORT``).

    ``keys``: the cluster's CURVE key directory (or loaded :class:`Keys`), needed for clusters
    on non-loopback addresses. ``cpus``: the local farm's size for placement accounting
    (default: this machine's cores; asking for more only logs a warning). ``heartbeat_s``:
    the client's heartbeat to the master. ``connect_timeout_s``: how long to wait for the
    master's welcome. ``start_timeout_s``: how long an actor may take to start and construct
    its object. ``place_timeout_s``: how long the master may take to place an actor.
    ``preload``: modules the local farm's zygote imports before forking actors, so they share
    them (e.g. ``torch``; a cluster's workers read ``HARNESS_ACTOR_PRELOAD`` instead).
    ``actor_nice``: niceness added to the local farm's actors (a lower CPU priority than the
    caller's, for a learner sharing an oversubscribed machine with its actors). ``local_ipc``:
    the local farm's actors listen on Unix-domain sockets in their private directories instead
    of loopback TCP (see LOCAL_IPC for the trade-off)."""
    return ZmqClient(
        address,
        keys=keys,
        cpus=cpus,
        heartbeat_s=heartbeat_s,
        connect_timeout_s=connect_timeout_s,
        start_timeout_s=start_timeout_s,
        place_timeout_s=place_timeout_s,
        name=name,
        preload=preload,
        actor_nice=actor_nice,
        local_ipc=local_ipc,
    )


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

    def __init__(
        self,
        address: str | None,
        *,
        keys: Keys | str | os.PathLike[str] | None = None,
        cpus: float | None = None,
        heartbeat_s: float = 1.0,
        connect_timeout_s: float = 5.0,
        start_timeout_s: float = 60.0,
        place_timeout_s: float = 300.0,
        name: str | None = None,
        preload: Sequence[str] = (),
        actor_nice: int = LOCAL_ACTOR_NICE,
        local_ipc: bool = LOCAL_IPC,
    ) -> None:
        self._closed = True  # until constructed (close() and __del__ may run on a failure)
        if keys is not None and not isinstance(keys, Keys):
            keys = load_keys(os.fspath(keys))
        self.address = address
        self.keys: Keys | None = keys
        self.start_timeout_s = float(start_timeout_s)
        self.place_timeout_s = float(place_timeout_s)
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
        self._receiver = _Receiver()
        self._farm: _LocalFarm | None = None
        self._master: _MasterLink | None = None
        self._closed = False
        try:
            if address is None:
                self._farm = _LocalFarm(self, cpus, keys, preload, actor_nice, local_ipc)
            else:
                self._master = _MasterLink(
                    self, address, heartbeat_s, connect_timeout_s, name or _default_name()
                )
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
        """``harness.remote.completions`` for this client's futures (see _Completions)."""
        return _Completions()

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


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _raise_fd_limit() -> None:
    """A farm of hundreds of actors needs a few descriptors each."""
    with contextlib.suppress(Exception):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ------------------------------------------------------------------------------------------
# one actor


class ZmqActor:
    """The handle of one actor (implements ``harness.remote.ActorHandle``)."""

    def __init__(
        self,
        client: ZmqClient,
        actor_id: str,
        endpoint: str,
        pid: int | None,
        release: Callable[[], None],
    ) -> None:
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.pid = pid
        self._client = client
        self._release = release
        self._receiver = client._receiver
        self._lock = threading.Lock()  # the socket: whoever holds it may send and receive
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self._dead: str | None = None
        self._closed = False
        self.malformed = 0
        self.process: ActorProcess | None = None  # the local farm's process
        self._touched = 0.0  # when a future was last sent (see _Receiver)
        self._unread = 0  # futures sent since the socket was last read to the end
        self._wanted = False  # someone waits on its futures without reading (see _Receiver)
        self._collected = 0  # futures of it held by a _Completions, which reads the socket
        sock = client.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 0  # pipelined calls never block nor drop
        sock.rcvhwm = 0
        sock.rcvtimeo = POLL_MS
        client.guard.client(sock)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise HarnessError(f"cannot connect to actor {actor_id} at {endpoint}: {exc}") from None
        self._sock = sock
        self.fd: int = sock.getsockopt(zmq.FD)

    def __repr__(self) -> str:
        state = f"lost: {self._dead}" if self._dead else "alive"
        return f"<ZmqActor {self.actor_id} {self.endpoint} pid={self.pid} {state}>"

    # -- the ActorHandle interface -------------------------------------------------------
    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # the hot path, inlined: the common reply (a RESULT with our id) is decoded here,
        # anything else goes through _outcome
        rid = next(self._ids)
        one = _scalar_call(method, rid, args, kwargs)
        if one is None:
            frames = _call_frames(method, rid, _encode_args(args, kwargs))
            if len(frames) == 1:
                one = frames[0]
        sock = self._sock
        others: list[tuple[dict[str, Any], list[Any]]] = []
        with self._lock:
            if self._dead is not None:
                raise self._lost_error()
            if one is not None:
                _send(sock, one)
            else:
                send_frames(sock, frames, zero_copy=True)
            while True:
                try:
                    first = frame = sock.recv(copy=False)
                    reply = [first]
                    while frame.more:
                        frame = sock.recv(copy=False)
                        reply.append(frame)
                except zmq.Again:
                    if self._dead is not None:
                        raise self._lost_error() from None
                    continue
                try:
                    msg = _unpackb(first)
                except Exception:
                    msg = None
                if (
                    type(msg) is dict
                    and msg.get("id") == rid
                    and msg.get("k") == "result"
                    and msg.get("v") == PROTOCOL
                ):
                    result = True
                    break
                try:
                    msg = wire.header(first)
                except wire.MalformedFrame:
                    self.malformed += 1
                    continue
                if msg.get("id") == rid:
                    result = False
                    break
                others.append((msg, reply))
            if self._pending:
                self._drain(others)
                self._receiver.cleaned(self)
            elif self._unread:
                self._unread = 0
                self._receiver.idle(self)
        if others:
            self._settle(others)
        if result:
            n = len(reply)
            try:
                inline = msg.get("p")
                if inline is not None:
                    return _loads(inline) if n == 1 else _loads(inline, buffers=reply[1:])
                if n == 1:
                    return msg.get("r")
                if n == 2:
                    return _loads(reply[1])
                return _loads(reply[1], buffers=reply[2:])
            except Exception:
                pass  # _outcome explains it
        ok, value = self._outcome(msg, reply, False)
        if ok:
            return value
        raise value

    def call_future(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        rid = next(self._ids)
        one = _scalar_call(method, rid, args, kwargs)
        frames = [one] if one is not None else _call_frames(method, rid, _encode_args(args, kwargs))
        future = _CallFuture(self)
        pending = self._pending
        pending[rid] = future
        with self._lock:
            if self._dead is not None:
                pending.pop(rid, None)
                future.set_exception(self._lost_error())
                return future
            if len(frames) == 1:
                _send(self._sock, frames[0])
            else:
                send_frames(self._sock, frames)  # copies big buffers: the caller may reuse them
            # replies are read here only every DRAIN_EVERY sends (a read that finds nothing
            # costs a system call); otherwise by the receiver thread once this thread stops
            # sending, or by a thread waiting on a result
            self._unread += 1
            if self._unread >= DRAIN_EVERY:
                received: list[tuple[dict[str, Any], list[Any]]] = []
                self._drain(received)
                self._receiver.cleaned(self)
            else:
                received = []
                self._receiver.touched(self)
        if received:
            self._settle(received)
        return future

    def get_attribute(self, name: str) -> Any:
        rid = next(self._ids)
        return self._roundtrip(rid, wire.pack(Kind.GETATTR, {"id": rid, "name": name}))

    def close(self) -> None:
        """End the actor (idempotent); pending calls fail with ActorLost."""
        if self._closed:
            return
        self._closed = True
        self._lost("it was released")
        self._client._forget(self)
        self._receiver.unwatch(self)
        locked = self._lock.acquire(timeout=5.0)
        try:
            self._sock.close(linger=0)
        finally:
            if locked:
                self._lock.release()
        self._release()

    # -- extras --------------------------------------------------------------------------
    def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        """The actor's PONG header: its pid and counters (malformed, refused, calls...)."""
        rid = next(self._ids)
        header: dict[str, Any] = self._roundtrip(
            rid, wire.pack(Kind.PING, {"id": rid}), timeout=timeout
        )
        return header

    def stats(self) -> dict[str, Any]:
        """The actor's counters (``GETATTR __harness_stats__``)."""
        stats: dict[str, Any] = self.get_attribute(STATS_ATTRIBUTE)
        return stats

    @property
    def lost(self) -> str | None:
        """Why the actor is gone, or None while it is usable."""
        return self._dead

    # -- internals -----------------------------------------------------------------------
    def _initialise(self, payload: InitPayload, timeout: float) -> None:
        # a PING first, bounded: an endpoint this host cannot reach fails clearly; the INIT
        # itself may take as long as the constructor needs (a dead actor still ends it)
        rid = next(self._ids)
        try:
            self._roundtrip(rid, wire.pack(Kind.PING, {"id": rid}), timeout=timeout)
        except TimeoutError:
            raise HarnessError(
                f"actor {self.actor_id} at {self.endpoint} did not answer within {timeout:.0f}s"
                f" (is that address reachable from this host?)"
            ) from None
        rid = next(self._ids)
        header = self._roundtrip(rid, wire.pack(Kind.INIT, {"id": rid}, payload), init=True)
        if isinstance(header, dict) and header.get("pid"):
            self.pid = int(header["pid"])

    def _roundtrip(
        self, rid: int, frames: list[Any], timeout: float | None = None, init: bool = False
    ) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        others: list[tuple[dict[str, Any], list[Any]]] = []
        mine: list[Any] | None = None
        head: dict[str, Any] = {}
        sock = self._sock
        header = wire.header
        with self._lock:
            if self._dead is not None:
                raise self._lost_error()
            send_frames(sock, frames, zero_copy=True)  # the caller waits: no copy needed
            while True:
                try:
                    reply = recv_frames(sock)
                except zmq.Again:
                    if self._dead is not None:
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"actor {self.actor_id} did not answer") from None
                    continue
                try:
                    head = header(reply[0])
                except wire.MalformedFrame:
                    self.malformed += 1
                    continue
                if head.get("id") == rid:
                    mine = reply
                    break
                others.append((head, reply))
            if self._pending:
                self._drain(others)
                self._receiver.cleaned(self)
        if others:
            self._settle(others)
        if mine is None:
            raise self._lost_error()
        ok, value = self._outcome(head, mine, init)
        if ok:
            return value
        raise value

    def _wait_for(self, future: Future[Any], timeout: float | None) -> float | None:
        """Read replies until ``future`` is done (a thread waiting on a result reads the
        socket itself); returns what is left of ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = self._sock
        header = wire.header
        pending = self._pending
        while not future.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if not self._lock.acquire(timeout=-1 if left is None else left):
                break
            received: list[tuple[dict[str, Any], list[Any]]] = []
            try:
                if future.done() or self._dead is not None or self._closed:
                    break
                try:
                    reply = recv_frames(sock)  # waits at most POLL_MS (RCVTIMEO)
                    head = header(reply[0])
                except zmq.Again:
                    continue
                except wire.MalformedFrame:
                    self.malformed += 1
                    continue
                received.append((head, reply))
                if len(pending) == 1 and pending.get(head.get("id", -1)) is future:
                    # the last one outstanding: nobody needs the rest read (nor the
                    # receiver thread woken); the next send marks the socket dirty
                    self._receiver.idle(self)
                else:
                    self._drain(received)  # others wait: leave the socket read to the end
                    self._receiver.cleaned(self)
            finally:
                self._lock.release()
                if received:
                    self._settle(received)
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _read_waiting(self) -> None:
        """Read and settle the replies waiting on the socket, unless another thread holds it
        for long (it reads them then)."""
        if not self._lock.acquire(timeout=POLL_MS / 1000):
            return
        received: list[tuple[dict[str, Any], list[Any]]] = []
        try:
            if not self._closed:
                self._drain(received)
                self._receiver.cleaned(self)
        finally:
            self._lock.release()
        if received:
            self._settle(received)

    def _drain(self, into: list[tuple[dict[str, Any], list[Any]]]) -> None:
        """Read every reply waiting on the socket (the socket lock is held). Ends with a
        ZMQ_EVENTS query that found nothing, which re-arms the socket's ZMQ_FD edge."""
        self._unread = 0
        sock = self._sock
        recv = sock.recv
        events = functools.partial(sock.getsockopt, zmq.EVENTS)
        unpackb = _unpackb
        while events() & _POLLIN:  # (cheaper than a receive raising zmq.Again)
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            reply = [frame]
            while frame.more:
                frame = recv(copy=False)
                reply.append(frame)
            try:
                head = unpackb(reply[0])
            except Exception:
                head = None
            if type(head) is not dict or type(head.get("v")) is not int:
                try:
                    head = wire.header(reply[0])  # says what is wrong
                except wire.MalformedFrame:
                    self.malformed += 1
                    continue
            into.append((head, reply))

    def _settle(self, replies: Iterable[tuple[dict[str, Any], list[Any]]]) -> None:
        pending = self._pending
        for head, frames in replies:
            future = pending.pop(head.get("id"), None)  # type: ignore[arg-type]
            if future is None:
                continue  # a reply to a call that was failed already
            if head.get("k") == "result" and head["v"] == PROTOCOL:  # the common case
                n = len(frames)
                try:
                    inline = head.get("p")
                    if inline is not None:
                        value = _loads(inline) if n == 1 else _loads(inline, buffers=frames[1:])
                    elif n == 1:
                        value = head.get("r")
                    elif n == 2:
                        value = _loads(frames[1])
                    else:
                        value = _loads(frames[1], buffers=frames[2:])
                except Exception:
                    pass  # _outcome explains it
                else:
                    future.set_result(value)
                    continue
            ok, value = self._outcome(head, frames, False)
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _outcome(self, head: dict[str, Any], frames: list[Any], init: bool) -> tuple[bool, Any]:
        """(True, value) or (False, exception) of one reply."""
        kind = head["k"]
        if head["v"] != PROTOCOL:
            return False, RemoteError(
                "Refused",
                str(
                    head.get("reason")
                    or f"protocol version mismatch: the actor speaks version {head['v']}, "
                    f"this client speaks version {PROTOCOL}"
                ),
            )
        if kind == "result":
            if init:
                return True, head
            if "r" in head:
                return True, head["r"]
            body = wire.payload(head, frames)
            if not body:
                return True, None
            try:
                return True, wire.loads(body)
            except wire.MalformedFrame as exc:
                cause = exc.__cause__ or exc
                return False, RemoteError(
                    type(cause).__name__,
                    f"the result of actor {self.actor_id} cannot be unpickled here: {cause}",
                )
        if kind == "error":
            return False, RemoteError(
                str(head.get("type", "Exception")),
                str(head.get("message", "")),
                str(head.get("traceback", "")),
            )
        if kind == "pong":
            return True, head
        if kind == "refused":
            return False, RemoteError("Refused", str(head.get("reason", "")))
        return False, RemoteError("MalformedFrame", f"unexpected {kind[:40]!r} reply")

    def _lost_error(self) -> ActorLost:
        pid = f" (pid {self.pid})" if self.pid else ""
        return ActorLost(
            "ActorLost", f"actor {self.actor_id}{pid} is lost: {self._dead or 'unknown'}"
        )

    def _lost(self, reason: str) -> None:
        """The actor is gone: fail everything pending, now and from now on."""
        if self._dead is None:
            self._dead = reason
        pending = self._pending
        while pending:
            try:
                _, future = pending.popitem()
            except KeyError:
                break
            with contextlib.suppress(Exception):
                future.set_exception(self._lost_error())


# ------------------------------------------------------------------------------------------
# the receiver thread: completes futures nobody waits on


class _CallFuture(Future[Any]):
    """A future whose ``result()``/``exception()`` read the actor's socket themselves (no
    hand-off to the receiver thread) when nobody else is reading it."""

    def __init__(self, actor: ZmqActor) -> None:
        super().__init__()
        # what set_running_or_notify_cancel() does, without its lock (nobody else has this
        # future yet): sent at once, it cannot be cancelled
        self._state = _RUNNING
        self._actor = actor
        self._waiters = _Waiters(actor)  # concurrent.futures.wait/as_completed register here

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        super().add_done_callback(fn)
        if not self.done():
            self._actor._receiver.wanted(self._actor)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            timeout = self._actor._wait_for(self, timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done():
            timeout = self._actor._wait_for(self, timeout)
        return super().exception(timeout)


class _Waiters(list[Any]):
    """``Future._waiters`` of a call future: ``concurrent.futures.wait`` and ``as_completed``
    append to it, which tells the receiver thread that someone waits on the actor."""

    def __init__(self, actor: ZmqActor) -> None:
        super().__init__()
        self.actor = actor

    def append(self, waiter: Any) -> None:
        super().append(waiter)
        self.actor._receiver.wanted(self.actor)


class _Completions(Completions):
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


class _Receiver:
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


# ------------------------------------------------------------------------------------------
# the embedded local farm


class _LocalFarm:
    """Actors on this machine: an ActorLauncher plus a thread watching their sentinels."""

    def __init__(
        self,
        client: ZmqClient,
        cpus: float | None,
        keys: Keys | None,
        preload: Sequence[str],
        actor_nice: int = LOCAL_ACTOR_NICE,
        local_ipc: bool = LOCAL_IPC,
    ) -> None:
        self.client = client
        self.launcher = ActorLauncher("127.0.0.1", keys, preload, nice=actor_nice, ipc=local_ipc)
        self.cpus_total = float(cpus if cpus else (os.cpu_count() or 1))
        self.cpus_used = 0.0
        self.gpus_free: list[int] | None = None
        self._warned = False
        self._lock = threading.Lock()
        self._watch: dict[int, ZmqActor] = {}
        self._wakeup = WakePipe()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self, options: ActorOptions) -> ZmqActor:
        gpus = self._reserve(options)
        actor_id = f"a{next(self.client._ids)}"
        try:
            proc = self.launcher.start(
                actor_id, cpus=options.cpus, gpus=gpus, memory_mb=options.memory_mb
            )
        except BaseException:
            self._unreserve(options, gpus)
            raise
        try:
            endpoint = proc.wait_ready(self.client.start_timeout_s)
            actor = ZmqActor(
                self.client,
                actor_id,
                endpoint,
                proc.pid,
                functools.partial(self._release, proc, options, gpus),
            )
        except BaseException:
            proc.close()
            self._unreserve(options, gpus)
            raise
        actor.process = proc
        with self._lock:
            self._watch[proc.sentinel] = actor
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._monitor, name="harness-zmq-farm-monitor", daemon=True
                )
                self._thread.start()
        self._wakeup.wake()
        return actor

    def _reserve(self, options: ActorOptions) -> list[int]:
        gpus: list[int] = []
        with self._lock:
            if options.gpus:
                if self.gpus_free is None:
                    self.gpus_free = _local_gpus()
                if len(self.gpus_free) < options.gpus:
                    raise HarnessError(
                        f"an actor asks for {options.gpus} GPU(s) but the local farm has "
                        f"{len(self.gpus_free)} free; release actors or ask for fewer"
                    )
                gpus = self.gpus_free[: options.gpus]
                del self.gpus_free[: options.gpus]
            self.cpus_used += options.cpus
            if self.cpus_used > self.cpus_total + 1e-9 and not self._warned:
                self._warned = True
                log.warning(
                    "the local farm is oversubscribed: actors ask for %.1f CPUs, this farm has "
                    "%.1f (fine for actors that mostly wait; pass connect(cpus=N) to size it)",
                    self.cpus_used,
                    self.cpus_total,
                )
        return gpus

    def _unreserve(self, options: ActorOptions, gpus: list[int]) -> None:
        with self._lock:
            self.cpus_used -= options.cpus
            if gpus and self.gpus_free is not None:
                self.gpus_free.extend(gpus)

    def _release(self, proc: ActorProcess, options: ActorOptions, gpus: list[int]) -> None:
        with self._lock:
            self._watch.pop(proc.sentinel, None)
        self._wakeup.wake()
        proc.kill()
        proc.close()
        self._unreserve(options, gpus)

    def _monitor(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                fds = list(self._watch)
            try:
                ready = wait_handles([*fds, self._wakeup.fd], timeout=1.0)
            except OSError:  # a sentinel closed meanwhile: look again
                time.sleep(0.01)
                continue
            for handle in ready:
                fd = int(handle)  # type: ignore[arg-type]
                if fd == self._wakeup.fd:
                    self._wakeup.drain()
                    continue
                with self._lock:
                    actor = self._watch.get(fd)
                    proc = actor.process if actor is not None else None
                    if actor is None or proc is None or proc.is_alive():
                        continue  # a descriptor closed and reused meanwhile
                    del self._watch[fd]
                actor._lost(f"its process exited (exit code {proc.exitcode})")

    def close(self) -> None:
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wakeup.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.launcher.close()
        self._wakeup.close()


def _local_gpus() -> list[int]:
    """Indices usable as CUDA_VISIBLE_DEVICES entries on this machine."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(v) for v in visible.split(",") if v.strip().isdigit()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(int(pynvml.nvmlDeviceGetCount())))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(range(sum(1 for line in out.splitlines() if line.startswith("GPU "))))


# ------------------------------------------------------------------------------------------
# the link to a cluster master


class _MasterLink:
    """HELLO/WELCOME, placement, heartbeats and death notices, on a thread of its own."""

    def __init__(
        self,
        client: ZmqClient,
        address: str,
        heartbeat_s: float,
        connect_timeout_s: float,
        name: str,
    ) -> None:
        self.client = client
        self.address = address
        host = host_of(address)
        self.heartbeat_s = float(heartbeat_s)
        self.peer_id: str | None = None
        self._places: dict[int, Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._queue: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self._wakeup = WakePipe()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.refused: str | None = None
        sock = client.context.socket(zmq.DEALER)
        sock.linger = 0
        client.guard.client(sock)
        self.sock = sock
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            raise HarnessError(
                f"cannot connect to a harness master at {address!r}: {exc}"
            ) from None
        import harness

        sock.send_multipart(
            wire.pack(
                Kind.HELLO,
                {
                    "role": "client",
                    "name": name,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "cpus": 0,
                    "gpus": 0,
                    "harness": harness.__version__,
                },
            )
        )
        deadline = time.monotonic() + connect_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                hint = ""
                if client.keys is None and not is_loopback(host):
                    hint = (
                        " A cluster on a non-loopback address uses CURVE: pass its key "
                        "directory (connect(address, keys=DIR))."
                    )
                raise HarnessError(
                    f"no answer from a harness master at {address} within "
                    f"{connect_timeout_s:.0f}s: is 'harness cluster start' running there and "
                    f"reachable from this host?{hint}"
                )
            try:
                msg = wire.unpack(sock.recv_multipart())
            except wire.MalformedFrame:
                continue
            if msg.header.get("v") != wire.PROTOCOL or msg.kind is Kind.REFUSED:
                reason = msg.header.get("reason") or (
                    f"protocol version mismatch: the master speaks version "
                    f"{msg.header.get('v')}, this client speaks version {wire.PROTOCOL}"
                )
                raise HarnessError(f"the harness master at {address} refused this client: {reason}")
            if msg.kind is Kind.WELCOME:
                self.peer_id = str(msg.header.get("peer_id"))
                self.heartbeat_s = float(msg.header.get("heartbeat_s") or self.heartbeat_s)
                break
        self._thread = threading.Thread(target=self._run, name="harness-zmq-master", daemon=True)
        self._thread.start()

    def place(self, options: ActorOptions, timeout: float) -> ZmqActor:
        rid = next(self._ids)
        future: Future[dict[str, Any]] = Future()
        self._places[rid] = future
        self._send(
            wire.pack(
                Kind.PLACE,
                {
                    "id": rid,
                    "cpus": options.cpus,
                    "gpus": options.gpus,
                    "memory_mb": options.memory_mb,
                },
            )
        )
        try:
            placed = future.result(timeout=timeout)
        except FutureTimeout:
            self._places.pop(rid, None)
            raise HarnessError(
                f"the master at {self.address} placed no actor within {timeout:.0f}s "
                f"(are there workers with {options.cpus} free CPUs and {options.gpus} GPUs?)"
            ) from None
        if placed.get("error"):
            raise HarnessError(
                f"the master at {self.address} cannot place an actor: {placed['error']}"
            )
        actor_id = str(placed["actor_id"])
        pid = placed.get("pid")
        return ZmqActor(
            self.client,
            actor_id,
            str(placed["endpoint"]),
            int(pid) if pid else None,
            functools.partial(self.release, actor_id),
        )

    def release(self, actor_id: str) -> None:
        if not self._stop:
            self._send(wire.pack(Kind.RELEASE, {"actor_id": actor_id}))

    def _send(self, frames: list[Any]) -> None:
        self._queue.put(frames)
        self._wakeup.wake()

    def _run(self) -> None:
        sock = self.sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wakeup.fd, zmq.POLLIN)
        next_beat = time.monotonic()
        last_answer = time.monotonic()
        warned = False
        try:
            while True:
                self._flush()
                if self._stop:
                    break
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_s
                    sock.send_multipart(
                        wire.pack_data(
                            Kind.HEARTBEAT, {"peer_id": self.peer_id}, dict(self.client.metrics)
                        )
                    )
                    if now - last_answer > 3 * self.heartbeat_s and not warned:
                        warned = True
                        log.warning(
                            "the harness master at %s has not answered for %.0fs",
                            self.address,
                            now - last_answer,
                        )
                events = dict(poller.poll(max(1, int((next_beat - now) * 1000))))
                if self._wakeup.fd in events:
                    self._wakeup.drain()
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    try:
                        msg = wire.unpack(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    except wire.MalformedFrame:
                        continue
                    last_answer = time.monotonic()
                    warned = False
                    self._handle(msg)
        except zmq.ZMQError as exc:
            if not self._stop:
                log.error("the link to the harness master at %s failed: %s", self.address, exc)
        finally:
            with contextlib.suppress(Exception):
                self._flush()
                if self.peer_id is not None:
                    sock.send_multipart(wire.pack(Kind.BYE, {"peer_id": self.peer_id}))
            with contextlib.suppress(Exception):
                sock.close(linger=1000)  # RELEASE/BYE still reach the master
            for future in list(self._places.values()):
                if not future.done():
                    future.set_exception(HarnessError("the harness connection was closed"))

    def _flush(self) -> None:
        while True:
            try:
                frames = self._queue.get_nowait()
            except queue.Empty:
                return
            self.sock.send_multipart(frames)

    def _handle(self, msg: wire.Message) -> None:
        header = msg.header
        if header.get("v") != wire.PROTOCOL or msg.kind is Kind.REFUSED:
            self.refused = str(header.get("reason", "refused"))
            log.error(
                "the harness master at %s refused this client: %s", self.address, self.refused
            )
            for rid in list(self._places):
                future = self._places.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result({"error": f"refused: {self.refused}"})
            return
        kind = msg.kind
        if kind is Kind.PLACED:
            future = self._places.pop(header.get("id"), None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(header)
        elif kind is Kind.ACTOR_DIED:
            self.client._actor_died(
                str(header.get("actor_id")), str(header.get("reason", "its worker reported it"))
            )
        elif kind is Kind.WELCOME:
            self.peer_id = str(header.get("peer_id", self.peer_id))

    def close(self) -> None:
        self._stop = True
        self._wakeup.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        elif thread is None:
            with contextlib.suppress(Exception):
                self.sock.close(linger=0)
        self._wakeup.close()


# ------------------------------------------------------------------------------------------
# shipping local code


def shipped_sources(cls: type[Any]) -> tuple[dict[str, Any], list[str]]:
    """The sources of the local modules ``cls`` needs, and the local top-level modules
    registered for pickling by value (see the module docstring).

    Returns ``({top-level name: source text | {relative path: source text}}, [names])``."""
    start = sys.modules.get(cls.__module__)
    roots: list[types.ModuleType] = [] if start is None else [start]
    for base in getattr(cls, "__mro__", ())[1:]:
        module = sys.modules.get(getattr(base, "__module__", "") or "")
        if module is not None:
            roots.append(module)
    local: dict[str, types.ModuleType] = {}
    seen: set[str] = set()
    todo = [m for m in roots if m.__name__ == "__main__" or _is_local(m)]
    while todo:
        module = todo.pop()
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        if module.__name__ != "__main__":
            top = module.__name__.partition(".")[0]
            if top not in local and top in sys.modules:
                local[top] = sys.modules[top]
                todo.append(local[top])
        for value in list(vars(module).values()):
            if isinstance(value, types.ModuleType):
                candidate: types.ModuleType | None = value
            else:
                name = getattr(value, "__module__", None) if _is_code(value) else None
                candidate = sys.modules.get(name) if isinstance(name, str) else None
            if (
                candidate is not None
                and candidate.__name__ not in seen
                and candidate.__name__ != "__main__"
                and _is_local(candidate)
            ):
                todo.append(candidate)
    sources: dict[str, Any] = {}
    size = 0
    for top, module in sorted(local.items()):
        with contextlib.suppress(Exception):
            cloudpickle.register_pickle_by_value(module)
        files = _module_files(module)
        if files is None:
            continue
        size += sum(len(text) for text in files.values())
        if size > MAX_SHIPPED_BYTES:
            log.warning("not shipping %s: local sources over %d MB", top, MAX_SHIPPED_BYTES >> 20)
            break
        if getattr(module, "__path__", None) is None:
            sources[top] = next(iter(files.values()))
        else:
            sources[top] = files
    return sources, sorted(local)


def _is_code(value: Any) -> bool:
    return isinstance(value, type | types.FunctionType | types.BuiltinFunctionType)


def _module_files(module: types.ModuleType) -> dict[str, str] | None:
    name = module.__name__
    paths = getattr(module, "__path__", None)
    if paths is None:  # a plain module
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            return None
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return {f"{name}.py": Path(file).read_text(encoding="utf-8")}
        return None
    files: dict[str, str] = {}
    for entry in list(paths):
        root = Path(entry)
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                files.setdefault(str(Path(name, rel)), path.read_text(encoding="utf-8"))
    return files


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(Exception):
            roots.add(sysconfig.get_paths()[key])
    with contextlib.suppress(Exception):
        roots.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        roots.add(site.getusersitepackages())
    return tuple(sorted({os.path.realpath(r) + os.sep for r in roots if r}))


@functools.cache
def _distributions() -> frozenset[str]:
    import importlib.metadata

    try:
        return frozenset(importlib.metadata.packages_distributions())
    except Exception:
        return frozenset()


def _is_local(module: types.ModuleType) -> bool:
    """A module that exists only as files here: not stdlib, not installed (also editable)."""
    name = module.__name__
    if name == "__main__":
        return False
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    if top in _distributions():
        return False
    file = getattr(module, "__file__", None)
    if not file:
        paths = list(getattr(module, "__path__", None) or [])
        if not paths:
            return False
        file = paths[0]
    real = os.path.realpath(file)
    return not any(real.startswith(root) for root in _installed_roots())
