"""The link to a cluster master: HELLO/WELCOME, placement (``place``/``placed``), this
client's heartbeats (with its run metrics) and the master's death notices (``actor_died``, with
the actor's last lines of output when its worker captured any), on a thread of its own.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import zmq

from harness.errors import HarnessError
from harness_zmq import wire
from harness_zmq.capture import with_last_output
from harness_zmq.handle import ZmqActor
from harness_zmq.security import (
    addresses_of,
    endpoint_problem,
    host_of,
    is_loopback,
    local_addresses,
)
from harness_zmq.wakeup import WakePipe

if TYPE_CHECKING:
    from harness.remote import ActorOptions
    from harness_zmq.client import ZmqClient
    from harness_zmq.options import ZmqOptions

log = logging.getLogger(__name__)

__all__ = ["MasterLink"]

Kind = wire.Kind


class MasterLink:
    """HELLO/WELCOME, placement, heartbeats and death notices, on a thread of its own."""

    def __init__(self, client: ZmqClient, address: str, options: ZmqOptions) -> None:
        connect_timeout_s = options.connect_timeout_s
        name = options.name or _default_name()
        self.client = client
        self.address = address
        host = host_of(address)
        self.heartbeat_s = float(options.heartbeat_s)
        self.peer_id: str | None = None
        self._places: dict[int, Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._queue: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self._wakeup = WakePipe()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.refused: str | None = None
        self._master_here = is_loopback(host) or bool(addresses_of(host) & local_addresses())
        sock = client.context.socket(zmq.DEALER)
        sock.linger = 0
        client.guard.client(sock)
        self.sock = sock
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            raise HarnessError(
                f"cannot connect to a harness master at {address!r}: {exc}"
            ) from None
        import harness

        sock.send_multipart(
            wire.pack(
                Kind.HELLO,
                {
                    "role": "client",
                    "name": name,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "cpus": 0,
                    "gpus": 0,
                    "harness": harness.__version__,
                },
            )
        )
        deadline = time.monotonic() + connect_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                hint = (
                    f" Every cluster uses CURVE: are the keys ({client.keys.directory or 'given'}) "
                    f"this cluster's? Pass its key directory with connect(address, keys=DIR) "
                    f"or run.cluster_keys."
                )
                raise HarnessError(
                    f"no answer from a harness master at {address} within "
                    f"{connect_timeout_s:.0f}s: is 'harness cluster start' running there and "
                    f"reachable from this host?{hint}"
                )
            try:
                msg = wire.unpack(sock.recv_multipart())
            except wire.MalformedFrame:
                continue
            if msg.header.get("v") != wire.PROTOCOL or msg.kind is Kind.REFUSED:
                reason = msg.header.get("reason") or (
                    f"protocol version mismatch: the master speaks version "
                    f"{msg.header.get('v')}, this client speaks version {wire.PROTOCOL}"
                )
                raise HarnessError(f"the harness master at {address} refused this client: {reason}")
            if msg.kind is Kind.WELCOME:
                self.peer_id = str(msg.header.get("peer_id"))
                self.heartbeat_s = float(msg.header.get("heartbeat_s") or self.heartbeat_s)
                break
        self._thread = threading.Thread(target=self._run, name="harness-zmq-master", daemon=True)
        self._thread.start()

    def place(self, options: ActorOptions, timeout: float) -> ZmqActor:
        rid = next(self._ids)
        future: Future[dict[str, Any]] = Future()
        self._places[rid] = future
        self._send(
            wire.pack(
                Kind.PLACE,
                {
                    "id": rid,
                    "cpus": options.cpus,
                    "gpus": options.gpus,
                    "memory_mb": options.memory_mb,
                },
            )
        )
        try:
            placed = future.result(timeout=timeout)
        except FutureTimeout:
            self._places.pop(rid, None)
            raise HarnessError(
                f"the master at {self.address} placed no actor within {timeout:.0f}s "
                f"(are there workers with {options.cpus} free CPUs and {options.gpus} GPUs?)"
            ) from None
        if placed.get("error"):
            raise HarnessError(
                f"the master at {self.address} cannot place an actor: {placed['error']}"
            )
        actor_id = str(placed["actor_id"])
        pid = placed.get("pid")
        endpoint = str(placed["endpoint"])
        problem = self._endpoint_problem(endpoint, placed)
        if problem is not None:
            worker = str(placed.get("worker_id"))[:64]
            log.error(
                "refused actor %s at %r of worker %s: %s", actor_id, endpoint[:120], worker, problem
            )
            self.release(actor_id)
            raise HarnessError(
                f"the master at {self.address} placed actor {actor_id} on worker {worker} at "
                f"{endpoint[:120]!r}, which this client refuses: {problem}"
            )
        return ZmqActor(
            self.client,
            actor_id,
            endpoint,
            int(pid) if pid else None,
            functools.partial(self.release, actor_id),
        )

    def _endpoint_problem(self, endpoint: str, placed: dict[str, Any]) -> str | None:
        """The master checked the endpoint against the worker's address; checked again here
        (a loopback endpoint from a master on another host would be this host's port)."""
        admitted = placed.get("worker_addr")
        if not isinstance(admitted, str) or not admitted:
            return "the master did not say where the worker joined from"
        problem = endpoint_problem(endpoint, admitted)
        if problem is None and is_loopback(host_of(endpoint)) and not self._master_here:
            problem = "a loopback endpoint, and the master is on another host"
        return problem

    def release(self, actor_id: str) -> None:
        if not self._stop:
            self._send(wire.pack(Kind.RELEASE, {"actor_id": actor_id}))

    def _send(self, frames: list[Any]) -> None:
        self._queue.put(frames)
        self._wakeup.wake()

    def _run(self) -> None:
        sock = self.sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wakeup.fd, zmq.POLLIN)
        next_beat = time.monotonic()
        last_answer = time.monotonic()
        warned = False
        try:
            while True:
                self._flush()
                if self._stop:
                    break
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_s
                    sock.send_multipart(
                        wire.pack_data(
                            Kind.HEARTBEAT, {"peer_id": self.peer_id}, dict(self.client.metrics)
                        )
                    )
                    if now - last_answer > 3 * self.heartbeat_s and not warned:
                        warned = True
                        log.warning(
                            "the harness master at %s has not answered for %.0fs",
                            self.address,
                            now - last_answer,
                        )
                events = dict(poller.poll(max(1, int((next_beat - now) * 1000))))
                if self._wakeup.fd in events:
                    self._wakeup.drain()
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    try:
                        msg = wire.unpack(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    except wire.MalformedFrame:
                        continue
                    last_answer = time.monotonic()
                    warned = False
                    self._handle(msg)
        except zmq.ZMQError as exc:
            if not self._stop:
                log.error("the link to the harness master at %s failed: %s", self.address, exc)
        finally:
            with contextlib.suppress(Exception):
                self._flush()
                if self.peer_id is not None:
                    sock.send_multipart(wire.pack(Kind.BYE, {"peer_id": self.peer_id}))
            with contextlib.suppress(Exception):
                sock.close(linger=1000)  # RELEASE/BYE still reach the master
            for future in list(self._places.values()):
                if not future.done():
                    future.set_exception(HarnessError("the harness connection was closed"))

    def _flush(self) -> None:
        while True:
            try:
                frames = self._queue.get_nowait()
            except queue.Empty:
                return
            self.sock.send_multipart(frames)

    def _handle(self, msg: wire.Message) -> None:
        header = msg.header
        if header.get("v") != wire.PROTOCOL or msg.kind is Kind.REFUSED:
            self.refused = str(header.get("reason", "refused"))
            log.error(
                "the harness master at %s refused this client: %s", self.address, self.refused
            )
            for rid in list(self._places):
                future = self._places.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result({"error": f"refused: {self.refused}"})
            return
        kind = msg.kind
        if kind is Kind.PLACED:
            future = self._places.pop(header.get("id"), None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(header)
        elif kind is Kind.ACTOR_DIED:
            reason = str(header.get("reason", "its worker reported it"))
            tail = header.get("tail")  # the actor's last output, when its worker had any
            if isinstance(tail, str):
                reason = with_last_output(reason, tail)
            self.client._actor_died(str(header.get("actor_id")), reason)
        elif kind is Kind.WELCOME:
            self.peer_id = str(header.get("peer_id", self.peer_id))

    def close(self) -> None:
        self._stop = True
        self._wakeup.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        elif thread is None:
            with contextlib.suppress(Exception):
                self.sock.close(linger=0)
        self._wakeup.close()


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
