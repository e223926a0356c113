"""Actor processes: a zygote that forks them cheaply, and the loop that serves one remote object.

    launcher = ActorLauncher(host="127.0.0.1", keys=None)
    proc = launcher.start("a1", cpus=1.0, gpus=(), memory_mb=None)   # non-blocking
    endpoint = proc.wait_ready(timeout=30.0)      # "tcp://127.0.0.1:PORT"
    proc.pid, proc.exitcode, proc.sentinel        # exitcode: None while alive, -9 after SIGKILL
    proc.kill()                                   # SIGKILL, idempotent
    launcher.close()                              # kills every actor it started

**The zygote.** The first ``start`` runs one fresh interpreter (``python -P``, so neither the
caller's cwd nor its script directory is on its path) that imports numpy, pyzmq, msgpack,
cloudpickle and this package, freezes its heap (``gc.freeze``) and then only forks. An actor is
a fork of it: it shares the zygote's pages (tens of MB) and starts in milliseconds. The zygote
never creates a ZeroMQ context or a thread, so forking it is safe; each actor makes its own.
Requests travel over a Unix socket pair, with two pipe ends per actor passed as file
descriptors: the actor writes its endpoint into the first and holds the second until it exits.
``proc.sentinel`` is a pidfd of the actor where the kernel has them (readable exactly when it
exits, even if children it forked still hold its descriptors), else the launcher's end of that
second pipe. The zygote reaps its children and reports their exit status; a zygote that died is
replaced by the next ``start``.

**Lifetime.** An actor dies with its zygote (``PR_SET_PDEATHSIG``, plus a parent-pid check
every second as a fallback); the zygote kills its actors and exits when the launcher closes or
its process dies (end of file on the socket pair, plus a parent-pid check).

**Resources.** ``cpus`` sets ``OMP/MKL/OPENBLAS/NUMEXPR_NUM_THREADS`` (so torch, imported later,
uses that many threads), numpy's BLAS pool (threadpoolctl) and torch's if it is loaded;
``gpus`` sets ``CUDA_VISIBLE_DEVICES`` ("" for none); ``memory_mb`` sets ``RLIMIT_AS`` (the
address space: an allocation beyond it raises MemoryError inside the actor). ``nice`` (of the
launcher) lowers every actor's priority: an embedded farm's learner shares the machine with
its actors and must not wait for a CPU behind hundreds of them. Every actor
reseeds ``random`` and numpy's global generator (forks would otherwise share their state).

**Serving.** One ROUTER socket (CURVE server when keys are given; a non-loopback host without
keys is refused) and one client: ``INIT`` (payload ``(cls, args, kwargs, shipped_sources)``,
the shipped sources installed on ``sys.path`` before the class is unpickled), then ``CALL``,
``GETATTR`` and ``PING``. Exceptions in user code are answered with ``ERROR``; malformed
messages are counted and dropped (``PONG`` and ``GETATTR __harness_stats__`` report the
counters); another protocol version is answered ``REFUSED``; a second client gets ``ERROR``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import pickle
import random
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import zmq
import zmq.backend

from harness.errors import HarnessError
from harness.remote import qualified_name
from harness_zmq.security import InsecureBind, Keys, is_loopback

log = logging.getLogger(__name__)

__all__ = ["STATS_ATTRIBUTE", "ActorLauncher", "ActorProcess", "InitPayload", "install_shipped"]

STATS_ATTRIBUTE = "__harness_stats__"
"""``GETATTR`` of this name answers the actor's counters instead of reading the object."""


def _ready(fd: Any, timeout: float | None, events: int = select.POLLIN) -> bool:
    """Whether ``fd`` (a descriptor or an object with ``fileno()``) is readable (or has
    ``events``) within ``timeout`` seconds (None: wait). ``poll``, not ``select``: a client
    with hundreds of actors holds descriptors beyond ``select``'s limit of 1024."""
    poller = select.poll()
    poller.register(fd, events | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000.0))


