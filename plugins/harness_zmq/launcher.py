"""The actor launcher: starts actor processes as forks of one zygote, and their handles.

    launcher = ActorLauncher(host="127.0.0.1", keys=None)  # None: fresh keys, in memory
    proc = launcher.start("a1", cpus=1.0, gpus=(), memory_mb=None)   # non-blocking
    endpoint = proc.wait_ready(timeout=30.0)      # "tcp://127.0.0.1:PORT"
    proc.pid, proc.exitcode, proc.sentinel        # exitcode: None while alive, -9 after SIGKILL
    proc.kill()                                   # SIGKILL, idempotent
    launcher.close()                              # kills every actor it started

**The zygote** (:mod:`harness_zmq.zygote`). The first ``start`` runs one fresh interpreter
(``python -P``, so neither the caller's cwd nor its script directory is on its path) that
imports numpy, pyzmq, msgpack, cloudpickle and this package, freezes its heap (``gc.freeze``)
and then only forks. An actor is a fork of it: it shares the zygote's pages (tens of MB) and
starts in milliseconds. Requests travel over a Unix socket pair that only the launcher and the
zygote hold (each carries the actor's CURVE keys: nothing on disk or on a command line), with
two pipe ends per actor passed as file descriptors: the actor writes its endpoint into the
first and holds the second until it exits. ``proc.sentinel`` is a pidfd of the actor where
the kernel has them (readable exactly when it exits, even if children it forked still hold
its descriptors), else the launcher's end of that second pipe. The zygote reaps its children
and reports their exit status; a zygote that died is replaced by the next ``start``.

**Lifetime.** An actor dies with its zygote (``PR_SET_PDEATHSIG``, plus a parent-pid check
every second as a fallback); the zygote kills its actors and exits when the launcher closes or
its process dies (end of file on the socket pair, plus a parent-pid check).

**Output.** With ``capture_logs=True`` each actor's stdout and stderr go to a pipe of its own
(the third descriptor of its spawn request) that :attr:`ActorLauncher.logs`
(:class:`~harness_zmq.capture.ActorLogs`) reads into a bounded ring per actor; a cluster
worker streams them to the master and sends the last lines of an actor that died with its
death notice. Without it, actors write to the launcher's own stdout and stderr.

**Resources.** ``cpus``, ``gpus`` and ``memory_mb`` are applied in the actor (see
:mod:`harness_zmq.actor`). ``nice`` (of the launcher) lowers every actor's priority: an
embedded farm's learner shares the machine with its actors and must not wait for a CPU behind
hundreds of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from harness.errors import HarnessError
from harness_zmq.capture import ActorLogs
from harness_zmq.process import THREAD_VARIABLES, ready
from harness_zmq.security import InsecureBind, Keys, ephemeral_keys, is_loopback

log = logging.getLogger(__name__)

__all__ = ["ActorLauncher", "ActorProcess"]

ZYGOTE_START_TIMEOUT_S = 60.0


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
                if ready(self._sentinel, 0):
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
        return ready(self.sentinel, 0)

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
                if not ready(fd, min(left, 0.2)):
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
        capture_logs: bool = False,
        echo_logs: bool = False,
    ) -> None:
        if keys is None:
            if not is_loopback(host):
                raise InsecureBind(
                    f"refusing to start actors listening on {host!r} without CURVE keys: any "
                    f"host could connect. Generate keys with 'harness cluster keys DIR' and "
                    f"pass --keys DIR (every host needs a copy)."
                )
            # actors always authenticate their caller: on this host, with keys made for this
            # launcher alone (in memory, handed over in each spawn request)
            keys = ephemeral_keys()
        self.host = host
        self.keys: Keys = keys
        self.nice = max(0, int(nice))  # added to each actor's niceness (a lower priority)
        # listen on a Unix-domain socket in the actor's private (0700) directory instead of
        # loopback TCP: only for actors whose callers are on this host (the local farm)
        self.ipc = bool(ipc) and is_loopback(host)
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
        # each actor's stdout/stderr, kept per actor (harness_zmq.capture); otherwise actors
        # write to this process's descriptors
        self.logs: ActorLogs | None = None
        if capture_logs:
            self.logs = ActorLogs(echo_fd=2 if echo_logs else None)

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
            # the secret keys travel only here: over the socket pair that only this process
            # and its zygote hold, into the actor's memory
            "keys": self.keys.material(),
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
            passed = [ready_w, sentinel_w]
            if self.logs is not None:  # third descriptor: the actor's fd 1 and 2
                passed.append(self.logs.open(str(actor_id)))
            try:
                socket.send_fds(ctrl, [msgpack.packb(request)], passed)
            except OSError as exc:
                for fd in (ready_r, sentinel_r):
                    os.close(fd)
                raise HarnessError(f"the actor zygote is gone ({exc})") from None
            finally:
                for fd in passed:
                    os.close(fd)
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
        if self.logs is not None:
            self.logs.close()

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
                    "from harness_zmq.zygote import main as m; m()",
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
            if not ready(ours, 0.1):
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
            while ready(ctrl, wait):
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
        if self.logs is not None:
            self.logs.finish(proc.actor_id)

    def last_output(self, actor_id: str, max_bytes: int = 4096) -> str:
        """The end of what an actor whose process has exited wrote ("" without
        ``capture_logs``): its pipe is read to the end first, so its last lines are in."""
        if self.logs is None:
            return ""
        self.logs.finish(actor_id)
        return self.logs.tail(actor_id, max_bytes)
