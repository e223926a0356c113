"""Talking to a cluster master from the command line: is anything listening (``probe``), its
status (``request_status``: msgpack, never pickle) and ``stop``.

pyzmq is imported only when a master is asked something: ``harness cluster --help`` stays
quick.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from harness.errors import HarnessError
from harness_zmq.clusters import check_address

__all__ = ["STATUS_TIMEOUT_S", "probe", "request_status", "send_stop"]

STATUS_TIMEOUT_S = 3.0


def probe(address: str, timeout: float) -> None:
    """Fail fast (a clear error) when nothing accepts TCP connections at ``address``."""
    host, port = check_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except ConnectionRefusedError:
        raise HarnessError(
            f"nothing is listening at {address} (connection refused). Is the cluster running? "
            f"Start one with 'harness cluster start', or check the address."
        ) from None
    except TimeoutError:
        raise HarnessError(
            f"no answer from {address} within {timeout:g} s (the host is down or a firewall "
            f"drops the connection). Check the address."
        ) from None
    except OSError as exc:
        raise HarnessError(f"cannot reach {address}: {exc.strerror or exc}.") from None


def request_status(address: str, keys: Any = None, timeout: float = STATUS_TIMEOUT_S) -> Any:
    """Ask the master at ``address`` for its status dict (msgpack, never pickle).

    Raises HarnessError within about ``timeout`` seconds when nothing (or no master)
    answers, and when the master refuses (another protocol version)."""
    import zmq

    from harness_zmq import wire
    from harness_zmq.security import Guard
    from harness_zmq.wire import Kind, MalformedFrame

    probe(address, min(timeout, 2.0))
    context: zmq.Context[Any] = zmq.Context()
    guard = Guard(context, keys)
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    try:
        guard.client(sock)
        sock.connect(address)
        sock.send_multipart(wire.pack(Kind.STATUS, {"id": 1}))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                break
            frames = sock.recv_multipart()
            try:
                msg = wire.unpack(frames)
            except MalformedFrame:
                continue
            if msg.header["v"] != wire.PROTOCOL or msg.kind is Kind.REFUSED:
                reason = msg.header.get("reason")
                if not isinstance(reason, str):
                    reason = (
                        f"the master speaks protocol {msg.header['v']}, this harness speaks "
                        f"protocol {wire.PROTOCOL}"
                    )
                raise HarnessError(f"the master at {address} refused the request: {reason}")
            if msg.kind is Kind.STATUS_REPLY:
                try:
                    return wire.load_data(msg.payload)
                except MalformedFrame as exc:
                    raise HarnessError(
                        f"the master at {address} sent a bad status: {exc}"
                    ) from None
        hint = (
            " Are --keys the cluster's keys?"
            if keys is not None
            else " If the cluster was started with --keys, pass --keys DIR."
        )
        raise HarnessError(
            f"no harness cluster master answered at {address} within {timeout:g} s: something "
            f"accepts connections there, but it is not a master that lets this client in.{hint}"
        )
    finally:
        sock.close()
        guard.close()
        context.term()


def send_stop(address: str, keys: Any) -> None:
    import zmq

    from harness_zmq import wire
    from harness_zmq.security import Guard
    from harness_zmq.wire import Kind

    context: zmq.Context[Any] = zmq.Context()
    guard = Guard(context, keys)
    sock = context.socket(zmq.DEALER)
    sock.linger = 2000  # the message must leave before the socket closes
    try:
        guard.client(sock)
        sock.connect(address)
        sock.send_multipart(wire.pack(Kind.STOP))
    finally:
        sock.close()
        guard.close()
        context.term()
