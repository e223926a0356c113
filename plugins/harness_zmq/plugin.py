"""Registers the ``zmq`` transport (``harness.connect(address)`` over ZeroMQ) and its
``harness cluster ...`` command.

Imports nothing heavy at registration: pyzmq and friends load on the first ``connect`` or when a
cluster command runs (the command's arguments are declared without them).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from harness import hookimpl
from harness.registry import CommandSpec, TransportSpec
from harness_zmq import command


def connect(address: str | None = None, **options: Any) -> Any:
    """``None``: an embedded local farm on this machine; else a cluster's master address."""
    from harness_zmq.client import connect as _connect

    return _connect(address, **options)


def cluster(args: argparse.Namespace) -> int:
    """``harness cluster ...``: keys, start, join, status, stop (:mod:`harness_zmq.cli`)."""
    from harness_zmq.cli import run

    return run(args)


@hookimpl
def harness_register_transports() -> Iterable[TransportSpec]:
    return [
        TransportSpec(
            "zmq",
            connect,
            description="ZeroMQ actor farm: embedded local farm or a `harness cluster`",
        )
    ]


@hookimpl
def harness_register_commands() -> Iterable[CommandSpec]:
    return [
        CommandSpec(
            "cluster",
            add_arguments=command.add_arguments,
            run=cluster,
            help=command.HELP,
            description=command.DESCRIPTION,
        )
    ]
