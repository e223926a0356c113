"""The zygote: the fork server an :class:`~harness_zmq.launcher.ActorLauncher` starts.

It imports what every actor needs once (``PRELOAD``, plus the launcher's ``preload``), freezes
its heap and then only forks: each ``spawn`` request on its Unix socket pair becomes one actor
process (:func:`harness_zmq.actor.actor_main`). It never creates a ZeroMQ context or a
thread, so forking it is safe; each actor makes its own. It reports every actor's pid and exit
status to the launcher, kills its actors and exits when the launcher closes or dies. A spawn
request carries two descriptors (the ready and sentinel pipes) or three: the third becomes the
actor's stdout and stderr (per-actor output capture, :mod:`harness_zmq.capture`).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import importlib
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any

import msgpack

from harness_zmq.actor import actor_main
from harness_zmq.process import PARENT_CHECK_S, ready, set_name

__all__ = ["PRELOAD", "main"]

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
    "harness_zmq.shipping",
    "harness_zmq.actor",
)


def main() -> None:
    """Entry point of the zygote process (``python -P -c ...``)."""
    ctrl = socket.socket(fileno=int(os.environ.pop("HARNESS_ZYGOTE_FD")))
    launcher_pid = os.getppid()
    set_name("harness-zygote")
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
                data, fds, _, _ = socket.recv_fds(ctrl, 65536, 3)
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
            if len(fds) not in (2, 3) or request.get("t") != "spawn":
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
                    output = fds[2] if len(fds) == 3 else None  # its stdout and stderr
                    code = actor_main(request, fds[0], fds[1], workdir, launcher_pid, output)
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
            ready(ctrl, 0.05, select.POLLOUT)
        elif children:
            time.sleep(0.01)
    os._exit(0)
