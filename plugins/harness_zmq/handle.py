"""The handle of one actor (:class:`ZmqActor`): calls, futures, and reading its socket.

A client talks to each actor directly, over one DEALER socket per actor.

**Calls without hand-offs.** A blocking call is made by the calling thread itself: it takes the
actor's socket lock, sends, and receives until its own reply arrives (replies to futures it
reads on the way are handed to those futures). A future is sent the same way; its reply is read
by a thread waiting on it (``result()`` reads the socket itself), by the sending thread every
``DRAIN_EVERY`` sends, or by the client's receiver thread (:mod:`harness_zmq.receiver`), which
polls the sockets of actors with futures outstanding (and sleeps when there are none) and stays
off a socket while a thread is sending on it. So a future completes without anyone waiting on
it (``concurrent.futures.wait``, ``as_completed`` and ``add_done_callback`` work), and a loop
sending futures does not fight a second thread for the GIL. Calls on one actor run in the order
they were sent. Large buffers (numpy arrays) travel as their own frames: a blocking call sends
them without copying, a future copies them once (the caller may change them at once), and
received ones are used where they landed (``copy=False``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import msgpack
import zmq
import zmq.backend
from zmq.utils.monitor import recv_monitor_message

from harness.errors import HarnessError
from harness.remote import ActorLost, RemoteError
from harness_zmq import wire
from harness_zmq.wire import STATS_ATTRIBUTE, recv_frames, send_frames

log = logging.getLogger(__name__)

_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

if TYPE_CHECKING:
    from harness_zmq.client import ZmqClient
    from harness_zmq.launcher import ActorProcess
    from harness_zmq.shipping import InitPayload

__all__ = ["DONE_STATES", "DRAIN_EVERY", "POLL_MS", "ZmqActor"]

Kind = wire.Kind
PROTOCOL = wire.PROTOCOL
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_loads = pickle.loads
_dumps = wire.dumps
_send = zmq.backend.Socket.send  # without pyzmq's Python wrapper
_INLINE_MAX = wire.INLINE_MAX
_P_KEY = wire.P_KEY
_A_KEY = wire.A_KEY
_SCALARS = wire.SCALARS
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_PLAIN = wire.PLAIN
_CALL_HEADS: dict[str, bytes] = {}


def _future_states() -> tuple[str, frozenset[str]]:
    """``Future``'s running state and the states ``done()`` accepts, read off live futures
    (the stdlib names them only in its private ``concurrent.futures._base``): a call future
    is made running, and its state read, without the future's lock."""
    running = Future[None]()
    running.set_running_or_notify_cancel()
    state = running._state
    running.set_result(None)
    cancelled = Future[None]()
    cancelled.cancel()
    done = {running._state, cancelled._state}
    cancelled.set_running_or_notify_cancel()  # (cancelled and notified)
    done.add(cancelled._state)
    return state, frozenset(done)


RUNNING_STATE, DONE_STATES = _future_states()
"""``Future._state`` of a running future, and the states of a done one (``Future.done()``)."""


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
DRAIN_EVERY = 16
"""A thread sending futures reads the replies waiting every this many sends."""


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
        self._touched = 0.0  # when a future was last sent (see receiver.Receiver)
        self._unread = 0  # futures sent since the socket was last read to the end
        self._wanted = False  # someone waits on its futures without reading (see receiver.Receiver)
        self._collected = 0  # futures of it held by a ZmqCompletions, which reads the socket
        sock = client.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 0  # pipelined calls never block nor drop
        sock.rcvhwm = 0
        sock.rcvtimeo = POLL_MS
        if client.keys is None:  # (a client always has keys: its farm's or its cluster's)
            raise HarnessError("refusing to talk to an actor without CURVE keys")
        client.guard.client(sock)
        # until _initialise has seen the CURVE handshake succeed: one that fails (a server
        # without the cluster's keys, or no CURVE at all) is an error at once, not a timeout
        self._handshake: zmq.Socket[Any] | None = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self._end_handshake_watch(sock)
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
            self._end_handshake_watch(self._sock)
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
        self._await_handshake(timeout)
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

    def _await_handshake(self, timeout: float) -> None:
        """Wait for the CURVE handshake with the actor: a peer that is not a CURVE server
        holding the cluster's server key fails it, and gets nothing (no INIT, no weights)."""
        watch = self._handshake
        if watch is None:
            return
        deadline = time.monotonic() + timeout
        try:
            while not self._dead:
                left = deadline - time.monotonic()
                try:
                    if left <= 0 or not watch.poll(int(min(left, 0.2) * 1000) + 1):
                        if left <= 0:
                            return  # the PING below says it did not answer
                        continue
                    event = recv_monitor_message(watch)["event"]
                except zmq.ZMQError:  # closed meanwhile (the actor was lost or released)
                    return
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return
                log.error(
                    "refused actor %s at %s: the CURVE handshake failed (it is not a server "
                    "with this cluster's keys)",
                    self.actor_id,
                    self.endpoint,
                )
                raise HarnessError(
                    f"actor {self.actor_id} at {self.endpoint} failed the CURVE handshake: it "
                    f"does not hold this cluster's keys (or speaks no CURVE); nothing was sent "
                    f"to it"
                )
        finally:
            with self._lock:
                self._end_handshake_watch(self._sock)

    def _end_handshake_watch(self, sock: zmq.Socket[Any]) -> None:
        watch, self._handshake = self._handshake, None
        if watch is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            watch.close(linger=0)

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


class _CallFuture(Future[Any]):
    """A future whose ``result()``/``exception()`` read the actor's socket themselves (no
    hand-off to the receiver thread) when nobody else is reading it."""

    def __init__(self, actor: ZmqActor) -> None:
        super().__init__()
        # what set_running_or_notify_cancel() does, without its lock (nobody else has this
        # future yet): sent at once, it cannot be cancelled
        self._state = RUNNING_STATE
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
