"""A cluster worker: registers with the master, runs actor processes for it.

One DEALER socket to the master and one thread running a ``zmq.Poller`` loop over that socket,
the actors' process sentinels (an actor's death is reported as soon as its sentinel fires) and
a wake-up pipe for spawn results. Each actor's stdout and stderr are captured on this host
(:mod:`harness_zmq.capture`): heartbeats carry what actors wrote since the previous one, and
an actor's ``exited`` notice carries its last lines. Waiting for a new actor to bind its
socket happens in a small thread pool, so hundreds of spawns never stall the heartbeats.

The worker sends ``hello`` (with the actors it runs as a msgpack payload, so a restarted master
can rebuild its tables), then a ``heartbeat`` with :func:`harness_zmq.monitor.host_stats` every
``heartbeat_s``. When the master has been silent for 3 heartbeats the worker opens a fresh
socket and says ``hello`` again, for as long as it runs; only the very first connection has a
deadline (``connect_timeout``), so a wrong address fails fast.

Run one with ``harness cluster join tcp://MASTER:7450 --cpus 8`` or in-process::

    worker = Worker("tcp://127.0.0.1:7450", cpus=2)
    threading.Thread(target=worker.run).start()
    ...
    worker.request_stop()
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from harness.errors import HarnessError
from harness_zmq import wire
from harness_zmq.command import CONNECT_TIMEOUT_S, add_worker_arguments
from harness_zmq.security import Guard, Keys, host_of, is_loopback, load_keys
from harness_zmq.wakeup import WakePipe
from harness_zmq.wire import Kind, MalformedFrame

log = logging.getLogger(__name__)

MISSED_BEATS = 3
SPAWN_READY_S = 60.0
_SPAWN_THREADS = 16
_SWEEP_S = 1.0  # exit codes are also polled this often, in case a sentinel is missed
LOG_ACTOR_BYTES = 4096
"""The most new output of one actor a heartbeat carries (the newest; the master marks a gap)."""
LOG_BEAT_BYTES = 256 * 1024
"""The most actor output one heartbeat carries in all (256 actors x 1 KiB; the rest waits)."""
TAIL_BYTES = 4096
"""The end of a dead actor's output sent with its ``exited`` notice."""


@dataclass(eq=False)
class _Actor:
    actor_id: str
    proc: Any  # actor.ActorProcess
    client_id: str
    cpus: float
    gpus: tuple[int, ...]
    memory_mb: int | None
    spawn_id: Any
    client_host: str = ""
    client_pid: int = 0
    state: str = "spawning"  # "spawning" | "running" | "killed" (asked to end) | "done"
    endpoint: str = ""
    sentinel: int | None = None
    released: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def default_host(master_address: str) -> str:
    """The address actors bind on when ``--host`` is not given: loopback for a loopback
    master, otherwise this host's address on the route to the master."""
    master_host = host_of(master_address).strip("[]")
    if is_loopback(master_host):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in master_host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((master_host, 9))  # UDP: no packet is sent, only a route is chosen
            return str(s.getsockname()[0])
    except OSError as exc:
        raise HarnessError(
            f"cannot find this host's address towards {master_host}: {exc}. Pass --host ADDR "
            f"(the address other hosts reach this one at)."
        ) from None


