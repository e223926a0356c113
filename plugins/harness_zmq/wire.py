"""The wire format: one versioned, typed envelope for every ZeroMQ message.

A message is a multipart ZeroMQ message (after the ROUTER identity frame, where there is one)::

    frame 0      header: a msgpack map {"v": PROTOCOL, "k": kind, ...small typed fields}
    frame 1..n   payload (optional): frame 1 is a pickle protocol-5 stream, frames 2..n are
                 its out-of-band buffers (numpy arrays travel as raw frames, never copied into
                 the pickle)

A pickle stream of at most ``INLINE_MAX`` bytes (most calls and results) rides in the header
instead, as the bin field ``"p"``, and its out-of-band buffers, if any, follow as frames 1..n:
one frame per small message, and one fewer for every big one (each extra ZeroMQ frame costs
~25 us of round trip on a small VM). :func:`payload` gives the payload frames of either form.

Calls whose arguments are all plain scalars (exactly ``int``, ``float``, ``bool``, ``str``,
``bytes`` or ``None``; no keyword arguments) carry them as a msgpack array ``"a"`` in the CALL
header instead of a pickle, and a plain scalar result travels as the header field ``"r"``:
msgpack keeps these types exactly, and neither side runs the pickler for the commonest calls.

Decoding the header is msgpack only (``"p"`` stays opaque bytes), so any peer can be answered
(or refused) without unpickling anything. Payloads are unpickled only from authenticated
peers: every socket is CURVE-authenticated, loopback included (see security.py), so a peer
without the keys never gets a message through.

Malformed input raises :class:`MalformedFrame`; every receive loop catches it, counts it and
drops the message. The invariant kept across protocol versions is that frame 0 is a msgpack map
with an int "v" and a str "k", so an old peer can always be told what version it spoke.

Both ends of a connection also share from here :data:`STATS_ATTRIBUTE` and the frame helpers
:func:`send_frames` / :func:`recv_frames` (small frames copied, big ones not), so that the
client's and the actor's modules need not import each other.
"""

from __future__ import annotations

import enum
import io
import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import msgpack
import zmq
import zmq.backend

PROTOCOL = 5
"""Bumped on any incompatible change of the envelope, the kinds or their fields (2: small
payloads inline in the header; 3: plain scalar arguments and results as msgpack fields "a"
and "r"; 4: an INIT's pickle names the shipping functions in ``harness_zmq.shipping``, so an
older actor refuses it by version instead of failing to import them; 5: every connection is
CURVE, loopback included, and ``placed`` names the address its worker joined from,
``worker_addr``, which the client checks the endpoint against)."""

SCALARS = frozenset({int, float, bool, str, bytes, type(None)})
"""Types that travel as msgpack values ("a", "r") instead of pickles: msgpack round-trips each
exactly (ints beyond 64 bits do not pack: they fall back to a pickle)."""

INLINE_MAX = 16384
"""Pickle streams up to this many bytes travel inside the header frame as its bin field "p"
(their out-of-band buffers, if any, follow as frames)."""

# bigger buffers than this go out-of-band as their own frames; smaller ones stay in the pickle
# (a ZeroMQ frame costs more than copying a few KB)
OOB_MIN_BYTES = 4096

PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})
"""Types the C pickler pickles exactly as cloudpickle does, with nothing to send out of band."""

STATS_ATTRIBUTE = "__harness_stats__"
"""``GETATTR`` of this name answers the actor's counters instead of reading the object."""


