"""Central inference for remote actors: a relay from ZeroMQ frames into the policy server.

The farm's policy server (``harness.runtime.inference``) serves the actors of this host
through shared memory. Actors on other hosts reach it through this relay, a thread of the
learner process with a ROUTER socket::

    remote actor i --[header | obs bytes | ended flags]--> ROUTER (relay thread)
        relay: writes the obs into actor i's rows, as a local actor would (CentralActing)
        policy server: one batched sample over every waiting actor, local or remote
    remote actor i <--[header | action bytes | extra bytes...]-- relay (on the reply FIFO)

- **No pickle.** A message is raw numpy bytes behind a fixed 32-byte header of four int64
  (a magic number with the format version, the actor's slot, its incarnation, the request's
  sequence number; a reply's: magic, sequence number, weights version, 0). The relay checks
  every frame's length against the slot's rows and the link's dtypes before it touches the
  shared arrays; anything else is dropped and counted (``farm/inference_malformed``).
- **Security.** The relay binds where the cluster's peers reach this host (the interface
  that routes to the master), always with the cluster's CURVE keys, loopback included (the
  ZAP handler admits the authorized keys, :mod:`harness_zmq.security`). Remote actors connect
  with the client keys of their worker, which their spawn request carried
  (:func:`harness_zmq.security.process_keys`).
- **Exactly once, per actor.** Each remote actor draws a random incarnation at start; the
  relay keeps one local stand-in (``link.attach(index)``) per slot and incarnation,
  so a replaced actor continues its slot's sequence (a dead predecessor's open request is
  answered into nothing) and the server resets the slot's per-env state at the new actor's
  first request, exactly as for local actors. Requests of a retired incarnation are dropped.
  A reply carries its request's sequence number: the actor takes only its own.
- **Episode ends** travel as one flag byte per env with the next request (the same moment a
  local actor writes them: while it has no request open).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from harness.errors import HarnessError
from harness_zmq.security import Guard, host_of, is_loopback, process_keys
from harness_zmq.wakeup import WakePipe

if TYPE_CHECKING:
    from harness_zmq.client import ZmqClient

log = logging.getLogger(__name__)

__all__ = ["RemoteActing", "RemoteLink", "ZmqRelay", "relay_host"]

MAGIC = 0x48_49_4E_46_00_01  # "HINF" and the format version (1)
HEADER = struct.Struct("<4q")
HEADER_BYTES = HEADER.size
REPLY_TIMEOUT_S = 600.0
"""A remote actor waiting longer than this for an answer stops its rollout with an error (the
learner is gone or wedged; its worker replaces the actor process when the run goes on)."""
MAX_RELAY_RESTARTS = 100
"""A relay loop that fails more often than this stops the run with its error."""
RETIRED_KEPT = 8
"""Incarnations remembered per slot, so a late request of a replaced actor is dropped."""


def _header(*values: int) -> bytes:
    return HEADER.pack(*values, *(0,) * (4 - len(values)))


@dataclass(frozen=True)
class _Array:
    """The shape of one actor row and the dtype of an exchanged array."""

    row_shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, array: np.ndarray) -> _Array:
        return cls(tuple(int(d) for d in array.shape[1:]), array.dtype.str)

    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def read(self, buffer: memoryview, rows: int) -> np.ndarray:
        return np.frombuffer(buffer, np.dtype(self.dtype)).reshape(rows, *self.row_shape)


@dataclass(frozen=True)
class RemoteLink:
    """What a remote actor needs to reach the relay (picklable; no secret in it)."""

    endpoint: str
    server_key: bytes | None
    """The relay's CURVE public key (None on loopback)."""
    offsets: tuple[int, ...]
    obs: _Array
    actions: _Array
    extras: tuple[tuple[str, _Array], ...]
    by_rows: bool

    def attach(self, index: int) -> RemoteActing:
        return RemoteActing(self, index)


# ------------------------------------------------------------------------------------------
# the remote actor's side