class Worker:
    """One worker host. Construct, then :meth:`run` (blocks) in one thread."""

    def __init__(
        self,
        master: str,
        *,
        cpus: float,
        gpus: Sequence[int] = (),
        host: str | None = None,
        keys: Keys | None = None,
        name: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        host_of(master)  # validates the form
        if cpus < 0:
            raise HarnessError(f"--cpus must be >= 0, got {cpus:g}")
        self.master = master
        self.cpus = cpus
        self.gpus = tuple(gpus)
        self.host = host or default_host(master)
        if keys is None and not (is_loopback(self.host) and is_loopback(host_of(master))):
            raise HarnessError(
                f"a worker for {master} whose actors listen on {self.host!r} needs CURVE keys: "
                f"pass --keys DIR (the directory made by 'harness cluster keys', copied to "
                f"this host)."
            )
        if keys is None:  # a cluster on this host: the keys its start recorded here
            from harness_zmq.clusters import cluster_keys

            keys = cluster_keys(master)
        self.keys: Keys = keys
        self.name = name or socket.gethostname()
        self.connect_timeout = connect_timeout
        self.heartbeat_s = 1.0
        self.peer_id: str | None = None
        self.malformed = 0
        self.actors: dict[str, _Actor] = {}
        self._gpus_free = list(self.gpus)
        self._stop = threading.Event()
        self._results: queue.SimpleQueue[tuple[str, str | None, str | None]] = queue.SimpleQueue()
        self._wakeup = WakePipe()
        self.context: zmq.Context[Any] = zmq.Context()
        self.guard = Guard(self.context, keys)
        self.sock: zmq.Socket[Any] | None = None
        self.launcher: Any = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._sentinels: dict[int, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Make :meth:`run` kill the actors and return (thread-safe, signal-safe)."""
        self._stop.set()
        self._wake()

    def run(self) -> None:
        """Serve the master until it says ``stop`` or :meth:`request_stop` is called.

        Raises HarnessError when the first connection gets no answer within
        ``connect_timeout`` or the master refuses this worker (another protocol version)."""
        from harness_zmq.launcher import ActorLauncher

        self.launcher = ActorLauncher(host=self.host, keys=self.keys, capture_logs=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _SPAWN_THREADS, thread_name_prefix="harness-spawn"
        )
        try:  # the zygote's imports happen before the heartbeats start, not in the first spawn
            self.launcher.warm()
        except HarnessError as exc:  # each spawn tries again and reports its own failure
            log.warning("%s", exc)
        started = time.monotonic()
        welcomed_once = False
        welcomed = False
        self._connect()
        hello_at = last_heard = time.monotonic()
        next_beat = next_sweep = 0.0
        try:
            while not self._stop.is_set():
                poller = zmq.Poller()
                assert self.sock is not None
                poller.register(self.sock, zmq.POLLIN)
                poller.register(self._wakeup.fd, zmq.POLLIN)
                for fd in self._sentinels:
                    poller.register(fd, zmq.POLLIN)
                now = time.monotonic()
                timeout = 0.5 * self.heartbeat_s if welcomed else 0.1
                if welcomed:
                    timeout = min(timeout, max(0.0, next_beat - now))
                events = dict(poller.poll(int(timeout * 1000)))
                if self.sock in events:
                    for kind, header in self._receive():
                        last_heard = time.monotonic()
                        if kind is Kind.WELCOME:
                            welcomed = welcomed_once = True
                            next_beat = 0.0
                        elif kind is Kind.STOP:
                            log.info("the master stopped the cluster")
                            self._stop.set()
                        elif kind is Kind.REFUSED:
                            raise HarnessError(
                                f"the master at {self.master} refused this worker: "
                                f"{header.get('reason', '?')}"
                            )
                        elif welcomed:
                            self._handle(kind, header)
                if self._wakeup.fd in events:
                    self._wakeup.drain()
                for fd in [fd for fd in events if isinstance(fd, int) and fd in self._sentinels]:
                    self._check_exit(self._sentinels[fd])
                self._collect_spawns()
                now = time.monotonic()
                if now >= next_sweep:
                    for actor in list(self.actors.values()):
                        self._check_exit(actor.actor_id)
                    next_sweep = now + _SWEEP_S
                silent = MISSED_BEATS * self.heartbeat_s
                if welcomed:
                    if now - last_heard > silent:
                        log.warning(
                            "master %s silent for %.1f s: connecting again",
                            self.master,
                            now - last_heard,
                        )
                        welcomed = False
                        self._connect()
                        hello_at = now
                    elif now >= next_beat:
                        self._heartbeat()
                        next_beat = now + self.heartbeat_s
                elif not welcomed_once and now - started > self.connect_timeout:
                    raise HarnessError(
                        f"no cluster master answered at {self.master} within "
                        f"{self.connect_timeout:g} s. Is 'harness cluster start' running "
                        f"there, is the address right"
                        + (", and are the --keys the cluster's?" if self.keys else "?")
                    )
                elif now - hello_at > max(silent, 1.0):
                    self._connect()
                    hello_at = now
        finally:
            self._shutdown(welcomed)

    def _shutdown(self, say_bye: bool) -> None:
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.sock is not None:
            if say_bye and self.peer_id is not None:
                self._send(Kind.BYE, {"peer_id": self.peer_id})
            self.sock.linger = 500
            self.sock.close()
            self.sock = None
        self.guard.close()
        if not self.context.closed:
            self.context.term()
        self._wakeup.close()
        log.info("worker stopped")

    def _wake(self) -> None:
        self._wakeup.wake()

    # -- talking to the master ---------------------------------------------------------------

    def _connect(self) -> None:
        """A fresh socket (nothing stale queued for a new master) and a hello."""
        if self.sock is not None:
            self.sock.linger = 0
            self.sock.close()
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 10_000
        sock.maxmsgsize = 16 * 2**20
        self.guard.client(sock)
        sock.connect(self.master)
        self.sock = sock
        running = [
            {
                "actor_id": a.actor_id,
                "client_id": a.client_id,
                "pid": int(a.proc.pid or 0),
                "endpoint": a.endpoint,
                "cpus": a.cpus,
                "gpus": len(a.gpus),
                "memory_mb": a.memory_mb,
                "client_host": a.client_host,
                "client_pid": a.client_pid,
            }
            for a in self.actors.values()
            if a.state == "running"
        ]
        header: dict[str, Any] = {
            "role": "worker",
            "name": self.name,
            "host": self.host,
            "pid": os.getpid(),
            "cpus": self.cpus,
            "gpus": list(self.gpus),
            "harness": _version(),
        }
        if self.peer_id is not None:
            header["peer_id"] = self.peer_id
        self._send_data(Kind.HELLO, header, {"actors": running})
        log.debug("hello sent to %s (%d running actors)", self.master, len(running))

    def _send(self, kind: Kind, header: dict[str, Any] | None = None) -> None:
        self._send_frames(wire.pack(kind, header))

    def _send_data(self, kind: Kind, header: dict[str, Any], data: Any) -> None:
        self._send_frames(wire.pack_data(kind, header, data))

    def _send_frames(self, frames: list[Any]) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # not connected (yet) and the queue is full: lost, like on a network
            log.debug("master unreachable: message dropped")

    def _heartbeat(self) -> None:
        from harness_zmq.monitor import host_stats

        stats = host_stats()
        stats["actors"] = len(self.actors)
        if self.launcher is not None and self.launcher.logs is not None:
            # only actors that wrote something since the last beat, newest bytes first: with
            # 256 quiet actors this adds nothing, with 256 chatty ones at most LOG_BEAT_BYTES
            stats["logs"] = self.launcher.logs.updates(LOG_ACTOR_BYTES, LOG_BEAT_BYTES)
        self._send_data(Kind.HEARTBEAT, {"peer_id": self.peer_id}, stats)

    def _receive(self) -> list[tuple[Kind, dict[Any, Any]]]:
        out: list[tuple[Kind, dict[Any, Any]]] = []
        assert self.sock is not None
        for _ in range(1000):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = wire.unpack(frames)
                if msg.kind is Kind.REFUSED or msg.header["v"] != wire.PROTOCOL:
                    reason = msg.header.get("reason")
                    if not isinstance(reason, str):
                        reason = (
                            f"it speaks protocol {msg.header['v']}, this worker {wire.PROTOCOL}"
                        )
                    out.append((Kind.REFUSED, {"reason": reason}))
                    continue
                if msg.kind is Kind.WELCOME:
                    peer_id = msg.header.get("peer_id")
                    beat = msg.header.get("heartbeat_s")
                    if not isinstance(peer_id, str) or not isinstance(beat, int | float):
                        raise MalformedFrame("welcome lacks peer_id or heartbeat_s")
                    if not 0.01 <= beat <= 600:
                        raise MalformedFrame(f"heartbeat_s {beat} out of range")
                    if peer_id != self.peer_id:
                        log.info("registered with %s as %s", self.master, peer_id)
                    self.peer_id, self.heartbeat_s = peer_id, float(beat)
                out.append((msg.kind, msg.header))
            except MalformedFrame as exc:
                self.malformed += 1
                log.debug("malformed message from the master dropped: %s", exc)
        return out

    def _handle(self, kind: Kind, header: dict[Any, Any]) -> None:
        try:
            if kind is Kind.SPAWN:
                self._spawn(header)
            elif kind is Kind.KILL:
                actor_id = header.get("actor_id")
                if not isinstance(actor_id, str):
                    raise MalformedFrame("kill lacks actor_id")
                self._kill(actor_id)
            elif kind is not Kind.HEARTBEAT:
                raise MalformedFrame(f"unexpected {kind.value} from the master")
        except MalformedFrame as exc:
            self.malformed += 1
            log.debug("malformed %s from the master dropped: %s", kind.value, exc)

    # -- actors ------------------------------------------------------------------------------

    def _spawn(self, h: dict[Any, Any]) -> None:
        actor_id = h.get("actor_id")
        client_id = h.get("client_id", "")
        cpus = h.get("cpus", 1.0)
        ngpus = h.get("gpus", 0)
        memory_mb = h.get("memory_mb")
        if (
            not isinstance(actor_id, str)
            or not isinstance(client_id, str)
            or isinstance(cpus, bool)
            or not isinstance(cpus, int | float)
            or isinstance(ngpus, bool)
            or not isinstance(ngpus, int)
            or not (memory_mb is None or (isinstance(memory_mb, int) and memory_mb > 0))
        ):
            raise MalformedFrame("spawn fields have the wrong types")
        spawn_id = h.get("id")
        if actor_id in self.actors:
            return  # a repeated spawn
        if ngpus > len(self._gpus_free):
            self._send(
                Kind.SPAWNED,
                {
                    "id": spawn_id,
                    "actor_id": actor_id,
                    "error": f"only {len(self._gpus_free)} "
                    f"of this worker's GPUs are free, {ngpus} asked",
                },
            )
            return
        gpus = tuple(self._gpus_free[:ngpus])
        del self._gpus_free[:ngpus]
        client_host = h.get("client_host", "")
        client_pid = h.get("client_pid", 0)
        try:
            proc = self.launcher.start(actor_id, cpus=float(cpus), gpus=gpus, memory_mb=memory_mb)
        except Exception as exc:
            self._gpus_free.extend(gpus)
            log.warning("could not start actor %s: %s", actor_id, exc)
            self._send(
                Kind.SPAWNED,
                {"id": spawn_id, "actor_id": actor_id, "error": f"{type(exc).__name__}: {exc}"},
            )
            return
        actor = _Actor(
            actor_id=actor_id,
            proc=proc,
            client_id=client_id,
            cpus=float(cpus),
            gpus=gpus,
            memory_mb=memory_mb,
            spawn_id=spawn_id,
            client_host=client_host if isinstance(client_host, str) else "",
            client_pid=client_pid if isinstance(client_pid, int) else 0,
        )
        self.actors[actor_id] = actor
        sentinel = getattr(proc, "sentinel", None)
        if isinstance(sentinel, int) and sentinel >= 0:
            actor.sentinel = sentinel
            self._sentinels[sentinel] = actor_id
        assert self._pool is not None
        future = self._pool.submit(proc.wait_ready, SPAWN_READY_S)
        future.add_done_callback(functools.partial(self._spawn_done, actor_id))

    def _spawn_done(self, actor_id: str, future: concurrent.futures.Future[Any]) -> None:
        """In a pool thread: hand the result to the loop."""
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            self._results.put((actor_id, str(future.result()), None))
        else:
            self._results.put((actor_id, None, f"{type(exc).__name__}: {exc}"))
        self._wake()

    def _collect_spawns(self) -> None:
        while True:
            try:
                actor_id, endpoint, error = self._results.get_nowait()
            except queue.Empty:
                return
            actor = self.actors.get(actor_id)
            if actor is None or actor.state != "spawning":
                continue
            if error is not None or endpoint is None:
                actor.proc.kill()
                self._forget(actor)
                self._send(
                    Kind.SPAWNED,
                    {"id": actor.spawn_id, "actor_id": actor_id, "error": error or "no endpoint"},
                )
                continue
            actor.state, actor.endpoint = "running", endpoint
            self._send(
                Kind.SPAWNED,
                {
                    "id": actor.spawn_id,
                    "actor_id": actor_id,
                    "endpoint": endpoint,
                    "pid": int(actor.proc.pid),
                },
            )
            log.debug("actor %s ready at %s (pid %d)", actor_id, endpoint, actor.proc.pid)

    def _kill(self, actor_id: str) -> None:
        actor = self.actors.get(actor_id)
        if actor is None:
            return
        actor.released = True
        actor.proc.kill()
        self._check_exit(actor_id)

    def _check_exit(self, actor_id: str) -> None:
        actor = self.actors.get(actor_id)
        if actor is None:
            return
        code = actor.proc.exitcode
        if code is None:
            return
        reason = (
            "released"
            if actor.released
            else f"killed by signal {-code}"
            if code < 0
            else f"exited with code {code}"
        )
        reason = f"actor process {actor.proc.pid} {reason}"
        was = actor.state
        self._forget(actor)
        tail = "" if actor.released else self._last_output(actor_id)
        if was == "spawning":
            error = f"{reason} while starting"
            if tail:
                error += f"; its last output:\n{tail}"
            self._send(Kind.SPAWNED, {"id": actor.spawn_id, "actor_id": actor_id, "error": error})
        else:
            header = {"actor_id": actor_id, "reason": reason}
            if tail:
                header["tail"] = tail
            self._send(Kind.EXITED, header)
        log.info("actor %s ended: %s", actor_id, reason)

    def _last_output(self, actor_id: str) -> str:
        """The end of what an ended actor wrote (for its client's ActorLost and the run's
        log): read to the end of its pipe, cut to whole lines."""
        if self.launcher is None:
            return ""
        return str(self.launcher.last_output(actor_id, TAIL_BYTES))

    def _forget(self, actor: _Actor) -> None:
        if self.actors.pop(actor.actor_id, None) is None:
            return
        actor.state = "done"
        if actor.sentinel is not None:
            self._sentinels.pop(actor.sentinel, None)
        self._gpus_free.extend(actor.gpus)
        with contextlib.suppress(Exception):
            actor.proc.close()  # frees its file descriptors (kills it if still running)


def _version() -> str:
    import harness

    return str(harness.__version__)


def parse_gpus(text: str) -> tuple[int, ...]:
    """'--gpus 0,1' -> (0, 1); '' -> ()."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HarnessError(f"--gpus takes device indices like 0,1; got {text!r}") from None


# ------------------------------------------------------------------------------------------
# process entry: python -m harness_zmq.worker (what harness cluster start runs)


def serve(args: argparse.Namespace) -> int:
    worker = Worker(
        args.address,
        cpus=args.cpus,
        gpus=parse_gpus(args.gpus),
        host=args.host,
        keys=load_keys(args.keys) if args.keys else None,
        name=args.name,
        connect_timeout=args.connect_timeout,
    )

    def on_signal(signum: int, frame: Any) -> None:
        worker.request_stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    print(
        f"harness cluster worker {worker.name}: {args.cpus:g} cpus for {args.address}, "
        f"actors on {worker.host}",
        flush=True,
    )
    worker.run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness_zmq.worker",
        description="Run a cluster worker in the foreground (harness cluster join runs one).",
    )
    add_worker_arguments(p)
    p.add_argument("-v", "--verbose", action="count", default=0)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return serve(args)
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