class Kind(enum.StrEnum):
    """Every message kind. The header fields each kind carries are listed beside it."""

    # any peer -> master, and its answers
    HELLO = "hello"  # role: "client"|"worker", name, pid, host, cpus, gpus, harness (version)
    WELCOME = "welcome"  # peer_id, master (name), heartbeat_s
    REFUSED = "refused"  # reason (text naming both versions or the problem)
    HEARTBEAT = "heartbeat"  # peer_id (+ worker stats in the payload)
    BYE = "bye"  # peer_id: an orderly disconnect

    # client <-> master: placing actors
    PLACE = "place"  # id, cpus, gpus, memory_mb -> master picks a worker
    PLACED = "placed"  # id, actor_id, endpoint, worker_id, worker_addr, pid   |   id, error
    RELEASE = "release"  # actor_id
    ACTOR_DIED = "actor_died"  # actor_id, reason: master -> owning client

    # master <-> worker
    SPAWN = "spawn"  # id, actor_id, client_id, cpus, gpus, memory_mb
    SPAWNED = "spawned"  # id, actor_id, endpoint, pid   |   error
    KILL = "kill"  # actor_id
    EXITED = "exited"  # actor_id, reason (exit code / signal): worker -> master

    # client <-> actor (direct connection)
    INIT = "init"  # id; payload: (cls, args, kwargs, shipped modules)
    CALL = "call"  # id, m (method); payload: (args, kwargs)
    GETATTR = "getattr"  # id, name
    RESULT = "result"  # id; payload: the return value
    ERROR = "error"  # id, type, message, traceback
    PING = "ping"  # id
    PONG = "pong"  # id

    # anyone -> master: status for `harness cluster status` and the monitor
    STATUS = "status"  # id
    STATUS_REPLY = "status_reply"  # id; payload: the status dict (msgpack-able)
    STOP = "stop"  # asks the master to stop its cluster


_KINDS = {k.value: k for k in Kind}


class MalformedFrame(ValueError):
    """A message that does not follow the envelope; receivers count and drop it."""


@dataclass(slots=True)
class Message:
    kind: Kind
    header: dict[str, Any]
    payload: list[Any] = field(default_factory=list)
    """Raw payload frames (``zmq.Frame``/bytes): decode with :func:`loads`."""


def pack(kind: Kind, header: dict[str, Any] | None = None, obj: Any = None) -> list[Any]:
    """Frames for one message; ``obj`` (when not None) is pickled into the payload."""
    head = {"v": PROTOCOL, "k": kind.value}
    if header:
        head.update(header)
    frames: list[Any] = [msgpack.packb(head)]
    if obj is not None:
        frames += dumps(obj)
    return frames


def pack_data(kind: Kind, header: dict[str, Any] | None, data: Any) -> list[Any]:
    """Frames whose payload is msgpack (no pickle): for data read from any peer (status)."""
    head = {"v": PROTOCOL, "k": kind.value}
    if header:
        head.update(header)
    return [msgpack.packb(head), msgpack.packb(data)]


def header(frame: Any) -> dict[str, Any]:
    """Decode frame 0 alone: a msgpack map with an int "v" and a str "k" (hot paths use this
    instead of :func:`unpack`). Raises MalformedFrame otherwise."""
    try:
        head = msgpack.unpackb(_bytes(frame))
    except Exception as exc:  # msgpack raises several types on garbage
        raise MalformedFrame(f"header is not msgpack ({type(exc).__name__})") from None
    if type(head) is not dict:
        raise MalformedFrame(f"header is a {type(head).__name__}, not a map")
    if type(head.get("v")) is not int or not isinstance(head.get("k"), str):
        raise MalformedFrame("header lacks an int 'v' or a str 'k'")
    return head


def unpack(frames: Sequence[Any]) -> Message:
    """Decode the header of a received message (no payload is unpickled here).

    Raises MalformedFrame when frame 0 is not a msgpack map with int "v" and a known "k".
    A different "v" is not an error here: callers compare it with PROTOCOL and refuse."""
    if not frames:
        raise MalformedFrame("empty message")
    head = header(frames[0])
    kind = head["k"]
    if head["v"] == PROTOCOL:
        known = _KINDS.get(kind)
        if known is None:
            raise MalformedFrame(f"unknown message kind {kind[:40]!r}")
    else:  # another version: only its version can be trusted; let the caller refuse it
        known = Kind.HELLO if kind == Kind.HELLO.value else Kind.REFUSED
    inline = head.pop("p", None)
    if inline is not None and type(inline) is not bytes:
        raise MalformedFrame(f"header field 'p' is a {type(inline).__name__}, not bytes")
    if inline is not None:
        return Message(known, head, [inline, *frames[1:]])
    return Message(known, head, list(frames[1:]))


