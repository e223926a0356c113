"""The cluster master: registers workers and clients, places actors, watches heartbeats.

One ROUTER socket (loopback by default; any other interface only with CURVE keys) and one
thread running a ``zmq.Poller`` loop with timeouts. Every message is decoded with msgpack only
(headers and ``*_data`` payloads): the master never unpickles anything, so a peer can at worst
get itself refused or its message dropped.

Tables, rebuilt from the peers after a master restart:

- peers: workers and clients by ``peer_id`` (ROUTER identity -> peer id beside it);
- jobs: actors by ``actor_id`` (``spawning`` until the worker answers ``spawned``, then
  ``running``);
- pending placements: ``place`` requests that found no room yet (retried every tick, answered
  with an ``error`` after ``queue_s``).

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
import collections
import errno
import itertools
import logging
import math
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from harness.errors import HarnessError
from harness_zmq import wire
from harness_zmq.security import Guard, Keys, load_keys
from harness_zmq.wire import Kind, MalformedFrame

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""Default heartbeat period told to every peer in ``welcome``."""
MISSED_BEATS = 3
"""A peer silent for this many heartbeats is dead."""
QUEUE_S = 3.0
"""How long a ``place`` request that finds no room waits for some before it is refused."""
SPAWN_TIMEOUT_S = 60.0
"""A worker that has not answered ``spawned`` by then: the placement fails, the actor is killed."""
ORPHAN_GRACE_BEATS = 10
"""After a master restart, adopted actors wait this many heartbeats for their client."""
MAX_MESSAGE_BYTES = 8 * 2**20
"""Bigger messages are dropped by ZeroMQ (the master only ever receives small ones)."""
DEAD_WORKER_KEEP_S = 3600.0
"""Dead workers stay in the status (``alive: false``) this long."""
_GONE_MEMORY = 100_000
_DRAIN = 2000  # messages handled per poll wake-up before the periodic checks run again
_TICK_S = 0.1

_CLIENT_ID = re.compile(r"c[0-9]{1,12}-[0-9a-f]{4}")  # the ids this master gives clients
_CLIENT_METRICS = {"steps_per_s": 0.0, "policy_lag": 0.0, "inbox": 0, "dropped": 0}


def _version() -> str:
    import harness

    return str(harness.__version__)


# ------------------------------------------------------------------------------------------
# header field validation: a wrong type is a malformed message, never an exception elsewhere


def _str(h: dict[Any, Any], key: str, default: str | None = None, maxlen: int = 256) -> str:
    value = h.get(key, default)
    if not isinstance(value, str) or len(value) > maxlen:
        raise MalformedFrame(f"field {key!r} must be a string of at most {maxlen} characters")
    return value


def _int(h: dict[Any, Any], key: str, default: int | None = None) -> int:
    value = h.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**62) < value < 2**62:
        raise MalformedFrame(f"field {key!r} must be an int")
    return value


def _num(h: dict[Any, Any], key: str, default: float | None = None) -> float:
    value = h.get(key, default)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= 1e6
    ):
        raise MalformedFrame(f"field {key!r} must be a number in [0, 1e6]")
    return float(value)


def _count(value: Any, key: str) -> int:
    """GPUs are sent as a count or as a list of device indices."""
    if isinstance(value, list) and len(value) <= 1024:
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1024:
        return value
    raise MalformedFrame(f"field {key!r} must be a GPU count or a list of indices")


def _request_id(h: dict[Any, Any], key: str = "id") -> int | str:
    value = h.get(key)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MalformedFrame(f"field {key!r} must be an int or a string")
    if isinstance(value, str) and len(value) > 128:
        raise MalformedFrame(f"field {key!r} is too long")
    if isinstance(value, int) and not -(2**62) < value < 2**62:
        raise MalformedFrame(f"field {key!r} is out of range")
    return value


def _optional_mb(h: dict[Any, Any], key: str = "memory_mb") -> int | None:
    value = h.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**40:
        raise MalformedFrame(f"field {key!r} must be a positive int or nil")
    return value


def _payload_dict(msg: wire.Message) -> dict[Any, Any]:
    """The optional msgpack map payload of hello/heartbeat ({} when absent)."""
    if not msg.payload:
        return {}
    data = wire.load_data(msg.payload)
    if not isinstance(data, dict):
        raise MalformedFrame(f"payload is a {type(data).__name__}, not a map")
    return data


