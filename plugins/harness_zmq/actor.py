"""An actor process: sets itself up in the fork the zygote made, then serves one remote object.

Started by :class:`~harness_zmq.launcher.ActorLauncher` (re-exported here, as are the
shipping names the ``INIT`` payload uses).

**Resources.** ``cpus`` sets ``OMP/MKL/OPENBLAS/NUMEXPR_NUM_THREADS`` (so torch, imported later,
uses that many threads), numpy's BLAS pool (threadpoolctl) and torch's if it is loaded;
``gpus`` sets ``CUDA_VISIBLE_DEVICES`` ("" for none); ``memory_mb`` sets ``RLIMIT_AS`` (the
address space: an allocation beyond it raises MemoryError inside the actor). Every actor
reseeds ``random`` and numpy's global generator (forks would otherwise share their state).

**Serving.** One ROUTER socket, always a CURVE server (loopback and ``ipc`` included) with the
keys its spawn request carries (only the admitted client keys get through the handshake), and
one client: ``INIT`` (payload ``(cls, args, kwargs, shipped_sources)``, the shipped sources
installed on ``sys.path`` before the class is unpickled), then ``CALL``, ``GETATTR`` and
``PING``. Exceptions in user code are answered with ``ERROR``; malformed
messages are counted and dropped (``PONG`` and ``GETATTR __harness_stats__`` report the
counters); another protocol version is answered ``REFUSED``; a second client gets ``ERROR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import resource
import signal
import sys
import traceback
from typing import Any

import msgpack
import zmq
import zmq.backend

from harness.remote import qualified_name
from harness_zmq import wire
from harness_zmq.launcher import ActorLauncher, ActorProcess
from harness_zmq.process import PARENT_CHECK_S, THREAD_VARIABLES, set_name, set_pdeathsig
from harness_zmq.security import Guard, Keys, set_process_keys
from harness_zmq.shipping import InitPayload, install_shipped, set_source_dir
from harness_zmq.wire import STATS_ATTRIBUTE, recv_frames, send_frames

# ActorLauncher, ActorProcess, InitPayload, install_shipped, STATS_ATTRIBUTE and the frame
# helpers were defined here before the split by job: their old import path keeps working
__all__ = [
    "STATS_ATTRIBUTE",
    "ActorLauncher",
    "ActorProcess",
    "InitPayload",
    "actor_main",
    "install_shipped",
    "recv_frames",
    "send_frames",
]

_MAX_TEXT = 20_000  # characters of an error message/traceback sent back
_SNDMORE = int(zmq.SNDMORE)
# the socket's own send, without pyzmq's Python wrapper (which costs more than the send)
_send = zmq.backend.Socket.send
_PLAIN = wire.PLAIN

IPC_PATH_MAX = 100
"""Longest Unix-domain socket path used (the kernel's limit is 107 bytes); longer: TCP."""


def actor_main(
    request: dict[str, Any],
    ready_fd: int,
    sentinel_fd: int,
    workdir: str,
    launcher_pid: int,
    output_fd: int | None = None,
) -> int:
    zygote_pid = int(request["zygote_pid"])
    set_pdeathsig()
    if os.getppid() != zygote_pid:  # the zygote died before the death signal was armed
        return 1
    if output_fd is not None:
        _capture_output(output_fd)
    set_name(f"harness-{request['actor_id']}")
    # sentinel_fd stays open until this process exits: the launcher's end turns readable then
    # (both descriptors were made non-inheritable by the zygote)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_source_dir(workdir)
    threads = max(1, round(float(request["cpus"])))
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in request["gpus"])
    os.environ["HARNESS_ACTOR_ID"] = request["actor_id"]
    # the keys came in the spawn request (never argv, the environment or a file): this actor
    # serves with them and its own sockets (remote acting) connect with them
    keys = Keys.from_material(request["keys"])
    set_process_keys(keys)
    if request.get("nice"):
        with contextlib.suppress(OSError):
            os.nice(int(request["nice"]))
    if threads > 1:
        with contextlib.suppress(Exception):
            from threadpoolctl import threadpool_limits

            threadpool_limits(threads)
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    if "numpy" in sys.modules:  # (numpy's own seed() without a value takes ~10 ms)
        sys.modules["numpy"].random.seed(seed & 0xFFFFFFFF)

    try:
        context = zmq.Context(1)
        sock = context.socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndhwm = 0
        sock.rcvhwm = 0
        guard = Guard(context, keys)
        host = request["host"]
        guard.server(sock, host)
        path = os.path.join(workdir, "actor.sock")
        if request.get("ipc") and len(path.encode()) <= IPC_PATH_MAX:
            # the directory is this actor's own (mode 0700, removed when it exits): only this
            # user's processes can reach it, and CURVE admits only its launcher's key
            endpoint = f"ipc://{path}"
            sock.bind(endpoint)
        else:
            bind_host = f"[{host}]" if ":" in host else host
            if ":" in host:
                sock.ipv6 = True
            port = sock.bind_to_random_port(f"tcp://{bind_host}")
            endpoint = f"tcp://{bind_host}:{port}"
    except Exception as exc:  # the launcher says why
        with contextlib.suppress(OSError):
            os.write(ready_fd, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        raise
    try:
        os.write(ready_fd, json.dumps({"endpoint": endpoint, "pid": os.getpid()}).encode())
    except BrokenPipeError:  # the launcher died while this actor started: no one to serve
        return 1
    os.close(ready_fd)
    if request["memory_mb"]:
        limit = int(request["memory_mb"]) * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open("/proc/self/statm") as statm:
                used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            if limit < used + (128 << 20):
                print(
                    f"harness actor {request['actor_id']}: memory_mb={request['memory_mb']} "
                    f"leaves little room: this process already maps {used >> 20} MB (the "
                    f"limit is on address space, not resident memory)",
                    file=sys.stderr,
                    flush=True,
                )
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    actor = _Actor(sock, request["actor_id"], threads)

    def parents_alive() -> bool:
        if os.getppid() != zygote_pid:
            return False
        try:
            os.kill(launcher_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    try:
        actor.serve(parents_alive)
    finally:
        with contextlib.suppress(Exception):
            guard.close()
            context.destroy(linger=0)
    return 0


def _capture_output(fd: int) -> None:
    """Make ``fd`` (the launcher's per-actor pipe) this process's stdout and stderr: C-level
    writes of a simulator, Python's prints and warnings and a crash's traceback all go there.
    Python's stdout becomes line-buffered (a pipe would otherwise buffer 8 KiB, and a process
    ending with ``os._exit`` or a signal would lose the last lines, the ones that say why)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # nothing of the zygote's goes into this actor's log
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _safe_text(value: object, limit: int = _MAX_TEXT) -> str:
    """``str(value)`` cut to ``limit`` characters; never raises (a user exception's
    ``__str__`` may)."""
    try:
        text = str(value)
    except BaseException as exc:
        text = f"<unprintable: {type(exc).__name__}>"
    if len(text) > limit:
        text = text[: limit // 2] + "\n...\n" + text[-limit // 2 :]
    return text


def _format_traceback(exc: BaseException) -> str:
    try:
        return _safe_text("".join(traceback.format_exception(exc)), 5 * _MAX_TEXT)
    except BaseException:
        return ""


class _Actor:
    """The serving loop of one actor process."""

    def __init__(self, sock: Any, actor_id: str, threads: int) -> None:
        self.wire = wire
        self.scalars = wire.SCALARS
        self.sock = sock
        self.actor_id = actor_id
        self.threads = threads
        self.client: bytes | None = None
        self.obj: Any = None
        self.init_error: str | None = None
        # a RESULT header up to its id (a msgpack map {"v", "k", "id": ...}): + packb(id)
        self.result_head = b"\x83" + b"".join(
            msgpack.packb(x) for x in ("v", wire.PROTOCOL, "k", "result", "id")
        )
        self.stats: dict[str, Any] = {
            "actor_id": actor_id,
            "pid": os.getpid(),
            "protocol": wire.PROTOCOL,
            "malformed": 0,
            "refused": 0,
            "calls": 0,
            "errors": 0,
        }

    def serve(self, parents_alive: Any) -> None:
        sock = self.sock
        sock.rcvtimeo = int(PARENT_CHECK_S * 1000)
        handle = self.handle
        stats = self.stats
        recv = sock.recv
        unpackb = msgpack.unpackb
        loads = pickle.loads
        protocol = self.wire.PROTOCOL
        while True:
            try:
                ident = recv(copy=False)
                frames: list[Any] = []
                frame = ident
                while frame.more:
                    frame = recv(copy=False)
                    frames.append(frame)
            except zmq.Again:
                if not parents_alive():
                    return
                continue
            except zmq.ContextTerminated:
                return
            except MemoryError:
                stats["errors"] += 1
                continue
            try:
                # the fast path: a well-formed call from our client
                obj = self.obj
                if obj is not None and frames and ident.bytes == self.client:
                    try:
                        head = unpackb(frames[0])
                    except Exception:
                        head = None
                    if (
                        type(head) is dict
                        and head.get("k") == "call"
                        and head.get("v") == protocol
                        and type(head.get("m")) is str
                        and type(head.get("id")) is int
                    ):
                        try:
                            inline = head.get("p")
                            if inline is not None:  # the pickle inline, buffers as frames
                                if len(frames) == 1:
                                    args, kwargs = loads(inline)
                                else:
                                    args, kwargs = loads(inline, buffers=frames[1:])
                            elif len(frames) == 1:  # scalars ("a")
                                args = head["a"]
                                if type(args) is not list:
                                    raise TypeError("'a' is not a list")
                                kwargs = {}
                            elif len(frames) == 2:
                                args, kwargs = loads(frames[1])
                            else:
                                args, kwargs = loads(frames[1], buffers=frames[2:])
                        except Exception:
                            pass  # the general path reports it
                        else:
                            stats["calls"] += 1
                            rid = head["id"]
                            try:
                                value = getattr(obj, head["m"])(*args, **kwargs)
                            except BaseException as exc:  # user code never ends the actor
                                self.error(ident, rid, exc)
                                continue
                            self.reply(ident, rid, value)
                            continue
                handle(ident.bytes, frames)
            except MemoryError:
                stats["errors"] += 1
            except Exception:  # a bug here must not end the actor
                stats["malformed"] += 1

    def send(self, ident: bytes, frames: list[Any]) -> None:
        sock = self.sock
        _send(sock, ident, _SNDMORE)
        send_frames(sock, frames)

    def error(self, ident: bytes, rid: Any, exc: BaseException | None, **fields: Any) -> None:
        self.stats["errors"] += 1
        if exc is not None:
            fields.setdefault("type", qualified_name(type(exc)))
            fields.setdefault("message", _safe_text(exc))
            fields.setdefault(
                "traceback",
                _format_traceback(exc),
            )
        fields.setdefault("traceback", "")
        try:
            frames = self.wire.pack(self.wire.Kind.ERROR, {"id": rid, **fields})
        except MemoryError:
            frames = self.wire.pack(
                self.wire.Kind.ERROR,
                {"id": rid, "type": "MemoryError", "message": "", "traceback": ""},
            )
        self.send(ident, frames)

    def reply(self, ident: bytes, rid: Any, value: Any) -> None:
        try:
            head = self.result_head + msgpack.packb(rid)
            if value is None:
                body: list[Any] = []
            elif type(value) in self.scalars:
                try:  # one frame, no pickle: {"v", "k", "id", "r": value}
                    frame = b"\x84" + head[1:] + self.wire.R_KEY + msgpack.packb(value)
                except OverflowError:  # an int beyond 64 bits
                    body = [pickle.dumps(value, 5)]
                else:
                    _send(self.sock, ident, _SNDMORE)
                    _send(self.sock, frame)
                    return
            elif type(value) in _PLAIN:
                body = [pickle.dumps(value, 5)]
            else:
                body = self.wire.dumps(value)  # numpy arrays take its C-pickler path
        except Exception as exc:
            self.error(ident, rid, exc, message=f"the result cannot be sent back: {exc!r}")
            return
        sock = self.sock
        send = _send
        send(sock, ident, _SNDMORE)
        if not body:
            send(sock, head)
        elif len(body[0]) <= self.wire.INLINE_MAX:  # the pickle inline (wire.py)
            inline = b"\x84" + head[1:] + self.wire.P_KEY + msgpack.packb(body[0])
            if len(body) == 1:
                send(sock, inline)
            else:  # out-of-band buffers follow as frames
                send_frames(sock, [inline, *body[1:]])
        elif len(body) == 1:
            send(sock, head, _SNDMORE)
            send(sock, body[0])
        else:
            send_frames(sock, [head, *body])

    def handle(self, ident: bytes, frames: list[Any]) -> None:
        wire = self.wire
        stats = self.stats
        try:
            msg = wire.unpack(frames)
        except wire.MalformedFrame:
            stats["malformed"] += 1
            return
        header = msg.header
        rid = header.get("id")
        if header["v"] != wire.PROTOCOL:
            stats["refused"] += 1
            self.send(
                ident,
                wire.pack(
                    wire.Kind.REFUSED,
                    {
                        "id": rid if isinstance(rid, int | str) else None,
                        "reason": f"protocol version mismatch: the peer speaks version "
                        f"{header['v']}, this actor speaks version {wire.PROTOCOL}",
                    },
                ),
            )
            return
        if not isinstance(rid, int | str):
            stats["malformed"] += 1
            return
        kind = msg.kind
        K = wire.Kind
        if kind is K.CALL:
            if ident != self.client:
                self.refuse(ident, rid)
                return
            method = header.get("m")
            if not isinstance(method, str):
                stats["malformed"] += 1
                return
            try:
                scalars = header.get("a")
                if scalars is not None:
                    if type(scalars) is not list or msg.payload:
                        raise wire.MalformedFrame("header field 'a' is not a list of arguments")
                    args, kwargs = scalars, {}
                else:
                    args, kwargs = wire.loads(msg.payload)
            except Exception as exc:
                stats["malformed"] += 1
                self.error(ident, rid, exc.__cause__ or exc)
                return
            stats["calls"] += 1
            if self.obj is None:
                self.error(ident, rid, None, type="HarnessError", message=self.not_ready())
                return
            try:
                value = getattr(self.obj, method)(*args, **kwargs)
            except BaseException as exc:  # user code, even sys.exit(), never ends the actor
                self.error(ident, rid, exc)
                return
            self.reply(ident, rid, value)
        elif kind is K.GETATTR:
            if ident != self.client:
                self.refuse(ident, rid)
                return
            name = header.get("name")
            if not isinstance(name, str):
                stats["malformed"] += 1
                return
            if name == STATS_ATTRIBUTE:
                self.reply(ident, rid, dict(stats))
                return
            if self.obj is None:
                self.error(ident, rid, None, type="HarnessError", message=self.not_ready())
                return
            try:
                value = getattr(self.obj, name)
            except BaseException as exc:
                self.error(ident, rid, exc)
                return
            self.reply(ident, rid, value)
        elif kind is K.PING:
            self.send(ident, wire.pack(K.PONG, {"id": rid, **stats}))
        elif kind is K.INIT:
            if self.client is not None:
                if ident != self.client:
                    self.refuse(ident, rid)
                else:
                    self.error(
                        ident, rid, None, type="HarnessError", message="actor already initialised"
                    )
                return
            self.client = ident
            try:
                cls, args, kwargs, _ = wire.loads(msg.payload)
            except Exception as exc:
                stats["malformed"] += 1
                cause = exc.__cause__ or exc
                self.init_error = f"{qualified_name(type(cause))}: {cause}"
                self.error(ident, rid, cause)
                return
            try:
                if self.threads and "torch" in sys.modules:
                    sys.modules["torch"].set_num_threads(self.threads)
                self.obj = cls(*args, **kwargs)
            except BaseException as exc:
                self.init_error = f"{qualified_name(type(exc))}: {_safe_text(exc)}"
                self.error(ident, rid, exc)
                return
            self.send(ident, wire.pack(K.RESULT, {"id": rid, "pid": os.getpid()}))
        else:  # a kind meant for the master or from an actor: not ours
            stats["malformed"] += 1

    def refuse(self, ident: bytes, rid: Any) -> None:
        self.stats["refused"] += 1
        message = (
            "this actor serves another client"
            if self.client is not None
            else "this actor has not been initialised (send INIT first)"
        )
        self.error(ident, rid, None, type="HarnessError", message=message)

    def not_ready(self) -> str:
        if self.init_error:
            return f"the actor's object failed to initialise: {self.init_error}"
        return "the actor's object is not initialised"
