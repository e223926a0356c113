"""The cluster master: registers workers and clients, places actors, watches heartbeats.

One ROUTER socket (loopback by default; any other interface only with CURVE keys) and one
thread running a ``zmq.Poller`` loop with timeouts. Every message is decoded with msgpack only
(headers and ``*_data`` payloads): the master never unpickles anything, so a peer can at worst
get itself refused or its message dropped.

Tables (:mod:`harness_zmq.tables`, which :class:`Master` extends with the socket, the loop and
the message handlers), rebuilt from the peers after a master restart:

- peers: workers and clients by ``peer_id`` (ROUTER identity -> peer id beside it);
- jobs: actors by ``actor_id`` (``spawning`` until the worker answers ``spawned``, then
  ``running``);
- pending placements: ``place`` requests that found no room yet (retried every tick, answered
  with an ``error`` after ``queue_s``);
- the live view (:mod:`harness_zmq.live`): the actors' output that workers push with their
  heartbeats and the runs' metrics that clients send with theirs, bounded.

A worker that re-sends ``hello`` (after a master restart, or after it was declared dead)
reports the actors it still runs; the master adopts them, kills those it already declared dead,
and reports as dead the ones it expected there but that are missing. Adopted actors whose
client does not come back (a client ``hello`` with the same ``peer_id``, or the same host and
pid) within a grace period are killed.

Run one with ``python -m harness_zmq.master --port 7450`` (what ``harness cluster start``
does) or in-process::

    master = Master(port=0)
    threading.Thread(target=master.run).start()
    ...
    master.request_stop()
"""

from __future__ import annotations