# what the zygote imports once so that every actor shares it
PRELOAD = (
    "numpy",
    "numpy.random",  # imported lazily by numpy 2: ~10 ms per actor otherwise
    "zmq",
    "msgpack",
    "cloudpickle",
    "harness.errors",
    "harness_zmq.wire",
    "harness_zmq.security",
    "harness_zmq.actor",
)

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

ZYGOTE_START_TIMEOUT_S = 60.0
PARENT_CHECK_S = 1.0
_PR_SET_PDEATHSIG = 1
_MAX_TEXT = 20_000  # characters of an error message/traceback sent back


# ------------------------------------------------------------------------------------------
# frames on a socket: small ones are copied (cheaper than a zmq.Frame), big ones are not

COPY_BELOW = 1 << 16
"""Frames smaller than this are sent and received by copy; bigger ones without copying."""


_SNDMORE = int(zmq.SNDMORE)
# the socket's own send, without pyzmq's Python wrapper (which costs more than the send)
_send = zmq.backend.Socket.send
_RCVMORE = int(zmq.RCVMORE)
_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


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


# ------------------------------------------------------------------------------------------
# the launcher side


class ActorProcess:
    """One actor process started by an :class:`ActorLauncher`."""

    def __init__(
        self, launcher: ActorLauncher, seq: int, actor_id: str, ready_fd: int, sentinel_fd: int
    ) -> None:
        self.actor_id = actor_id
        self._launcher = launcher
        self._seq = seq
        self._ready_fd: int | None = ready_fd
        self._sentinel = sentinel_fd
        self._pidfd: int | None = None  # None: not opened yet, -1: none to be had
        self._pid: int | None = None
        self._endpoint: str | None = None
        self._exitcode: int | None = None
        self._error: str | None = None
        self._lock = threading.Lock()
        self._fds_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<actor process {self.actor_id} pid={self._pid} exitcode={self._exitcode}>"

    @property
    def sentinel(self) -> int:
        """A file descriptor that turns readable when the process has exited: a pidfd where
        the kernel has them (exact even when the actor's own children outlive it), else (and
        until the zygote has reported the pid) the end of a pipe that only the actor holds
        open. Take it once per process where it keys a table."""
        fd = self._pidfd if self._pidfd is not None else self._open_pidfd()
        return fd if fd >= 0 else self._sentinel

    def _open_pidfd(self) -> int:
        if self._pidfd is None:
            if self._pid is None:
                # not reported yet: the pipe serves meanwhile. No waiting for the report here:
                # a cluster worker takes the sentinel inside its heartbeat loop
                return -1
            self._pidfd = -1
            if hasattr(os, "pidfd_open") and self._sentinel >= 0:
                try:
                    fd = os.pidfd_open(self._pid)
                except OSError:
                    return -1
                if _ready(self._sentinel, 0):
                    os.close(fd)  # it had exited already: the pid may not be its any more
                else:
                    self._pidfd = fd
        return self._pidfd

    @property
    def pid(self) -> int:
        """The process id (waits briefly for the zygote to report it after ``start``)."""
        if self._pid is None:
            deadline = time.monotonic() + 10.0
            while self._pid is None and self._error is None and time.monotonic() < deadline:
                if not self._launcher._pump(0.05):
                    break  # no zygote to tell
            if self._pid is None:
                raise HarnessError(
                    f"actor {self.actor_id}: the zygote reported no process id"
                    + (f" ({self._error})" if self._error else "")
                )
        return self._pid

    def _dead(self) -> bool:
        if self._sentinel < 0:
            return True
        return _ready(self.sentinel, 0)

    @property
    def exitcode(self) -> int | None:
        """None while alive; the exit status (negative: the signal) once it has exited."""
        if self._exitcode is not None or self._error is not None:
            return self._exitcode if self._exitcode is not None else -1
        if not self._dead():
            return None
        deadline = time.monotonic() + 3.0
        while self._exitcode is None and time.monotonic() < deadline:
            if not self._launcher._pump(0.05):
                break  # the zygote is gone: it cannot tell any more
        if self._exitcode is None:
            self._exitcode = -signal.SIGKILL
        return self._exitcode

    def is_alive(self) -> bool:
        return self._exitcode is None and self._error is None and not self._dead()

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait until the actor listens; return its endpoint ``tcp://HOST:PORT``."""
        with self._lock:
            if self._endpoint is not None:
                return self._endpoint
            deadline = time.monotonic() + timeout
            data = b""
            fd = self._ready_fd
            assert fd is not None
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HarnessError(f"actor {self.actor_id} did not start within {timeout:.0f}s")
                if not _ready(fd, min(left, 0.2)):
                    if self._error is not None:
                        break
                    self._launcher._pump(0)
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
            os.close(fd)
            self._ready_fd = None
            try:
                info = json.loads(data.decode())
                if "error" in info:
                    raise HarnessError(f"actor {self.actor_id} could not start: {info['error']}")
                self._endpoint = str(info["endpoint"])
                self._pid = int(info["pid"])
            except (ValueError, KeyError, TypeError):
                reason = self._error or f"exit code {self.exitcode}"
                raise HarnessError(
                    f"actor {self.actor_id} exited before it was ready ({reason}); "
                    f"its stderr is the launcher's"
                ) from None
            return self._endpoint

    def kill(self) -> None:
        """SIGKILL the actor (idempotent; nothing happens once it has exited). Does not wait
        for the zygote to report the actor's pid: until it has, the zygote is asked to kill
        the actor it forked for this request (it reads requests in order, so it has forked
        it by then)."""
        if self._exitcode is not None or self._error is not None or self._dead():
            return
        if self._pid is None:
            self._launcher._pump(0)  # the report may be waiting
        if self._pid is None and self._launcher._ask_zygote_to_kill(self._seq):
            return
        try:
            pid = self.pid  # (the zygote's socket is full: wait for the report instead)
        except HarnessError:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._open_pidfd() >= 0:
                signal.pidfd_send_signal(self._open_pidfd(), signal.SIGKILL)
            elif not self._dead():  # still running: the pid cannot have been reused yet
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill the actor and free its file descriptors (the sentinel becomes invalid)."""
        self.kill()
        # a wait_ready in another thread returns once the pipe ends (the actor is dead)
        locked = self._lock.acquire(timeout=5.0)
        try:
            if self._ready_fd is not None and locked:
                with contextlib.suppress(OSError):
                    os.close(self._ready_fd)
                self._ready_fd = None
            if self._sentinel >= 0 and self._exitcode is None and self._error is None:
                with contextlib.suppress(Exception):
                    self.exitcode  # noqa: B018 - cache it while the sentinel still works
            with self._fds_lock:  # a second close() (another thread) finds -1: no double close
                fds = [self._sentinel, -1 if self._pidfd is None else self._pidfd]
                self._sentinel = self._pidfd = -1
            for fd in fds:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        finally:
            if locked:
                self._lock.release()
        self._launcher._forget(self)


class ActorLauncher:
    """Starts actor processes on ``host`` (forks of one zygote process per launcher)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        keys: Keys | None = None,
        preload: Sequence[str] = (),
        nice: int = 0,
        ipc: bool = False,
    ) -> None:
        if keys is None and not is_loopback(host):
            raise InsecureBind(
                f"refusing to start actors listening on {host!r} without CURVE keys: any host "
                f"could connect. Generate keys with 'harness cluster keys DIR' and pass "
                f"--keys DIR (every host needs a copy), or bind 127.0.0.1."
            )
        self.host = host
        self.keys = keys
        self.nice = max(0, int(nice))  # added to each actor's niceness (a lower priority)
        # listen on a Unix-domain socket in the actor's private (0700) directory instead of
        # loopback TCP: only for actors whose callers are on this host (the local farm)
        self.ipc = bool(ipc) and keys is None
        # modules the zygote imports before forking, beyond PRELOAD: every actor then shares
        # them (torch is ~150 MB per process otherwise); HARNESS_ACTOR_PRELOAD adds more
        extra = [m for m in os.environ.get("HARNESS_ACTOR_PRELOAD", "").split(",") if m]
        self.preload = tuple(dict.fromkeys([*preload, *extra]))
        self._lock = threading.RLock()  # start/close and the zygote socket
        self._zygote: subprocess.Popen[bytes] | None = None
        self._ctrl: socket.socket | None = None
        self._procs: dict[int, ActorProcess] = {}
        self._pids: dict[int, ActorProcess] = {}
        self._seq = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<ActorLauncher {self.host} actors={len(self._procs)}>"

    def __enter__(self) -> ActorLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.pid if self._zygote is not None else None

    def start(
        self,
        actor_id: str,
        cpus: float = 1.0,
        gpus: Iterable[int] = (),
        memory_mb: int | None = None,
    ) -> ActorProcess:
        """Fork an actor (returns at once; ``wait_ready`` waits for its endpoint)."""
        request = {
            "t": "spawn",
            "actor_id": str(actor_id),
            "cpus": float(cpus),
            "gpus": [int(g) for g in gpus],
            "nice": self.nice,
            "memory_mb": int(memory_mb) if memory_mb else None,
            "host": self.host,
            "keys": str(self.keys.directory) if self.keys is not None else None,
            "ipc": self.ipc,
        }
        with self._lock:
            if self._closed:
                raise HarnessError("this actor launcher is closed")
            ctrl = self._ensure_zygote()
            self._seq += 1
            request["seq"] = self._seq
            ready_r, ready_w = os.pipe()
            sentinel_r, sentinel_w = os.pipe()
            try:
                socket.send_fds(ctrl, [msgpack.packb(request)], [ready_w, sentinel_w])
            except OSError as exc:
                for fd in (ready_r, sentinel_r):
                    os.close(fd)
                raise HarnessError(f"the actor zygote is gone ({exc})") from None
            finally:
                os.close(ready_w)
                os.close(sentinel_w)
            proc = ActorProcess(self, self._seq, str(actor_id), ready_r, sentinel_r)
            self._procs[self._seq] = proc
            return proc

    def warm(self) -> None:
        """Start the zygote now rather than with the first actor: a caller with deadlines of
        its own (a cluster worker's heartbeats) then never waits for its imports in
        :meth:`start`."""
        with self._lock:
            if self._closed:
                raise HarnessError("this actor launcher is closed")
            self._ensure_zygote()

    @property
    def processes(self) -> list[ActorProcess]:
        with self._lock:
            return list(self._procs.values())

    def close(self) -> None:
        """Kill every actor this launcher started and stop its zygote (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs = list(self._procs.values())
        for proc in procs:
            proc.kill()
        with self._lock:
            if self._ctrl is not None:
                with contextlib.suppress(OSError):
                    self._ctrl.shutdown(socket.SHUT_WR)  # the zygote kills the rest and exits
        zygote = self._zygote
        if zygote is not None:
            deadline = time.monotonic() + 5.0
            while zygote.poll() is None and time.monotonic() < deadline:
                # read its exit reports meanwhile: a full socket would block it
                if not self._pump(0.05):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        zygote.wait(timeout=max(0.0, deadline - time.monotonic()))
            if zygote.poll() is None:
                zygote.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    zygote.wait(timeout=5.0)
            while self._pump(0):  # the exit codes it reported on its way out
                pass
        for proc in procs:
            proc.close()
        with self._lock:
            if self._ctrl is not None:
                self._ctrl.close()
                self._ctrl = None

    # -- internals -----------------------------------------------------------------------
    def _ensure_zygote(self) -> socket.socket:
        if self._ctrl is not None:
            if self._zygote is None or self._zygote.poll() is None:
                return self._ctrl
            # the zygote died (its actors with it): collect its last reports, start anew
            log.warning("the actor zygote (pid %d) died; starting a new one", self._zygote.pid)
            while self._pump(0):
                pass
            self._ctrl.close()
            self._ctrl = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        for name in THREAD_VARIABLES:
            env[name] = "1"  # no BLAS thread pools in the zygote; actors set their own
        env["HARNESS_ZYGOTE_FD"] = str(theirs.fileno())
        env["HARNESS_ZYGOTE_PRELOAD"] = ",".join(self.preload)
        # the zygote must import this package even when the caller found it through its cwd
        # or script directory (python -P puts neither on the zygote's path)
        roots = {str(Path(__file__).resolve().parents[1])}
        import harness

        roots.add(str(Path(harness.__file__).resolve().parents[1]))
        old = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join([*sorted(roots), *([old] if old else [])])
        try:
            self._zygote = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-c",
                    "from harness_zmq.actor import _zygote_main as m; m()",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # Ctrl-C in the terminal goes to the caller only
            )
        finally:
            theirs.close()
        self._ctrl = ours
        deadline = time.monotonic() + ZYGOTE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not _ready(ours, 0.1):
                if self._zygote.poll() is not None:
                    break
                continue
            data = ours.recv(65536)
            if data and msgpack.unpackb(data).get("t") == "up":
                return ours
            break
        code = self._zygote.poll()
        self._ctrl = None
        ours.close()
        if code is None:
            self._zygote.kill()
        raise HarnessError(
            f"the actor zygote did not start (exit code {code}): see its stderr above"
        )

    def _pump(self, timeout: float) -> bool:
        """Read the zygote's reports (pids, exit codes); False once the zygote is gone."""
        with self._lock:
            ctrl = self._ctrl
            if ctrl is None:
                return False
            wait = timeout
            while _ready(ctrl, wait):
                try:
                    data = ctrl.recv(65536)
                except OSError:
                    return False
                if not data:
                    return False
                self._report(msgpack.unpackb(data))
                wait = 0
            return True

    def _ask_zygote_to_kill(self, seq: int) -> bool:
        """Send the zygote ``kill`` for the actor of request ``seq`` without blocking; False
        when it could not be sent (no zygote, or its socket is full)."""
        with self._lock:
            if self._ctrl is None:
                return False
            try:
                self._ctrl.send(msgpack.packb({"t": "kill", "seq": seq}), socket.MSG_DONTWAIT)
            except OSError:
                return False
            return True

    def _report(self, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "pid":
            proc = self._procs.get(msg["seq"])
            if proc is not None:
                proc._pid = int(msg["pid"])
                self._pids[proc._pid] = proc
        elif kind == "exit":
            proc = self._pids.get(msg["pid"])
            if proc is not None:
                proc._exitcode = int(msg["code"])
        elif kind == "error":
            proc = self._procs.get(msg["seq"])
            if proc is not None:
                proc._error = str(msg["error"])

    def _forget(self, proc: ActorProcess) -> None:
        with self._lock:
            self._procs.pop(proc._seq, None)
            if proc._pid is not None:
                self._pids.pop(proc._pid, None)


# ------------------------------------------------------------------------------------------
# the zygote


_PR_SET_NAME = 15


def _prctl(option: int, value: Any) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(option, value, 0, 0, 0)


def _set_pdeathsig() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _set_name(name: str) -> None:
    """The process name ps/top show in their COMM column (15 bytes)."""
    _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def _zygote_main() -> None:
    """Entry point of the zygote process (``python -P -c ...``)."""
    ctrl = socket.socket(fileno=int(os.environ.pop("HARNESS_ZYGOTE_FD")))
    launcher_pid = os.getppid()
    _set_name("harness-zygote")
    extra = [m for m in os.environ.pop("HARNESS_ZYGOTE_PRELOAD", "").split(",") if m]
    for name in (*PRELOAD, *extra):
        try:
            importlib.import_module(name)
        except ImportError as exc:  # still usable, just slower to fork
            print(f"harness actor zygote: cannot preload {name}: {exc}", file=sys.stderr)
    gc.collect()
    gc.freeze()  # keep the shared heap out of every actor's garbage collections

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, str] = {}  # pid -> its temporary directory
    pids: dict[int, int] = {}  # request seq -> pid, while that child lives

    outbox: collections.deque[bytes] = collections.deque()

    def flush() -> None:
        # never blocks: a launcher that reads late must not stall spawning (it would wait
        # for a zygote blocked on sending it reports)
        while outbox:
            try:
                ctrl.send(outbox[0], socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                outbox.clear()
                return
            outbox.popleft()

    def send(msg: dict[str, Any]) -> None:
        outbox.append(msgpack.packb(msg))
        flush()

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            shutil.rmtree(children.pop(pid, ""), ignore_errors=True)
            for seq in [seq for seq, child in pids.items() if child == pid]:
                del pids[seq]
            send({"t": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    send({"t": "up", "pid": os.getpid()})
    poller = select.poll()
    ctrl_fd = ctrl.fileno()
    poller.register(ctrl_fd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    running = True
    while running:
        poller.modify(ctrl_fd, select.POLLIN | (select.POLLOUT if outbox else 0))
        try:
            # reports waiting (the launcher's queue was full): retry on POLLOUT, and soon
            events = poller.poll(20 if outbox else PARENT_CHECK_S * 1000)
        except InterruptedError:
            events = []
        flush()
        for fd, event in events:
            if fd == ctrl_fd and event & (select.POLLHUP | select.POLLERR):
                # the launcher's end is closed (its process died: a graceful close only shuts
                # down writing): the requests still queued have no one waiting for them
                running = False
                break
            if fd == ctrl_fd and not event & select.POLLIN:
                continue  # only writable: flushed above
            if fd == wake_r:
                with contextlib.suppress(OSError):
                    while os.read(wake_r, 4096):
                        pass
                continue
            try:
                data, fds, _, _ = socket.recv_fds(ctrl, 65536, 2)
            except OSError:
                running = False
                break
            if not data:
                running = False
                break
            for received in fds:  # a program the actor runs must not hold them
                os.set_inheritable(received, False)
            request = msgpack.unpackb(data)
            if request.get("t") == "kill" and not fds:  # an actor whose pid was not known yet
                pid = pids.get(request.get("seq"), 0)
                if pid in children:  # (not reaped: the pid is still that child's)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                continue
            if len(fds) != 2 or request.get("t") != "spawn":
                for stray in fds:
                    os.close(stray)
                continue
            if os.getppid() != launcher_pid:  # gone, though a fork of it holds the socket
                running = False
                break
            workdir = tempfile.mkdtemp(prefix=f"harness-actor-{request['seq']}-")
            request["zygote_pid"] = os.getpid()
            try:
                pid = os.fork()
            except OSError as exc:
                shutil.rmtree(workdir, ignore_errors=True)
                for stray in fds:
                    os.close(stray)
                send({"t": "error", "seq": request["seq"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:  # the actor
                code = 1
                try:
                    ctrl.close()
                    signal.set_wakeup_fd(-1)
                    os.close(wake_r)
                    os.close(wake_w)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    code = _actor_main(request, fds[0], fds[1], workdir, launcher_pid)
                except BaseException:
                    with contextlib.suppress(Exception):
                        traceback.print_exc()
                finally:
                    with contextlib.suppress(Exception):
                        sys.stdout.flush()
                        sys.stderr.flush()
                    os._exit(code)
            for received_fd in fds:
                os.close(received_fd)
            children[pid] = workdir
            pids[request["seq"]] = pid
            send({"t": "pid", "seq": request["seq"], "pid": pid})
        reap()
        if os.getppid() != launcher_pid:
            running = False
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (children or outbox) and time.monotonic() < deadline:
        reap()
        flush()
        if outbox:  # the launcher may still read the last reports
            _ready(ctrl, 0.05, select.POLLOUT)
        elif children:
            time.sleep(0.01)
    os._exit(0)


# ------------------------------------------------------------------------------------------
# the actor

IPC_PATH_MAX = 100
"""Longest Unix-domain socket path used (the kernel's limit is 107 bytes); longer: TCP."""
_SOURCE_DIR: str | None = None  # where shipped sources go (the actor's temporary directory)


def _actor_main(
    request: dict[str, Any], ready_fd: int, sentinel_fd: int, workdir: str, launcher_pid: int
) -> int:
    global _SOURCE_DIR
    zygote_pid = int(request["zygote_pid"])
    _set_pdeathsig()
    if os.getppid() != zygote_pid:  # the zygote died before the death signal was armed
        return 1
    _set_name(f"harness-{request['actor_id']}")
    # sentinel_fd stays open until this process exits: the launcher's end turns readable then
    # (both descriptors were made non-inheritable by the zygote)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SOURCE_DIR = workdir
    threads = max(1, round(float(request["cpus"])))
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in request["gpus"])
    os.environ["HARNESS_ACTOR_ID"] = request["actor_id"]
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

    import zmq

    from harness_zmq.security import Guard, load_keys

    try:
        context = zmq.Context(1)
        sock = context.socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndhwm = 0
        sock.rcvhwm = 0
        keys = load_keys(request["keys"]) if request["keys"] else None
        guard = Guard(context, keys)
        host = request["host"]
        guard.server(sock, host)
        path = os.path.join(workdir, "actor.sock")
        if request.get("ipc") and keys is None and len(path.encode()) <= IPC_PATH_MAX:
            # the directory is this actor's own (mode 0700, removed when it exits): only this
            # user's processes can connect, as with loopback TCP, at less cost per message
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
        from harness_zmq import wire

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


# ------------------------------------------------------------------------------------------
# shipping local code: the INIT payload installs sources before it unpickles the class

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def install_shipped(sources: Mapping[str, Any]) -> Mapping[str, Any]:
    """Write shipped sources under the actor's directory and put it first on ``sys.path``.

    ``sources`` maps a top-level module name to its source text (a module) or to a mapping
    ``relative path -> source text`` (the files of a package, paths starting with its name)."""
    if not sources:
        return sources
    root = _SOURCE_DIR
    if root is None:  # not in an actor (tests): a directory of our own
        root = _SOURCE_DIR_FALLBACK.setdefault("dir", tempfile.mkdtemp(prefix="harness-src-"))
    base = Path(root, "shipped")
    for name, source in sources.items():
        if not _MODULE_NAME.match(str(name)):
            raise HarnessError(f"refusing shipped module with the name {name!r}")
        if isinstance(source, str):
            files = {f"{name}.py": source}
        elif isinstance(source, Mapping):
            files = dict(source)
        else:
            raise HarnessError(f"shipped module {name!r}: expected text or a mapping of files")
        for rel, text in files.items():
            path = Path(rel)
            if (
                path.is_absolute()
                or ".." in path.parts
                or path.parts[0] != (name if isinstance(source, Mapping) else f"{name}.py")
            ):
                raise HarnessError(f"refusing shipped file {rel!r} of module {name!r}")
            target = base / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    importlib.invalidate_caches()
    return sources


_SOURCE_DIR_FALLBACK: dict[str, str] = {}


def _init_tuple(sources: Any, cls: Any, args: Any, kwargs: Any) -> tuple[Any, Any, Any, Any]:
    return (cls, args, kwargs, sources)


class _Install:
    """Unpickles as ``install_shipped(sources)``: placed first in the INIT pickle."""

    __slots__ = ("sources",)

    def __init__(self, sources: Mapping[str, Any]) -> None:
        self.sources = sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (install_shipped, (dict(self.sources),))


class InitPayload:
    """The INIT payload. Unpickles as the tuple ``(cls, args, kwargs, shipped_sources)``,
    installing the shipped sources before the class, its arguments or anything else in it
    is unpickled (so they may refer to modules that only exist as shipped sources)."""

    __slots__ = ("args", "cls", "kwargs", "sources")

    def __init__(
        self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any], sources: Mapping[str, Any]
    ) -> None:
        self.cls, self.args, self.kwargs, self.sources = cls, args, kwargs, sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (_init_tuple, (_Install(self.sources), self.cls, self.args, self.kwargs))
