"""Registers the ``zmq`` transport: ``harness.connect(address)`` over ZeroMQ.

Imports nothing heavy at registration: pyzmq and friends load on the first ``connect``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from harness import hookimpl
from harness.registry import TransportSpec


def connect(address: str | None = None, **options: Any) -> Any:
    """``None``: an embedded local farm on this machine; else a cluster's master address."""
    from harness_zmq.client import connect as _connect

    return _connect(address, **options)


def cluster(argv: Sequence[str]) -> int:
    """``harness cluster ...``: keys, start, join, status, stop."""
    from harness_zmq.cli import main

    return main(argv)


@hookimpl
def harness_register_transports() -> Iterable[TransportSpec]:
    return [
        TransportSpec(
            "zmq",
            connect,
            cluster=cluster,
            description="ZeroMQ actor farm: embedded local farm or a `harness cluster`",
        )
    ]