def _plain_number(value: Any, default: float = 0.0) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _clean_gpus(value: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not isinstance(value, list):
        return out
    for item in value[:64]:
        if isinstance(item, dict):
            out.append(
                {
                    "index": int(_plain_number(item.get("index"))),
                    "util": _plain_number(item.get("util")),
                    "memory_used_mb": _plain_number(item.get("memory_used_mb")),
                    "memory_total_mb": _plain_number(item.get("memory_total_mb")),
                }
            )
    return out


def _clean_metrics(value: dict[Any, Any]) -> dict[str, Any]:
    metrics: dict[str, Any] = dict(_CLIENT_METRICS)
    for key, item in itertools.islice(value.items(), 64):
        if isinstance(key, str) and len(key) <= 64:
            if isinstance(item, int | float) and not isinstance(item, bool):
                metrics[key] = item if math.isfinite(item) else 0.0
            elif isinstance(item, str) and len(item) <= 256:
                metrics[key] = item
    return metrics


# ------------------------------------------------------------------------------------------
# tables


@dataclass(eq=False)
class Peer:
    peer_id: str
    role: str  # "worker" | "client"
    identity: bytes
    name: str
    host: str
    pid: int
    version: str
    connected: float
    last_seen: float
    cpus: float = 0.0
    gpus: int = 0
    alive: bool = True
    died_at: float = 0.0
    cpus_used: float = 0.0
    gpus_used: int = 0
    actors: set[str] = field(default_factory=set)
    stats: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=lambda: dict(_CLIENT_METRICS))


@dataclass(eq=False)
class Job:
    actor_id: str
    client_id: str
    worker_id: str
    cpus: float
    gpus: int
    memory_mb: int | None
    request_id: int | str | None  # the client's place id; None once answered or when adopted
    state: str  # "spawning" | "running"
    started: float
    pid: int = 0
    endpoint: str = ""
    client_host: str = ""
    client_pid: int = 0
    orphan_deadline: float | None = None  # adopted without its client: killed after this


@dataclass(eq=False)
class Pending:
    client_id: str
    request_id: int | str
    cpus: float
    gpus: int
    memory_mb: int | None
    deadline: float


class Master:
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
        self.heartbeat_s = heartbeat_s
        self.queue_s = queue_s
        self.spawn_timeout_s = spawn_timeout_s
        self.keys = keys
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.malformed = 0
        self.refused = 0
        # a per-start tag keeps actor and peer ids of different master lives apart
        self._epoch = secrets.token_hex(2)
        self._seq = itertools.count(1)
        self.peers: dict[str, Peer] = {}
        self._by_identity: dict[bytes, str] = {}
        self.jobs: dict[str, Job] = {}
        self.pending: collections.deque[Pending] = collections.deque()
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._next_tick = 0.0

        self.context: zmq.Context[Any] = zmq.Context()
        self.guard = Guard(self.context, keys)
        self.sock: zmq.Socket[Any] = self.context.socket(zmq.ROUTER)
        self.sock.linger = 1000
        self.sock.maxmsgsize = MAX_MESSAGE_BYTES
        self.sock.router_handover = True
        self.sock.sndhwm = 100_000
        self.sock.rcvhwm = 100_000
        self.monitor: Any = None
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
            if monitor_port is not None:
                from harness_zmq.monitor import MonitorServer

                try:
                    self.monitor = MonitorServer(
                        self.status, monitor_host, monitor_port, allow_remote=keys is not None
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
            "on" if keys else "off",
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
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            with self._lock:
                self._on_frames(frames)

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
            f"(harness {_version()}) speaks protocol {wire.PROTOCOL}. Install the same "
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
        role = _str(h, "role")
        if role not in ("worker", "client"):
            raise MalformedFrame(f"unknown role {role[:20]!r}")
        name = _str(h, "name", "")
        host = _str(h, "host", "")
        pid = _int(h, "pid", 0)
        version = _str(h, "harness", "", maxlen=64)
        cpus = _num(h, "cpus", 0.0)
        gpus = _count(h.get("gpus", 0), "gpus")
        previous = h.get("peer_id")
        if previous is not None and not isinstance(previous, str):
            raise MalformedFrame("field 'peer_id' must be a string")
        payload = _payload_dict(msg)
        actors = payload.get("actors", [])
        if role == "worker" and not isinstance(actors, list):
            raise MalformedFrame("hello payload 'actors' must be a list")
        reported = [_reported_actor(a) for a in actors] if role == "worker" else []
        if version and version != _version():
            log.warning(
                "%s %s@%s runs harness %s, this master %s (same protocol %d: accepted)",
                role,
                name,
                host,
                version,
                _version(),
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

    def _adopt(self, worker: Peer, reported: list[dict[str, Any]], now: float) -> None:
        """Reconcile the actors a (re-)registering worker reports with the job table."""
        seen: set[str] = set()
        for a in reported:
            actor_id = a["actor_id"]
            seen.add(actor_id)
            job = self.jobs.get(actor_id)
            if job is None and actor_id in self._gone:
                self._send(worker.identity, Kind.KILL, {"actor_id": actor_id})
                continue
            if job is None:
                job = Job(
                    actor_id=actor_id,
                    client_id=a["client_id"],
                    worker_id=worker.peer_id,
                    cpus=a["cpus"],
                    gpus=a["gpus"],
                    memory_mb=a["memory_mb"],
                    request_id=None,
                    state="running",
                    started=now,
                    pid=a["pid"],
                    endpoint=a["endpoint"],
                    client_host=a["client_host"],
                    client_pid=a["client_pid"],
                )
                self.jobs[actor_id] = job
                self._assign(job)
                owner = self._owner_for(job)
                if owner is None:
                    job.orphan_deadline = now + ORPHAN_GRACE_BEATS * self.heartbeat_s
                else:
                    job.client_id = owner.peer_id
                    owner.actors.add(actor_id)
                log.info("adopted actor %s (pid %d) on %s", actor_id, job.pid, worker.peer_id)
                continue
            if job.worker_id != worker.peer_id:
                self._unassign(job)
                job.worker_id = worker.peer_id
                self._assign(job)
            job.pid, job.endpoint = a["pid"] or job.pid, a["endpoint"] or job.endpoint
            if job.state == "spawning" and job.endpoint:
                self._placed(job)
        for job in [j for j in self.jobs.values() if j.worker_id == worker.peer_id]:
            if job.actor_id not in seen and job.state == "running":
                self._job_ended(job, f"its process ended while worker {worker.peer_id} was away")

    def _owner_for(self, job: Job) -> Peer | None:
        client = self.peers.get(job.client_id)
        if client is not None and client.alive and client.role == "client":
            return client
        if job.client_pid:
            for peer in self.peers.values():
                if (
                    peer.role == "client"
                    and peer.alive
                    and peer.pid == job.client_pid
                    and peer.host == job.client_host
                ):
                    return peer
        return None

    def _reclaim(self, client: Peer) -> None:
        """A client (re-)registering: it owns again the adopted actors it had created."""
        for job in self.jobs.values():
            if job.orphan_deadline is not None and (
                job.client_id == client.peer_id
                or (
                    job.client_pid
                    and (job.client_pid, job.client_host) == (client.pid, client.host)
                )
            ):
                job.client_id = client.peer_id
                job.orphan_deadline = None
                client.actors.add(job.actor_id)

    def _on_heartbeat(self, identity: bytes, msg: wire.Message) -> None:
        peer_id = _str(msg.header, "peer_id")
        payload = _payload_dict(msg)
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
                "cpu_percent": _plain_number(payload.get("cpu_percent")),
                "memory_mb": _plain_number(payload.get("memory_mb")),
                "memory_total_mb": _plain_number(payload.get("memory_total_mb")),
                "gpu": _clean_gpus(payload.get("gpu")),
            }
        else:
            metrics = payload.get("metrics", payload)
            if isinstance(metrics, dict):
                peer.metrics = _clean_metrics(metrics)
        self._send(identity, Kind.HEARTBEAT, {"peer_id": peer.peer_id})

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
        _str(msg.header, "peer_id", "")
        peer = self._peer(identity)
        if peer is None:
            return
        log.info("%s %s left", peer.role, peer.peer_id)
        self._peer_gone(peer, "left the cluster", remove=True)

    def _on_place(self, identity: bytes, msg: wire.Message) -> None:
        h = msg.header
        request_id = _request_id(h)
        cpus = _num(h, "cpus", 1.0)
        gpus = _count(h.get("gpus", 0), "gpus")
        memory_mb = _optional_mb(h)
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
        actor_id = _str(msg.header, "actor_id")
        client = self._peer(identity, "client")
        job = self.jobs.get(actor_id)
        if client is None or job is None or job.client_id != client.peer_id:
            return
        self._kill(job)

    def _on_spawned(self, identity: bytes, msg: wire.Message) -> None:
        h = msg.header
        actor_id = _str(h, "actor_id")
        worker = self._peer(identity, "worker")
        if worker is None:
            return
        error = h.get("error")
        if error is not None and not isinstance(error, str):
            raise MalformedFrame("field 'error' must be a string")
        if error is None:
            endpoint = _str(h, "endpoint")
            pid = _int(h, "pid")
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
        job.endpoint, job.pid = endpoint, pid
        if job.state == "spawning":
            self._placed(job)

    def _on_exited(self, identity: bytes, msg: wire.Message) -> None:
        actor_id = _str(msg.header, "actor_id")
        reason = _str(msg.header, "reason", "exited", maxlen=1024)
        worker = self._peer(identity, "worker")
        job = self.jobs.get(actor_id)
        if worker is None or job is None or job.worker_id != worker.peer_id:
            return
        if job.state == "spawning":
            self._fail_spawn(job, f"the actor process ended while starting ({reason})")
        else:
            self._job_ended(job, reason)

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

    # -- placement ---------------------------------------------------------------------------

    def _try_place(self, request: Pending) -> bool:
        best: Peer | None = None
        for worker in self.peers.values():
            if worker.role != "worker" or not worker.alive:
                continue
            free = worker.cpus - worker.cpus_used
            if free + 1e-9 < request.cpus or worker.gpus - worker.gpus_used < request.gpus:
                continue
            if best is None or (free, -len(worker.actors)) > (
                best.cpus - best.cpus_used,
                -len(best.actors),
            ):
                best = worker
        if best is None:
            return False
        client = self.peers[request.client_id]
        job = Job(
            actor_id=f"a{next(self._seq)}-{self._epoch}",
            client_id=request.client_id,
            worker_id=best.peer_id,
            cpus=request.cpus,
            gpus=request.gpus,
            memory_mb=request.memory_mb,
            request_id=request.request_id,
            state="spawning",
            started=time.monotonic(),
            client_host=client.host,
            client_pid=client.pid,
        )
        self.jobs[job.actor_id] = job
        self._assign(job)
        client.actors.add(job.actor_id)
        self._send(
            best.identity,
            Kind.SPAWN,
            {
                "id": request.request_id,
                "actor_id": job.actor_id,
                "client_id": job.client_id,
                "cpus": job.cpus,
                "gpus": job.gpus,
                "memory_mb": job.memory_mb,
                # not in the contract's list: echoed back by a worker's hello after a master
                # restart, so the job can find its client again
                "client_host": client.host,
                "client_pid": client.pid,
            },
        )
        return True

    def _placed(self, job: Job) -> None:
        job.state = "running"
        request_id, job.request_id = job.request_id, None
        client = self.peers.get(job.client_id)
        if client is None or not client.alive:
            if job.orphan_deadline is None:
                self._kill(job)
            return
        if request_id is not None:
            self._send(
                client.identity,
                Kind.PLACED,
                {
                    "id": request_id,
                    "actor_id": job.actor_id,
                    "endpoint": job.endpoint,
                    "worker_id": job.worker_id,
                    "pid": job.pid,
                },
            )

    def _free_capacity(self) -> str:
        parts = [
            f"{w.peer_id} ({w.host}): {w.cpus - w.cpus_used:g}/{w.cpus:g} cpus, "
            f"{w.gpus - w.gpus_used}/{w.gpus} gpus free"
            for w in self.peers.values()
            if w.role == "worker" and w.alive
        ]
        return "; ".join(parts) if parts else "no workers are connected"

    def _refuse_place(self, request: Pending) -> None:
        client = self.peers.get(request.client_id)
        if client is None or not client.alive:
            return
        mem = f", memory_mb={request.memory_mb}" if request.memory_mb is not None else ""
        error = (
            f"cannot place actor request {request.request_id!r} (cpus={request.cpus:g}, "
            f"gpus={request.gpus}{mem}): no worker had room within {self.queue_s:g} s. "
            f"Free capacity: {self._free_capacity()}. Release actors, ask for fewer resources "
            f"or add workers with 'harness cluster join {self.address} --cpus N'."
        )
        log.info("%s", error)
        self._send(client.identity, Kind.PLACED, {"id": request.request_id, "error": error})

    def _fail_spawn(self, job: Job, error: str) -> None:
        self._remove_job(job)
        client = self.peers.get(job.client_id)
        if job.request_id is not None and client is not None and client.alive:
            self._send(client.identity, Kind.PLACED, {"id": job.request_id, "error": error})
        log.info("spawning %s failed: %s", job.actor_id, error)

    # -- bookkeeping -------------------------------------------------------------------------

    def _assign(self, job: Job) -> None:
        worker = self.peers.get(job.worker_id)
        if worker is not None:
            worker.cpus_used += job.cpus
            worker.gpus_used += job.gpus
            worker.actors.add(job.actor_id)

    def _unassign(self, job: Job) -> None:
        worker = self.peers.get(job.worker_id)
        if worker is not None and job.actor_id in worker.actors:
            worker.actors.discard(job.actor_id)
            worker.cpus_used = max(0.0, worker.cpus_used - job.cpus)
            worker.gpus_used = max(0, worker.gpus_used - job.gpus)
            if not worker.actors:
                worker.cpus_used, worker.gpus_used = 0.0, 0

    def _remove_job(self, job: Job) -> None:
        self.jobs.pop(job.actor_id, None)
        self._unassign(job)
        client = self.peers.get(job.client_id)
        if client is not None:
            client.actors.discard(job.actor_id)
        self._gone[job.actor_id] = None
        while len(self._gone) > _GONE_MEMORY:
            self._gone.popitem(last=False)

    def _kill(self, job: Job) -> None:
        """End an actor nobody needs (released, or its client is gone)."""
        worker = self.peers.get(job.worker_id)
        if worker is not None and worker.alive:
            self._send(worker.identity, Kind.KILL, {"actor_id": job.actor_id})
        self._remove_job(job)

    def _job_ended(self, job: Job, reason: str) -> None:
        """The actor's process is gone: tell its client."""
        self._remove_job(job)
        self._notify_died(job, reason)
        log.info("actor %s on %s ended: %s", job.actor_id, job.worker_id, reason)

    def _notify_died(self, job: Job, reason: str) -> None:
        client = self.peers.get(job.client_id)
        if client is not None and client.alive:
            if job.state == "spawning" and job.request_id is not None:
                self._send(client.identity, Kind.PLACED, {"id": job.request_id, "error": reason})
            else:
                self._send(
                    client.identity,
                    Kind.ACTOR_DIED,
                    {"actor_id": job.actor_id, "reason": reason},
                )

    def _peer_gone(self, peer: Peer, why: str, *, remove: bool) -> None:
        peer.alive = False
        peer.died_at = time.monotonic()
        self._by_identity.pop(peer.identity, None)
        if peer.role == "client":
            for job in [j for j in self.jobs.values() if j.client_id == peer.peer_id]:
                self._kill(job)
            self.pending = collections.deque(p for p in self.pending if p.client_id != peer.peer_id)
            self.peers.pop(peer.peer_id, None)
        else:
            for job in [j for j in self.jobs.values() if j.worker_id == peer.peer_id]:
                self._job_ended(job, f"its worker {peer.peer_id} ({peer.host}) {why}")
            peer.cpus_used, peer.gpus_used = 0.0, 0
            peer.actors.clear()
            if remove:
                self.peers.pop(peer.peer_id, None)

    def _tick(self, now: float) -> None:
        limit = MISSED_BEATS * self.heartbeat_s
        for peer in list(self.peers.values()):
            if peer.alive and now - peer.last_seen > limit:
                log.warning(
                    "%s %s (%s pid %d) silent for %.1f s: declared dead",
                    peer.role,
                    peer.peer_id,
                    peer.host,
                    peer.pid,
                    now - peer.last_seen,
                )
                self._peer_gone(peer, "stopped answering", remove=False)
            elif not peer.alive and now - peer.died_at > DEAD_WORKER_KEEP_S:
                self.peers.pop(peer.peer_id, None)
        for job in list(self.jobs.values()):
            if job.orphan_deadline is not None and now > job.orphan_deadline:
                log.info("actor %s: its client %s did not come back", job.actor_id, job.client_id)
                self._kill(job)
            elif job.state == "spawning" and now - job.started > self.spawn_timeout_s:
                worker = self.peers.get(job.worker_id)
                if worker is not None and worker.alive:
                    self._send(worker.identity, Kind.KILL, {"actor_id": job.actor_id})
                self._fail_spawn(
                    job,
                    f"worker {job.worker_id} did not start it within {self.spawn_timeout_s:g} s",
                )
        if self.pending:
            waiting: collections.deque[Pending] = collections.deque()
            while self.pending:
                request = self.pending.popleft()
                if request.client_id not in self.peers:
                    continue
                if self._try_place(request):
                    continue
                if now >= request.deadline:
                    self._refuse_place(request)
                else:
                    waiting.append(request)
            self.pending = waiting

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The status dict of docs/distributed.md (thread-safe: the monitor calls it)."""
        with self._lock:
            now = time.monotonic()
            workers = []
            clients = []
            for p in self.peers.values():
                if p.role == "worker":
                    workers.append(
                        {
                            "id": p.peer_id,
                            "name": p.name,
                            "host": p.host,
                            "pid": p.pid,
                            "cpus": p.cpus,
                            "cpus_used": round(p.cpus_used, 6),
                            "gpus": p.gpus,
                            "actors": len(p.actors),
                            "alive": p.alive,
                            "last_heartbeat_s": round(now - p.last_seen, 3),
                            "cpu_percent": p.stats.get("cpu_percent", 0.0),
                            "memory_mb": p.stats.get("memory_mb", 0.0),
                            "memory_total_mb": p.stats.get("memory_total_mb", 0.0),
                            "gpu": p.stats.get("gpu", []),
                        }
                    )
                elif p.alive:
                    clients.append(
                        {
                            "id": p.peer_id,
                            "name": p.name,
                            "host": p.host,
                            "pid": p.pid,
                            "actors": len(p.actors),
                            "connected_s": round(now - p.connected, 3),
                            "metrics": dict(p.metrics),
                        }
                    )
            jobs = [
                {
                    "actor_id": j.actor_id,
                    "client_id": j.client_id,
                    "worker_id": j.worker_id,
                    "pid": j.pid,
                    "cpus": j.cpus,
                    "state": j.state,
                }
                for j in self.jobs.values()
            ]
            spawning = sum(1 for j in self.jobs.values() if j.state == "spawning")
            return {
                "master": {
                    "address": self.address,
                    "pid": os.getpid(),
                    "version": _version(),
                    "protocol": wire.PROTOCOL,
                    "curve": self.keys is not None,
                    "uptime_s": round(now - self.started, 3),
                    "malformed": self.malformed,
                    "refused": self.refused,
                },
                "workers": workers,
                "clients": clients,
                "jobs": jobs,
                "queues": {"pending_spawns": len(self.pending) + spawning},
            }


def _reported_actor(a: Any) -> dict[str, Any]:
    """One entry of a worker hello's ``actors`` list, validated."""
    if not isinstance(a, dict):
        raise MalformedFrame("a reported actor must be a map")
    mb = a.get("memory_mb")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0):
        raise MalformedFrame("reported actor memory_mb must be a positive int or nil")
    return {
        "actor_id": _str(a, "actor_id", maxlen=128),
        "client_id": _str(a, "client_id", "", maxlen=128),
        "pid": _int(a, "pid", 0),
        "endpoint": _str(a, "endpoint", ""),
        "cpus": _num(a, "cpus", 0.0),
        "gpus": _count(a.get("gpus", 0), "gpus"),
        "memory_mb": mb,
        "client_host": _str(a, "client_host", ""),
        "client_pid": _int(a, "client_pid", 0),
    }


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