def payload(head: dict[str, Any], frames: Sequence[Any]) -> list[Any]:
    """The payload frames of a message whose header ``head`` was decoded from ``frames[0]``:
    the inline ``"p"`` field (see the module docstring) or frames 1..n."""
    inline = head.get("p")
    if inline is not None:
        return [inline, *frames[1:]]
    return list(frames[1:])


A_KEY = msgpack.packb("a")
"""The packed key of a CALL's scalar arguments (a msgpack array)."""
R_KEY = msgpack.packb("r")
"""The packed key of a RESULT's scalar value."""
P_KEY = msgpack.packb("p")
"""The packed key of the inline payload field: hot paths append ``P_KEY + packb(payload)`` to a
header map whose entry count they raised by one."""


def load_data(payload: Sequence[Any]) -> Any:
    """Decode a msgpack payload made by :func:`pack_data`."""
    if len(payload) != 1:
        raise MalformedFrame(f"expected one msgpack payload frame, got {len(payload)}")
    try:
        return msgpack.unpackb(_bytes(payload[0]))
    except Exception as exc:
        raise MalformedFrame(f"payload is not msgpack ({type(exc).__name__})") from None


class _Pickling(threading.local):
    """A cloudpickle pickler per thread, reused: building one costs more than pickling a
    small call."""

    def __init__(self) -> None:
        self.stream = io.BytesIO()
        self.buffers: list[Any] = []
        self.busy = False
        self.pickler = self.make()

    def make(self) -> Any:
        # self.buffers is replaced per dump: look it up at call time
        return cloudpickle.CloudPickler(
            self.stream, protocol=5, buffer_callback=lambda buf: _keep(buf, self.buffers)
        )


def _keep(buf: pickle.PickleBuffer, buffers: list[Any]) -> bool:
    """pickle's buffer_callback: small buffers stay in-band (True), big ones become frames."""
    raw = buf.raw()
    if raw.nbytes < OOB_MIN_BYTES:
        return True
    buffers.append(raw)
    return False


_pickling = _Pickling()
_PLAIN = PLAIN
_dump = pickle.Pickler.dump
_ndarray: Any
try:
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover - numpy is a dependency of harness
    _ndarray = None


_CONTAINERS = (dict, list, tuple)
PLAIN_MAX_ITEMS = 64
"""Containers bigger than this are not inspected (cloudpickle takes them as they are)."""


def plain(obj: Any, depth: int = 0) -> bool:
    """Whether the C pickler pickles ``obj`` exactly as cloudpickle would: builtin scalars,
    str, bytes, numpy arrays of a non-object dtype, and dicts, lists and tuples of those (up
    to 3 levels, ``PLAIN_MAX_ITEMS`` each): the fast path of :func:`dumps`. A rollout dict of
    arrays pickles in ~10 us this way against ~50 us through cloudpickle, whose per-object
    Python hook is what costs."""
    kind = type(obj)
    if kind in _PLAIN:
        return True
    if kind is _ndarray:
        return not obj.dtype.hasobject
    if kind not in _CONTAINERS or depth >= 3 or len(obj) > PLAIN_MAX_ITEMS:
        return False
    if kind is dict:
        for key, value in obj.items():
            if type(key) not in _PLAIN or not plain(value, depth + 1):
                return False
        return True
    return all(plain(value, depth + 1) for value in obj)


def dumps_plain(obj: Any) -> list[Any]:
    """:func:`dumps` with the C pickler, for values made of :func:`plain` parts only."""
    buffers: list[Any] = []
    data = pickle.dumps(obj, 5, buffer_callback=lambda buf: _keep(buf, buffers))
    return [data, *buffers] if buffers else [data]


# streams up to this size are copied out and the stream reused; bigger ones are handed out
# as they are (no copy) and the thread gets a fresh stream
_REUSE_STREAM_BYTES = 1 << 16