import argparse
import errno
import logging
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from harness.errors import HarnessError
from harness_zmq import wire
from harness_zmq.clusters import key_dir, private_state_dir
from harness_zmq.fields import (
    clean_gpus,
    clean_metrics,
    gpu_count,
    id_field,
    int_field,
    memory_field,
    number_field,
    output_chunks,
    payload_map,
    plain_number,
    reported_actor,
    text_field,
)
from harness_zmq.security import (
    Guard,
    InsecureBind,
    Keys,
    ephemeral_keys,
    is_loopback,
    load_keys,
    write_keys,
)
from harness_zmq.tables import Peer, Pending, Tables, harness_version
from harness_zmq.wire import Kind, MalformedFrame

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""Default heartbeat period told to every peer in ``welcome``."""
QUEUE_S = 3.0
"""How long a ``place`` request that finds no room waits for some before it is refused."""
SPAWN_TIMEOUT_S = 60.0
"""A worker that has not answered ``spawned`` by then: the placement fails, the actor is killed."""
MAX_MESSAGE_BYTES = 8 * 2**20
"""Bigger messages are dropped by ZeroMQ (the master only ever receives small ones)."""
TAIL_CHARS = 8192
"""The longest last output of a dead actor passed on to its client (workers send 4 KiB)."""
_DRAIN = 2000  # messages handled per poll wake-up before the periodic checks run again
_TICK_S = 0.1

_CLIENT_ID = re.compile(r"c[0-9]{1,12}-[0-9a-f]{4}")  # the ids this master gives clients


class Master(Tables):
    """The master of one cluster. Construct (binds), then :meth:`run` in one thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7450,
        *,
        keys: Keys | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        queue_s: float = QUEUE_S,
        spawn_timeout_s: float = SPAWN_TIMEOUT_S,
        monitor_port: int | None = None,
        monitor_host: str = "127.0.0.1",
    ) -> None:
        if heartbeat_s <= 0:
            raise HarnessError(f"heartbeat_s must be positive, got {heartbeat_s}")
        super().__init__(heartbeat_s, queue_s, spawn_timeout_s)
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.malformed = 0
        self.refused = 0
        self.foreign_output = 0  # output chunks for actors of another worker: dropped
        self._stop = threading.Event()
        self._next_tick = 0.0
        self._peer_address = ""  # the IP address the message being handled came from

        self.context: zmq.Context[Any] = zmq.Context()
        # a cluster always authenticates its peers: without --keys it makes its own, and
        # writes them (0700/0600) where this host's clients and workers look for them
        self._write_keys = keys is None
        if keys is None:
            if not is_loopback(host):
                raise InsecureBind(
                    f"refusing to listen on {host!r} without --keys: the other hosts need a "
                    f"copy of the cluster's keys. Create them with 'harness cluster keys DIR', "
                    f"copy DIR to every host and pass --keys DIR."
                )
            keys = _own_keys(host, port)
            self._write_keys = keys.directory is None
        self.keys: Keys = keys
        self.guard = Guard(self.context, keys)
        self.sock: zmq.Socket[Any] = self.context.socket(zmq.ROUTER)
        self.sock.linger = 1000
        self.sock.maxmsgsize = MAX_MESSAGE_BYTES
        self.sock.router_handover = True
        self.sock.sndhwm = 100_000
        self.sock.rcvhwm = 100_000
        self.monitor: Any = None
        self.monitor_token: str | None = None  # asked by a monitor off loopback
        try:
            self.guard.server(self.sock, host)
            try:
                self.sock.bind(f"tcp://{_bracket(host)}:{port}")
            except zmq.ZMQError as exc:
                raise _bind_error(host, port, exc) from None
            endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.port = int(endpoint.rpartition(":")[2])
            self.host = host
            self.address = f"tcp://{_bracket(host)}:{self.port}"
            if self._write_keys:
                private_state_dir()
                self.keys = write_keys(keys, key_dir(self.address))
            if monitor_port is not None:
                from harness_zmq.monitor import MonitorServer, make_token

                if not is_loopback(monitor_host):
                    # off loopback the monitor asks for a token: printed once by serve(),
                    # kept 0600 beside the keys
                    try:
                        self.monitor_token = make_token(self.keys.directory)
                    except OSError as exc:
                        raise HarnessError(
                            f"cannot write the monitor's token into {self.keys.directory}: "
                            f"{exc.strerror or exc}. Make the key directory writable or serve "
                            f"the monitor on 127.0.0.1."
                        ) from None

                try:
                    self.monitor = MonitorServer(
                        self.status,
                        monitor_host,
                        monitor_port,
                        token=self.monitor_token,
                        live=self.live,
                    ).start()
                except OSError as exc:
                    raise HarnessError(
                        f"cannot serve the monitor on {monitor_host}:{monitor_port}: "
                        f"{exc.strerror or exc}. Pick another --monitor-port."
                    ) from None
        except BaseException:
            self.close()
            raise
        log.info(
            "master %s listening (protocol %d, curve %s)",
            self.address,
            wire.PROTOCOL,
            "on",
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def monitor_url(self) -> str | None:
        return None if self.monitor is None else str(self.monitor.url)

    def request_stop(self) -> None:
        """Make :meth:`run` tell the workers to stop and return (thread-safe)."""
        self._stop.set()

    def run(self) -> None:
        """Serve until a ``stop`` message or :meth:`request_stop`; then stop the workers."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            try:
                while not self._stop.is_set():
                    now = time.monotonic()
                    timeout = max(0.0, min(self._next_tick - now, _TICK_S))
                    if poller.poll(int(timeout * 1000)):
                        self._drain()
                    now = time.monotonic()
                    if now >= self._next_tick:
                        with self._lock:
                            self._tick(now)
                        self._next_tick = now + _TICK_S
            except KeyboardInterrupt:
                log.info("interrupted")
            self._shutdown()
        finally:
            self.close()

    def close(self) -> None:
        """Release the socket, the monitor and the authenticator (idempotent)."""
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        if not self.sock.closed:
            self.sock.close()
        self.guard.close()
        if not self.context.closed:
            self.context.term()

    def _shutdown(self) -> None:
        with self._lock:
            for job in list(self.jobs.values()):
                self._notify_died(job, "the cluster was stopped")
            for peer in self.peers.values():
                if peer.role == "worker" and peer.alive:
                    self._send(peer.identity, Kind.STOP)
            self.jobs.clear()
        log.info("master %s stopped", self.address)

    # -- receiving ---------------------------------------------------------------------------

    def _drain(self) -> None:
        for _ in range(_DRAIN):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            # the address this message came from, as the kernel saw the connection (a
            # ROUTER's identity frame is made here, so the metadata is on the next one)
            try:
                self._peer_address = str(parts[-1].get("Peer-Address"))
            except zmq.ZMQError:
                self._peer_address = ""
            with self._lock:
                self._on_frames([p.bytes for p in parts])

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            self._malformed("a message without a header frame")
            return
        identity = frames[0]
        try:
            msg = wire.unpack(frames[1:])
        except MalformedFrame as exc:
            self._malformed(str(exc))
            return
        if msg.header["v"] != wire.PROTOCOL:
            self._refuse_version(identity, msg.header["v"])
            return
        handler = self._handlers.get(msg.kind)
        if msg.payload and msg.kind not in (Kind.HELLO, Kind.HEARTBEAT):
            self._malformed(f"{msg.kind.value} carries {len(msg.payload)} unexpected frames")
            return
        if handler is None:
            self._malformed(f"unexpected message kind {msg.kind.value!r} sent to the master")
            return
        try:
            handler(self, identity, msg)
        except MalformedFrame as exc:
            self._malformed(f"{msg.kind.value}: {exc}")
        except Exception:  # never crash on input; a bug shows in the log
            self.malformed += 1
            log.warning("error handling a %s message; dropped", msg.kind.value, exc_info=True)

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        log.debug("malformed message dropped: %s", why)

    def _refuse_version(self, identity: bytes, theirs: int) -> None:
        self.refused += 1
        reason = (
            f"protocol version mismatch: you speak protocol {theirs}, this master "
            f"(harness {harness_version()}) speaks protocol {wire.PROTOCOL}. Install the same "
            f"harness version on every host."
        )
        log.info("refused a peer speaking protocol %s (this master: %d)", theirs, wire.PROTOCOL)
        self._send(identity, Kind.REFUSED, {"reason": reason})

    def _send(
        self, identity: bytes, kind: Kind, header: dict[str, Any] | None = None, data: Any = None
    ) -> None:
        frames = wire.pack(kind, header) if data is None else wire.pack_data(kind, header, data)
        try:
            self.sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a full queue or an unroutable peer: the message is lost
            log.debug("could not send %s: %s", kind.value, exc)

    def _peer(self, identity: bytes, role: str | None = None) -> Peer | None:
        peer_id = self._by_identity.get(identity)
        peer = self.peers.get(peer_id) if peer_id is not None else None
        if peer is None or not peer.alive or (role is not None and peer.role != role):
            return None
        return peer

    # -- handlers ----------------------------------------------------------------------------

    def _on_hello(self, identity: bytes, msg: wire.Message) -> None:
        h = msg.header
        role = text_field(h, "role")
        if role not in ("worker", "client"):
            raise MalformedFrame(f"unknown role {role[:20]!r}")
        name = text_field(h, "name", "")
        host = text_field(h, "host", "")
        pid = int_field(h, "pid", 0)
        version = text_field(h, "harness", "", maxlen=64)
        cpus = number_field(h, "cpus", 0.0)
        gpus = gpu_count(h.get("gpus", 0), "gpus")
        previous = h.get("peer_id")
        if previous is not None and not isinstance(previous, str):
            raise MalformedFrame("field 'peer_id' must be a string")
        payload = payload_map(msg)
        actors = payload.get("actors", [])
        if role == "worker" and not isinstance(actors, list):
            raise MalformedFrame("hello payload 'actors' must be a list")
        reported = [reported_actor(a) for a in actors] if role == "worker" else []
        if version and version != harness_version():
            log.warning(
                "%s %s@%s runs harness %s, this master %s (same protocol %d: accepted)",
                role,
                name,
                host,
                version,
                harness_version(),
                wire.PROTOCOL,
            )
        now = time.monotonic()
        # an old registration of this connection (a re-sent hello) is replaced
        old_id = self._by_identity.pop(identity, None)
        peer = self.peers.get(previous) if previous is not None else None
        if peer is not None and peer.role != role:
            peer = None
        if peer is None and old_id is not None:
            old = self.peers.get(old_id)
            if old is not None and old.role == role:
                peer = old
        if peer is not None:  # the same peer again: keep its id, refresh everything else
            if peer.identity != identity:
                self._by_identity.pop(peer.identity, None)
            peer.identity = identity
            peer.name, peer.host, peer.pid, peer.version = name, host, pid, version
            peer.cpus, peer.gpus = cpus, gpus
            peer.alive, peer.last_seen = True, now
        else:
            # a peer that was registered with an earlier master life keeps its id
            if previous is not None and previous not in self.peers and 0 < len(previous) <= 64:
                peer_id = previous
            else:
                peer_id = f"{'w' if role == 'worker' else 'c'}{next(self._seq)}-{self._epoch}"
            peer = Peer(
                peer_id=peer_id,
                role=role,
                identity=identity,
                name=name,
                host=host,
                pid=pid,
                version=version,
                connected=now,
                last_seen=now,
                cpus=cpus,
                gpus=gpus,
            )
            self.peers[peer.peer_id] = peer
        self._by_identity[identity] = peer.peer_id
        peer.admitted = self._peer_address
        log.info(
            "%s %s joined: %s pid %d on %s%s",
            role,
            peer.peer_id,
            name or "-",
            pid,
            host or "?",
            f" ({cpus:g} cpus, {gpus} gpus)" if role == "worker" else "",
        )
        self._send(
            identity,
            Kind.WELCOME,
            {"peer_id": peer.peer_id, "heartbeat_s": self.heartbeat_s, "master": self.address},
        )
        if role == "worker":
            self._adopt(peer, reported, now)
        else:
            self._reclaim(peer)

    def _on_heartbeat(self, identity: bytes, msg: wire.Message) -> None:
        peer_id = text_field(msg.header, "peer_id")
        payload = payload_map(msg)
        peer = self._peer(identity)
        if peer is None:
            known = self.peers.get(peer_id)
            if known is None and _CLIENT_ID.fullmatch(peer_id):
                # a client of an earlier life of this master (clients need not say hello
                # again): registered from its heartbeat, it keeps its actors
                known = self._implicit_client(identity, peer_id)
            if known is None or not known.alive:
                # unknown here (a master restart) or declared dead: no answer, so the peer
                # notices the silence and sends hello again
                log.debug("heartbeat from unknown peer %s ignored", peer_id[:40])
                return
            # the same peer on a new connection (a TCP reconnect changes the identity)
            self._by_identity.pop(known.identity, None)
            known.identity = identity
            self._by_identity[identity] = known.peer_id
            peer = known
        elif peer.peer_id != peer_id:
            raise MalformedFrame("heartbeat names another peer_id than its connection's")
        peer.last_seen = time.monotonic()
        if peer.role == "worker":
            peer.stats = {
                "cpu_percent": plain_number(payload.get("cpu_percent")),
                "memory_mb": plain_number(payload.get("memory_mb")),
                "memory_total_mb": plain_number(payload.get("memory_total_mb")),
                "gpu": clean_gpus(payload.get("gpu")),
            }
            self._take_output(peer, payload.get("logs", []))
        else:
            metrics = payload.get("metrics", payload)
            if isinstance(metrics, dict):
                peer.metrics = clean_metrics(metrics)
                self.live.add_metrics(peer.peer_id, peer.name, peer.host, peer.metrics)
        self._send(identity, Kind.HEARTBEAT, {"peer_id": peer.peer_id})

    def _take_output(self, worker: Peer, chunks: Any) -> None:
        """The actors' output a worker's heartbeat carries, kept for the monitor: only for
        actors placed on that worker (or ended there), so no peer writes another's log."""
        try:
            items = output_chunks(chunks)
        except MalformedFrame as exc:  # the rest of the heartbeat still counts
            self._malformed(f"heartbeat of {worker.peer_id}: {exc}")
            return
        for actor_id, start, end, text in items:
            job = self.jobs.get(actor_id)
            if job is not None:
                if job.worker_id != worker.peer_id:
                    self.foreign_output += 1
                    continue
            elif self.live.owner(actor_id) != worker.peer_id:
                self.foreign_output += 1
                continue
            if not self.live.add_output(actor_id, worker.peer_id, start, end, text):
                self.foreign_output += 1

    def _implicit_client(self, identity: bytes, peer_id: str) -> Peer:
        now = time.monotonic()
        jobs = [j for j in self.jobs.values() if j.client_id == peer_id]
        peer = Peer(
            peer_id=peer_id,
            role="client",
            identity=identity,
            name="",
            host=jobs[0].client_host if jobs else "",
            pid=jobs[0].client_pid if jobs else 0,
            version="",
            connected=now,
            last_seen=now,
        )
        self.peers[peer_id] = peer
        self._by_identity[identity] = peer_id
        self._reclaim(peer)
        log.info("client %s registered again by its heartbeat (%d actors)", peer_id, len(jobs))
        return peer

    def _on_bye(self, identity: bytes, msg: wire.Message) -> None:
        text_field(msg.header, "peer_id", "")
        peer = self._peer(identity)
        if peer is None:
            return
        log.info("%s %s left", peer.role, peer.peer_id)
        self._peer_gone(peer, "left the cluster", remove=True)

    def _on_place(self, identity: bytes, msg: wire.Message) -> None:
        h = msg.header
        request_id = id_field(h)
        cpus = number_field(h, "cpus", 1.0)
        gpus = gpu_count(h.get("gpus", 0), "gpus")
        memory_mb = memory_field(h)
        if msg.payload:
            raise MalformedFrame("place carries no payload")
        client = self._peer(identity, "client")
        if client is None:
            self._send(
                identity,
                Kind.PLACED,
                {"id": request_id, "error": "this client is not registered: send hello first"},
            )
            return
        request = Pending(
            client.peer_id, request_id, cpus, gpus, memory_mb, time.monotonic() + self.queue_s
        )
        if not self.pending and self._try_place(request):
            return
        self.pending.append(request)

    def _on_release(self, identity: bytes, msg: wire.Message) -> None:
        actor_id = text_field(msg.header, "actor_id")
        client = self._peer(identity, "client")
        job = self.jobs.get(actor_id)
        if client is None or job is None or job.client_id != client.peer_id:
            return
        self._kill(job)

    def _on_spawned(self, identity: bytes, msg: wire.Message) -> None:
        h = msg.header
        actor_id = text_field(h, "actor_id")
        worker = self._peer(identity, "worker")
        if worker is None:
            return
        error = h.get("error")
        if error is not None and not isinstance(error, str):
            raise MalformedFrame("field 'error' must be a string")
        if error is None:
            endpoint = text_field(h, "endpoint")
            pid = int_field(h, "pid")
        job = self.jobs.get(actor_id)
        if job is None or job.worker_id != worker.peer_id:
            if error is None:  # nobody wants it any more
                self._send(identity, Kind.KILL, {"actor_id": actor_id})
            return
        if error is not None:
            if job.state == "spawning":
                self._fail_spawn(job, f"worker {worker.peer_id} could not start it: {error}")
            else:
                self._job_ended(job, error)
            return
        problem = self.endpoint_problem(worker, endpoint)
        if problem is not None:
            self._send(identity, Kind.KILL, {"actor_id": actor_id})
            if job.state == "spawning":
                self._fail_spawn(job, f"worker {worker.peer_id} reported a refused endpoint")
            else:
                self._job_ended(job, "its worker reported a refused endpoint")
            return
        job.endpoint, job.pid = endpoint, pid
        if job.state == "spawning":
            self._placed(job)

    def _on_exited(self, identity: bytes, msg: wire.Message) -> None:
        actor_id = text_field(msg.header, "actor_id")
        reason = text_field(msg.header, "reason", "exited", maxlen=1024)
        tail = text_field(msg.header, "tail", "", maxlen=TAIL_CHARS)
        worker = self._peer(identity, "worker")
        job = self.jobs.get(actor_id)
        if worker is None or job is None or job.worker_id != worker.peer_id:
            return
        if job.state == "spawning":
            self._fail_spawn(job, f"the actor process ended while starting ({reason})")
        else:
            self._job_ended(job, reason, tail)

    def _on_status(self, identity: bytes, msg: wire.Message) -> None:
        request_id = msg.header.get("id", 0)
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            raise MalformedFrame("field 'id' must be an int or a string")
        self._send(identity, Kind.STATUS_REPLY, {"id": request_id}, data=self.status())

    def _on_stop(self, identity: bytes, msg: wire.Message) -> None:
        log.info("stop requested")
        self._stop.set()

    _handlers = {  # noqa: RUF012 - a constant table of unbound methods
        Kind.HELLO: _on_hello,
        Kind.HEARTBEAT: _on_heartbeat,
        Kind.BYE: _on_bye,
        Kind.PLACE: _on_place,
        Kind.RELEASE: _on_release,
        Kind.SPAWNED: _on_spawned,
        Kind.EXITED: _on_exited,
        Kind.STATUS: _on_status,
        Kind.STOP: _on_stop,
    }


def _own_keys(host: str, port: int) -> Keys:
    """A master without --keys: the keys it wrote for this address before (a restarted master
    keeps its peers), else fresh ones (written once bound, :func:`write_keys`)."""
    if port:
        d = key_dir(f"tcp://{_bracket(host)}:{port}")
        if (d / "server.key_secret").exists():
            return load_keys(d)
    return ephemeral_keys()


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _bind_error(host: str, port: int, exc: zmq.ZMQError) -> HarnessError:
    address = f"tcp://{_bracket(host)}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return HarnessError(
            f"cannot start a master on {address}: port {port} is already in use (another "
            f"cluster? see 'harness cluster status {address}'). Pick another with --port."
        )
    if exc.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):
        return HarnessError(
            f"cannot start a master on {address}: {host!r} is not an address of this host."
        )
    return HarnessError(f"cannot start a master on {address}: {exc}")


