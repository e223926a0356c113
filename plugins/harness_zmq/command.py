"""``harness cluster``: the arguments of the zmq plugin's subcommand (a
:class:`harness.registry.CommandSpec`).

Only argparse and the zmq-free parts of the plugin are imported here: ``harness --help`` builds
every plugin command's parser, so declaring these arguments must stay cheap and work without
pyzmq (its absence is reported when a cluster command runs, naming the ``zmq`` extra). The
commands themselves, and ``run`` (the dispatch), live in :mod:`harness_zmq.cli`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness_zmq.control import STATUS_TIMEOUT_S

DEFAULT_PORT = 7450
CONNECT_TIMEOUT_S = 5.0
"""Seconds a worker waits for its master's first answer (``--connect-timeout``)."""

HELP = "start, join, inspect or stop a distributed cluster"
DESCRIPTION = (
    "Start, join, inspect or stop a ZeroMQ cluster: a master that places actors on workers. "
    "Clients connect with harness.connect('tcp://HOST:PORT')."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``harness cluster`` and of its commands keys/start/join/status/stop."""
    p.add_argument(
        "--transport",
        default=None,
        help="deprecated (to be removed): 'zmq', the only transport with clusters",
    )
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    keys = sub.add_parser(
        "keys",
        help="create a CURVE key directory (to share between the hosts of a cluster)",
        description="Create a CURVE key directory: the cluster's server key pair, a client key "
        "pair and DIR/authorized/ (the public keys allowed in). Copy DIR to every host of the "
        "cluster and pass --keys DIR to start, join and harness.connect(..., keys=DIR). A "
        "loopback cluster started without --keys makes its own in its state directory "
        "($HARNESS_STATE_DIR or ~/.harness/clusters).",
    )
    keys.add_argument("dir", metavar="DIR", help="directory to create")
    _add_start_arguments(
        sub.add_parser(
            "start",
            help="start a master and a local worker in the background",
            description="Start a cluster master and one local worker with --cpus CPUs. By "
            "default they run in the background and this command returns once the master "
            "answers; 'harness cluster stop' ends them.",
        )
    )
    join = sub.add_parser(
        "join",
        help="run a worker on this host for a cluster's master",
        description="Run a worker for the master at ADDRESS in the foreground, offering --cpus "
        "CPUs. Its actors listen on --host, which clients must be able to reach.",
    )
    add_worker_arguments(join)
    _add_status_and_stop(sub)


def _add_start_arguments(start: argparse.ArgumentParser) -> None:
    start.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; any other needs --keys)",
    )
    start.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default: {DEFAULT_PORT}; 0: any free port)",
    )
    start.add_argument(
        "--cpus",
        type=float,
        default=float(os.cpu_count() or 1),
        help="CPUs of the local worker (default: all; 0: no local worker)",
    )
    start.add_argument("--gpus", default="", help="GPU indices of the local worker, e.g. 0,1")
    start.add_argument(
        "--monitor-port",
        type=int,
        default=None,
        help="serve the web monitor on this port (0: any free port)",
    )
    start.add_argument(
        "--monitor-host",
        default="127.0.0.1",
        help="address of the web monitor (default: 127.0.0.1; any other asks for the token "
        "printed at start)",
    )
    start.add_argument(
        "--keys",
        default=None,
        help="CURVE key directory (harness cluster keys); default on loopback: fresh keys "
        "written into the state directory, where this host's clients find them",
    )
    start.add_argument(
        "--foreground",
        action="store_true",
        help="run the master in this process until stopped (Ctrl-C)",
    )
    start.add_argument(
        "--heartbeat-s",
        type=float,
        default=1.0,
        help="heartbeat period; peers silent for 3 periods are dead (default: 1)",
    )


def _add_status_and_stop(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="show a cluster's workers, jobs and clients",
        description="Ask a master for its status. ADDRESS defaults to the one cluster started "
        "on this host.",
    )
    status.add_argument("address", nargs="?", metavar="ADDRESS", help="tcp://HOST:PORT")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.add_argument("--keys", default=None, help="the cluster's CURVE key directory")
    status.add_argument(
        "--timeout",
        type=float,
        default=STATUS_TIMEOUT_S,
        help=f"seconds to wait for the answer (default: {STATUS_TIMEOUT_S:g})",
    )
    stop = sub.add_parser(
        "stop",
        help="stop a cluster (its master, workers and actors)",
        description="Stop the cluster at ADDRESS (default: the one started on this host): the "
        "master tells its workers to end their actors and exit. The processes 'start' recorded "
        "are waited for and, if they linger, killed; other clusters are left alone.",
    )
    stop.add_argument("address", nargs="?", metavar="ADDRESS", help="tcp://HOST:PORT")
    stop.add_argument("--keys", default=None, help="the cluster's CURVE key directory")


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """A worker's options: ``harness cluster join`` and ``python -m harness_zmq.worker``."""
    p.add_argument("address", help="the master's address, tcp://HOST:PORT")
    p.add_argument("--cpus", type=float, required=True, help="CPU cores this worker offers")
    p.add_argument("--gpus", default="", help="GPU indices this worker offers, e.g. 0,1")
    p.add_argument(
        "--host",
        default=None,
        help="address actors listen on, reachable by clients (default: loopback for a "
        "loopback master, else this host's address towards the master)",
    )
    p.add_argument("--keys", default=None, help="the cluster's CURVE key directory")
    p.add_argument("--name", default=None, help="name shown in the status (default: hostname)")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=CONNECT_TIMEOUT_S,
        help="seconds to wait for the master's first answer",
    )