class RemoteActing:
    """A remote actor's stand-in for the agent: ``sample`` sends its observations to the
    relay and waits for its rows of the answer (the interface of ``CentralActing``)."""

    def __init__(self, link: RemoteLink, index: int) -> None:
        self.link = link
        self.index = index
        self.rows = link.offsets[index + 1] - link.offsets[index]
        self.incarnation = secrets.randbits(62)
        self.seq = 0
        self._ended = np.zeros(self.rows, np.int8)
        self.oldest_version = -1
        self.context: zmq.Context[Any] = zmq.Context(1)
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        if link.server_key is not None:
            keys = process_keys()
            if keys is None:
                sock.close()
                self.context.term()
                raise HarnessError(
                    f"the policy server at {link.endpoint} takes CURVE connections only, and "
                    "this process has no keys: only actors started by a cluster worker can "
                    "act through it."
                )
            sock.curve_serverkey = link.server_key
            sock.curve_publickey = keys.client_public
            sock.curve_secretkey = keys.client_secret
        sock.connect(link.endpoint)
        self.sock = sock

    def begin_rollout(self) -> None:
        self.oldest_version = -1

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.seq += 1
        obs = np.ascontiguousarray(obs, np.dtype(self.link.obs.dtype))
        header = _header(MAGIC, self.index, self.incarnation, self.seq)
        self.sock.send_multipart([header, obs.data, self._ended.tobytes()], copy=False)
        self._ended[:] = 0
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            if not self.sock.poll(1000):
                if time.monotonic() > deadline:
                    raise HarnessError(
                        f"no answer from the policy server at {self.link.endpoint} in "
                        f"{REPLY_TIMEOUT_S:.0f} s"
                    )
                continue
            frames = self.sock.recv_multipart(copy=False)
            answer = self._answer(frames)
            if answer is not None:
                return answer

    def _answer(self, frames: list[Any]) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        link = self.link
        if len(frames) != 2 + len(link.extras) or len(frames[0].bytes) != HEADER_BYTES:
            return None
        magic, seq, version, _ = HEADER.unpack(frames[0].bytes)
        if magic != MAGIC or seq != self.seq:
            return None  # (a stale answer: never ours)
        if self.oldest_version < 0 or version < self.oldest_version:
            self.oldest_version = int(version)
        actions = link.actions.read(frames[1].buffer, self.rows)
        extras = {
            name: spec.read(frame.buffer, self.rows)
            for (name, spec), frame in zip(link.extras, frames[2:], strict=True)
        }
        return actions, extras

    def episodes_ended(self, mask: np.ndarray) -> None:
        if self.link.by_rows:
            self._ended[np.asarray(mask, bool)] = 1

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close(linger=0)
            self.context.term()


# ------------------------------------------------------------------------------------------
# the relay in the learner process


def relay_host(address: str) -> str:
    """The address of this host on the route to the master at ``address`` (where the
    cluster's workers, which reach the master, can reach this host)."""
    host = host_of(address).strip("[]")
    if is_loopback(host):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # (UDP: no packet is sent; the kernel picks the route)
        return str(probe.getsockname()[0])


class _Slot:
    """The relay's state of one actor slot."""

    def __init__(self) -> None:
        self.acting: Any = None
        self.incarnation = -1
        self.retired: deque[int] = deque(maxlen=RETIRED_KEPT)
        self.identity: bytes | None = None
        """The ROUTER identity of the request now open (None: none open)."""
        self.seq = 0
        """The open request's sequence number (the actor's own count)."""