# ------------------------------------------------------------------------------------------
# process entry: python -m harness_zmq.master


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness_zmq.master",
        description="Run a cluster master in the foreground (harness cluster start runs one).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=7450, help="port to listen on (0: any free)")
    p.add_argument("--keys", default=None, help="CURVE key directory (harness cluster keys)")
    p.add_argument("--monitor-port", type=int, default=None, help="serve the web monitor")
    p.add_argument("--monitor-host", default="127.0.0.1", help="the monitor's address")
    p.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S, help=argparse.SUPPRESS)
    p.add_argument("--queue-s", type=float, default=QUEUE_S, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def serve(args: argparse.Namespace) -> int:
    keys = load_keys(args.keys) if args.keys else None
    master = Master(
        args.host,
        args.port,
        keys=keys,
        heartbeat_s=args.heartbeat_s,
        queue_s=args.queue_s,
        monitor_port=args.monitor_port,
        monitor_host=args.monitor_host,
    )
    print(f"harness cluster master at {master.address}", flush=True)
    if master.monitor_url:
        print(f"monitor at {master.monitor_url}", flush=True)
    if master.monitor_token:
        print(f"monitor token: {master.monitor_token}", flush=True)
    master.run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return serve(args)
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr, flush=True)
        return 2


__all__ = ["Master", "main"]

if __name__ == "__main__":
    sys.exit(main())
