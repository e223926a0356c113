"""Registers the ``zmq`` transport: ``harness.connect(address)`` over ZeroMQ.

Imports nothing heavy at registration: pyzmq and friends load on the first ``connect``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness import hookimpl
from harness.registry import TransportSpec


def connect(address: str | None = None, **options: Any) -> Any:
    """``None``: an embedded local farm on this machine; else a cluster's master address."""
    from harness_zmq.client import connect as _connect

    return _connect(address, **options)


@hookimpl
def harness_register_transports() -> Iterable[TransportSpec]:
    return [
        TransportSpec(
            "zmq",
            connect,
            description="ZeroMQ actor farm: embedded local farm or a `harness cluster`",
        )
    ]
