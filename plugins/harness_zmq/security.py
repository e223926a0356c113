"""Who may talk to a cluster: loopback by default, ZeroMQ CURVE on any other interface.

Key directory layout (``harness cluster keys DIR`` writes it)::

    DIR/server.key, DIR/server.key_secret   the cluster's identity: master, workers and actors
                                            bind with it; clients and workers verify it
    DIR/client.key, DIR/client.key_secret   the identity clients and workers present
    DIR/authorized/*.key                    public keys allowed to connect (client.key is
                                            copied here; add more to admit other parties)

A socket bound to a non-loopback address without keys is refused at start-up
(:class:`InsecureBind`). With keys, a ZAP handler in the binding process admits only the
authorized public keys; ZeroMQ drops every other peer during the handshake, before any of its
messages reach the application, so nothing from an unauthenticated peer is ever decoded.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from harness.errors import HarnessError

log = logging.getLogger(__name__)


class InsecureBind(HarnessError):
    """A non-loopback bind was requested without CURVE keys."""


@dataclass(frozen=True)
class Keys:
    """A loaded key directory."""

    directory: Path
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @property
    def authorized(self) -> Path:
        return self.directory / "authorized"


def generate_keys(directory: Path | str) -> Path:
    """Create a fresh key directory (refuses to overwrite one). Returns its path."""
    d = Path(directory).expanduser()
    if (d / "server.key_secret").exists():
        raise HarnessError(f"{d} already holds cluster keys; remove it or pick another DIR.")
    d.mkdir(parents=True, exist_ok=True)
    (d / "authorized").mkdir(exist_ok=True)
    zmq.auth.create_certificates(d, "server")
    zmq.auth.create_certificates(d, "client")
    shutil.copy(d / "client.key", d / "authorized" / "client.key")
    for secret in d.glob("*.key_secret"):
        secret.chmod(0o600)
    return d


def load_keys(directory: Path | str) -> Keys:
    """Load a key directory written by :func:`generate_keys`; clear error when incomplete."""
    d = Path(directory).expanduser()
    try:
        server_public, server_secret = zmq.auth.load_certificate(d / "server.key_secret")
        client_public, client_secret = zmq.auth.load_certificate(d / "client.key_secret")
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"cannot load CURVE keys from {d}: {exc}. Create them with "
            f"'harness cluster keys {d}' and copy the directory to every host."
        ) from None
    if server_secret is None or client_secret is None:
        raise HarnessError(f"{d}: the *.key_secret files hold no secret key")
    return Keys(d, server_public, server_secret, client_public, client_secret)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (e.g. localhost)."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def host_of(endpoint: str) -> str:
    """'tcp://HOST:PORT' -> HOST."""
    if not endpoint.startswith("tcp://"):
        raise HarnessError(f"address {endpoint!r} is not of the form tcp://HOST:PORT")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not host or not port:
        raise HarnessError(f"address {endpoint!r} is not of the form tcp://HOST:PORT")
    return host


class Guard:
    """CURVE setup for one process: starts the ZAP authenticator once per context and
    configures sockets. ``keys=None`` means loopback-only operation."""

    def __init__(self, context: zmq.Context[Any], keys: Keys | None) -> None:
        self.context = context
        self.keys = keys
        self._auth: ThreadAuthenticator | None = None

    def server(self, sock: zmq.Socket[Any], host: str) -> None:
        """Prepare ``sock`` to bind on ``host`` (call before bind)."""
        if self.keys is None:
            if not is_loopback(host):
                raise InsecureBind(
                    f"refusing to listen on {host!r} without CURVE keys: any host could "
                    f"connect. Generate keys with 'harness cluster keys DIR' and pass "
                    f"--keys DIR (every host needs a copy), or bind 127.0.0.1."
                )
            return
        if self._auth is None:
            self._auth = ThreadAuthenticator(self.context, log=log)
            self._auth.start()
            self._auth.configure_curve(domain="*", location=str(self.keys.authorized))
        sock.curve_server = True
        sock.curve_secretkey = self.keys.server_secret
        sock.curve_publickey = self.keys.server_public

    def client(self, sock: zmq.Socket[Any]) -> None:
        """Prepare ``sock`` to connect to a CURVE server of this cluster (before connect)."""
        if self.keys is None:
            return
        sock.curve_serverkey = self.keys.server_public
        sock.curve_publickey = self.keys.client_public
        sock.curve_secretkey = self.keys.client_secret

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