def dumps(obj: Any) -> list[Any]:
    """Pickle ``obj`` with protocol 5; large contiguous buffers (numpy arrays) become extra
    frames instead of being copied into the stream. Classes and functions defined in
    ``__main__`` or registered with ``cloudpickle.register_pickle_by_value`` travel by value."""
    if plain(obj):  # nothing cloudpickle would pickle differently
        return dumps_plain(obj)
    state = _pickling
    if state.busy:  # re-entered from a __reduce__: use a pickler of its own
        buffers: list[Any] = []
        stream = io.BytesIO()
        cloudpickle.CloudPickler(
            stream, protocol=5, buffer_callback=lambda buf: _keep(buf, buffers)
        ).dump(obj)
        return [stream.getbuffer(), *buffers]
    state.busy = True
    state.buffers = []
    stream = state.stream
    pickler = state.pickler
    try:
        _dump(pickler, obj)  # the C method: skips cloudpickle's Python wrapper
    except RecursionError as exc:
        state.stream = io.BytesIO()
        state.pickler = state.make()
        raise pickle.PicklingError(f"could not pickle the object: {exc}") from exc
    except BaseException:
        state.stream = io.BytesIO()  # the stream holds a partial pickle: start afresh
        state.pickler = state.make()
        raise
    finally:
        state.busy = False
        pickler.clear_memo()
        if pickler.globals_ref:
            pickler.globals_ref = {}
    buffers = state.buffers
    if stream.tell() <= _REUSE_STREAM_BYTES:
        data: Any = stream.getvalue()
        stream.seek(0)
        stream.truncate()
    else:
        data = stream.getbuffer()
        state.stream = io.BytesIO()
        state.pickler = state.make()
    return [data, *buffers] if buffers else [data]


def loads(payload: Sequence[Any]) -> Any:
    """Inverse of :func:`dumps` (only for payloads from authenticated peers).

    Raises MalformedFrame when the payload cannot be unpickled."""
    if not payload:
        raise MalformedFrame("message has no payload")
    try:
        if len(payload) == 1:
            return pickle.loads(_bytes(payload[0]))
        return pickle.loads(_bytes(payload[0]), buffers=[_buffer(f) for f in payload[1:]])
    except MalformedFrame:
        raise
    except Exception as exc:
        raise MalformedFrame(f"payload does not unpickle: {type(exc).__name__}: {exc}") from exc


def _bytes(frame: Any) -> Any:
    """bytes-like view of a frame (zmq.Frame, bytes or memoryview) without copying."""
    buffer = getattr(frame, "buffer", None)
    return buffer if buffer is not None else frame


def _buffer(frame: Any) -> Any:
    # numpy arrays rebuilt from out-of-band buffers must be writable like the originals: a
    # received zmq.Frame's buffer is writable (pyzmq >= 23) and used as it is (no copy); a
    # read-only one is copied once into a bytearray
    view = memoryview(_bytes(frame))
    return view if not view.readonly else bytearray(view)


# ------------------------------------------------------------------------------------------
# frames on a socket: small ones are copied (cheaper than a zmq.Frame), big ones are not

COPY_BELOW = 1 << 16
"""Frames smaller than this are sent and received by copy; bigger ones without copying."""


_SNDMORE = int(zmq.SNDMORE)
# the socket's own send, without pyzmq's Python wrapper (which costs more than the send)
_send = zmq.backend.Socket.send


def send_frames(sock: Any, frames: list[Any], zero_copy: bool = False) -> None:
    """Send one multipart message. ``zero_copy``: big frames are sent from the caller's
    buffers, which must then stay unchanged until the message is out (a blocking call);
    otherwise they are copied first (a snapshot: the caller may change them at once)."""
    send = _send
    if len(frames) == 2 and not zero_copy:
        send(sock, frames[0], _SNDMORE)
        send(sock, frames[1])
        return
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = _SNDMORE if i < last else 0
        if zero_copy and len(frame) >= COPY_BELOW:
            send(sock, frame, more, False)
        else:
            send(sock, frame, more)


def recv_frames(sock: Any, flags: int = 0) -> list[Any]:
    """Receive one multipart message as ``zmq.Frame`` objects: no copies, and ``Frame.more``
    is cheaper than asking the socket for ``RCVMORE``. Frames are buffers: msgpack and
    pickle read them directly."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames
