"""The master's tables and every change to them: peers (workers and clients), jobs (actors),
pending placements; placing actors on workers, bookkeeping, the periodic tick (dead peers,
orphans, spawn time-outs, queued placements) and the status dict.

:class:`Tables` holds no socket: what it tells peers goes out through ``_send``, which the
:class:`~harness_zmq.master.Master` (its subclass: the socket, the loop and the message
handlers) implements. All of it runs under the master's lock.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness_zmq import security, wire
from harness_zmq.fields import CLIENT_METRICS
from harness_zmq.live import LiveStore
from harness_zmq.security import Keys
from harness_zmq.wire import Kind

log = logging.getLogger(__name__)

__all__ = ["Job", "Peer", "Pending", "Tables", "harness_version"]

MISSED_BEATS = 3
"""A peer silent for this many heartbeats is dead."""
ORPHAN_GRACE_BEATS = 10
"""After a master restart, adopted actors wait this many heartbeats for their client."""
DEAD_WORKER_KEEP_S = 3600.0
"""Dead workers stay in the status (``alive: false``) this long."""
_GONE_MEMORY = 100_000


def harness_version() -> str:
    import harness

    return str(harness.__version__)


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
    metrics: dict[str, Any] = field(default_factory=lambda: dict(CLIENT_METRICS))
    admitted: str = ""  # the IP address its hello came from (its actors' endpoints must be there)


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


class Tables:
    """Peers, jobs and pending placements, and what changes them (see the module docstring)."""

    # the master's own (set by Master.__init__): the status reports them
    address: str
    keys: Keys | None
    started: float
    malformed: int
    refused: int

    def __init__(self, heartbeat_s: float, queue_s: float, spawn_timeout_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.queue_s = queue_s
        self.spawn_timeout_s = spawn_timeout_s
        # a per-start tag keeps actor and peer ids of different master lives apart
        self._epoch = secrets.token_hex(2)
        self._seq = itertools.count(1)
        self.peers: dict[str, Peer] = {}
        self._by_identity: dict[bytes, str] = {}
        self.jobs: dict[str, Job] = {}
        self.pending: collections.deque[Pending] = collections.deque()
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.RLock()
        self.live = LiveStore()  # actors' output and runs' metrics for the monitor
        self.refused_endpoints = 0  # actor endpoints a worker reported off its own address

    def _send(
        self, identity: bytes, kind: Kind, header: dict[str, Any] | None = None, data: Any = None
    ) -> None:
        """Send one message to the peer whose ROUTER identity this is (the master's socket)."""
        raise NotImplementedError

    # -- a (re-)registering peer -------------------------------------------------------------

    def _adopt(self, worker: Peer, reported: list[dict[str, Any]], now: float) -> None:
        """Reconcile the actors a (re-)registering worker reports with the job table."""
        seen: set[str] = set()
        for a in reported:
            actor_id = a["actor_id"]
            job = self.jobs.get(actor_id)
            if a["endpoint"] and self.endpoint_problem(worker, a["endpoint"]) is not None:
                self._send(worker.identity, Kind.KILL, {"actor_id": actor_id})
                continue  # (a job of it ends below: it was not seen)
            seen.add(actor_id)
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

    def endpoint_problem(self, worker: Peer, endpoint: str) -> str | None:
        """Why the client must not connect to ``endpoint`` for an actor of ``worker`` (logged,
        naming the worker), or None: it must be on the address the worker joined from."""
        problem = security.endpoint_problem(endpoint, worker.admitted)
        if problem is not None:
            self.refused_endpoints += 1
            log.warning(
                "refused actor endpoint %r of worker %s (%s, pid %d, joined from %s): %s",
                endpoint[:120],
                worker.peer_id,
                worker.name or "-",
                worker.pid,
                worker.admitted or "?",
                problem,
            )
        return problem

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
                    "worker_addr": self._admitted(job.worker_id),
                    "pid": job.pid,
                },
            )

    def _admitted(self, worker_id: str) -> str:
        worker = self.peers.get(worker_id)
        return worker.admitted if worker is not None else ""

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
        self.live.actor_ended(job.actor_id, job.worker_id)
        while len(self._gone) > _GONE_MEMORY:
            self._gone.popitem(last=False)

    def _kill(self, job: Job) -> None:
        """End an actor nobody needs (released, or its client is gone)."""
        worker = self.peers.get(job.worker_id)
        if worker is not None and worker.alive:
            self._send(worker.identity, Kind.KILL, {"actor_id": job.actor_id})
        self._remove_job(job)

    def _job_ended(self, job: Job, reason: str, tail: str = "") -> None:
        """The actor's process is gone: tell its client (with its last output, ``tail``)."""
        self._remove_job(job)
        self._notify_died(job, reason, tail)
        log.info("actor %s on %s ended: %s", job.actor_id, job.worker_id, reason)

    def _notify_died(self, job: Job, reason: str, tail: str = "") -> None:
        client = self.peers.get(job.client_id)
        if client is not None and client.alive:
            if job.state == "spawning" and job.request_id is not None:
                self._send(client.identity, Kind.PLACED, {"id": job.request_id, "error": reason})
            else:
                header = {"actor_id": job.actor_id, "reason": reason}
                if tail:
                    header["tail"] = tail
                self._send(client.identity, Kind.ACTOR_DIED, header)

    def _peer_gone(self, peer: Peer, why: str, *, remove: bool) -> None:
        peer.alive = False
        peer.died_at = time.monotonic()
        self._by_identity.pop(peer.identity, None)
        if peer.role == "client":
            self.live.run_ended(peer.peer_id)
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
                    "version": harness_version(),
                    "protocol": wire.PROTOCOL,
                    "curve": self.keys is not None,
                    "uptime_s": round(now - self.started, 3),
                    "malformed": self.malformed,
                    "refused": self.refused,
                    "refused_endpoints": self.refused_endpoints,
                },
                "workers": workers,
                "clients": clients,
                "jobs": jobs,
                "queues": {"pending_spawns": len(self.pending) + spawning},
            }