class ZmqRelay:
    """Remote actors' requests into the policy server's shared arrays (module docstring)."""

    def __init__(self, client: ZmqClient, link: Any) -> None:
        if client.address is None:
            raise HarnessError("a local farm's actors reach the policy server directly")
        self.local = link
        self.offsets = np.asarray(link.offsets, np.int64)
        self.slots = [_Slot() for _ in range(len(link.offsets) - 1)]
        probe = link.attach(0, blocking=False)  # (only to read the arrays' layouts)
        try:
            arrays = probe.arrays
            obs, actions = _Array.of(arrays.obs), _Array.of(arrays.actions)
            extras = tuple((name, _Array.of(arrays.extras[name])) for name in link.extras)
        finally:
            probe.close()
        self.obs = obs
        self._obs_row_bytes = obs.row_bytes()
        self.malformed = 0
        self.requests = 0
        self.restarts = 0
        self.error: BaseException | None = None
        self._stop = False
        host = relay_host(client.address)
        self.sock = client.context.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.sndhwm = self.sock.rcvhwm = 0
        guard: Guard = client.guard
        guard.server(self.sock, host)
        if ":" in host:
            self.sock.ipv6 = True
        bind_host = f"[{host}]" if ":" in host else host
        port = self.sock.bind_to_random_port(f"tcp://{bind_host}")
        keys = client.keys
        self.link = RemoteLink(
            endpoint=f"tcp://{bind_host}:{port}",
            server_key=keys.server_public if keys is not None else None,
            offsets=link.offsets,
            obs=obs,
            actions=actions,
            extras=extras,
            by_rows=link.by_rows,
        )
        self._wakeup = WakePipe()
        self._thread = threading.Thread(target=self._main, name="inference-relay", daemon=True)
        self._thread.start()

    def stats(self) -> dict[str, float]:
        return {
            "farm/inference_remote_requests": float(self.requests),
            "farm/inference_malformed": float(self.malformed),
            "farm/inference_relay_restarts": float(self.restarts),
        }

    def close(self) -> None:
        self._stop = True
        self._wakeup.wake()
        self._thread.join(timeout=10)
        for slot in self.slots:
            if slot.acting is not None:
                slot.acting.close()
        with contextlib.suppress(Exception):
            self.sock.close(linger=0)
        self._wakeup.close()

    # -- the relay thread ------------------------------------------------------------------
    def check(self) -> None:
        """Raise the error that stopped the relay for good (its actors would wait forever)."""
        if self.error is not None:
            raise HarnessError(
                f"the inference relay for remote actors failed {self.restarts} times; last "
                f"error: {self.error!r}"
            ) from self.error

    def _main(self) -> None:
        while not self._stop:
            try:
                self._relay()
                return
            except Exception as exc:  # its state is the object's: the loop starts again
                if self._stop:
                    return
                self.restarts += 1
                if self.restarts > MAX_RELAY_RESTARTS:
                    log.error("inference relay failed %d times; giving up", self.restarts)
                    self.error = exc
                    return
                log.warning("inference relay failed (%r); starting it again", exc)

    def _relay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wakeup.fd, zmq.POLLIN)
        fds: dict[int, int] = {}  # reply FIFO -> slot
        watched: dict[int, int] = {}  # slot -> its reply FIFO
        for index, slot in enumerate(self.slots):  # (a restarted loop: the slots it serves)
            if slot.acting is not None:
                fds[slot.acting.fileno()], watched[index] = index, slot.acting.fileno()
                poller.register(slot.acting.fileno(), zmq.POLLIN)
                self._reply(index)  # an answer that came while no loop was looking
        while not self._stop:
            for target, _ in poller.poll(1000):
                if target is self.sock:
                    for index, acting in self._requests():
                        fd = acting.fileno()
                        old = watched.get(index)
                        if old == fd:
                            continue
                        if old is not None:  # (a new incarnation: another FIFO descriptor)
                            poller.unregister(old)
                            del fds[old]
                        fds[fd], watched[index] = index, fd
                        poller.register(fd, zmq.POLLIN)
                elif target == self._wakeup.fd:
                    self._wakeup.drain()
                elif isinstance(target, int) and target in fds:
                    self._reply(fds[target])

    def _requests(self) -> list[tuple[int, Any]]:
        """Take every waiting request into the shared arrays; the slots they opened."""
        opened: list[tuple[int, Any]] = []
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return opened
            try:
                index, acting = self._request(frames)
            except (ValueError, IndexError) as exc:
                self.malformed += 1
                if self.malformed <= 10:
                    log.warning("inference relay: dropped a malformed request (%s)", exc)
                continue
            if acting is not None:
                opened.append((index, acting))

    def _request(self, frames: list[Any]) -> tuple[int, Any]:
        if len(frames) != 4:
            raise ValueError(f"{len(frames) - 1} frames, not 3")
        identity, head, obs, ended = frames
        if len(head.bytes) != HEADER_BYTES:
            raise ValueError(f"a header of {len(head.bytes)} bytes")
        magic, index, incarnation, seq = HEADER.unpack(head.bytes)
        if magic != MAGIC:
            raise ValueError("not a request of this format version")
        if not 0 <= index < len(self.slots):
            raise IndexError(f"slot {index} of {len(self.slots)}")
        rows = int(self.offsets[index + 1] - self.offsets[index])
        if len(obs.buffer) != rows * self._obs_row_bytes or len(ended.buffer) != rows:
            raise ValueError(f"frames of the wrong size for slot {index} ({rows} envs)")
        slot = self.slots[index]
        if incarnation != slot.incarnation:
            if incarnation in slot.retired:
                return index, None  # a replaced actor's late request
            if slot.acting is not None:
                slot.retired.append(slot.incarnation)
                slot.acting.close()
            # a new actor in the slot: continues its sequence; fresh envs from its request
            slot.acting = self.local.attach(index, blocking=False)
            slot.incarnation = incarnation
            slot.identity = None  # (the predecessor's open request is answered into nothing)
        acting = slot.acting
        assert acting is not None
        if slot.identity is not None:
            raise ValueError(f"slot {index} asked again before its answer")
        flags = np.frombuffer(ended.buffer, np.int8)
        if flags.any():
            acting.episodes_ended(flags)
        acting.submit(self.obs.read(obs.buffer, rows))
        slot.identity = identity.bytes
        slot.seq = seq
        self.requests += 1
        return index, acting

    def _reply(self, index: int) -> None:
        slot = self.slots[index]
        acting = slot.acting
        if acting is None:
            return
        answer = acting.poll()
        if answer is None or slot.identity is None:
            return
        actions, extras, version = answer
        frames = [slot.identity, _header(MAGIC, slot.seq, version), actions]
        frames += [extras[name] for name in self.local.extras]
        slot.identity = None
        with contextlib.suppress(zmq.ZMQError):  # (a peer gone meanwhile)
            self.sock.send_multipart(frames, copy=True)
