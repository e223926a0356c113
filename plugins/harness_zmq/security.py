"""Who may talk to a cluster or a farm: every peer is CURVE-authenticated, loopback included.

Key directory layout (``harness cluster keys DIR`` writes it; ``harness cluster start``
without ``--keys`` writes one into the cluster's state directory, :func:`cluster_key_dir`)::

    DIR/server.key, DIR/server.key_secret   the cluster's identity: master, workers and actors
                                            bind with it; clients and workers verify it
    DIR/client.key, DIR/client.key_secret   the identity clients and workers present
    DIR/authorized/*.key                    public keys allowed to connect (client.key is
                                            copied here; add more to admit other parties)

The directory is mode 0700 and the secret files 0600: whoever can read them is the cluster.
An embedded local farm needs no directory: it makes a key pair of each kind in memory
(:func:`ephemeral_keys`) and hands them to its actors inside their spawn requests, on the
socket pair only the launcher and its zygote hold.

Every socket that binds runs a ZAP handler (:class:`Guard`) that admits only the authorized
public keys; ZeroMQ drops every other peer during the handshake, before any of its messages
reach the application, so nothing from an unauthenticated peer is ever decoded. A socket
that connects verifies the server's public key, so it never talks to a server without the
cluster's server secret.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
import zmq.utils.z85

from harness.errors import HarnessError

log = logging.getLogger(__name__)


class InsecureBind(HarnessError):
    """A non-loopback bind was requested without CURVE keys."""


class EndpointRefused(HarnessError):
    """A worker reported an actor endpoint that is not where that worker was admitted from."""


@dataclass(frozen=True)
class Keys:
    """A cluster's (or a local farm's) CURVE keys; ``directory`` is None for in-memory keys.
    Keys are z85 text (40 bytes), as ``zmq.curve_keypair`` gives them."""

    directory: Path | None
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    allowed: frozenset[bytes] = frozenset()
    """The public keys the ZAP handler admits (z85); the client key when empty."""

    @property
    def authorized(self) -> Path | None:
        return None if self.directory is None else self.directory / "authorized"

    def admitted(self) -> frozenset[bytes]:
        return self.allowed or frozenset({self.client_public})

    def material(self) -> dict[str, Any]:
        """The keys as a msgpack-able map (for a spawn request; :meth:`from_material`)."""
        return {
            "sp": self.server_public,
            "ss": self.server_secret,
            "cp": self.client_public,
            "cs": self.client_secret,
            "ok": sorted(self.admitted()),
        }

    @classmethod
    def from_material(cls, m: dict[str, Any]) -> Keys:
        return cls(None, m["sp"], m["ss"], m["cp"], m["cs"], frozenset(m["ok"]))


def ephemeral_keys() -> Keys:
    """Fresh keys that exist only in memory (an embedded farm's, a master's before it writes
    them)."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return Keys(None, server_public, server_secret, client_public, client_secret)


def generate_keys(directory: Path | str) -> Path:
    """Create a fresh key directory (refuses to overwrite one). Returns its path."""
    d = Path(directory).expanduser()
    if (d / "server.key_secret").exists():
        raise HarnessError(f"{d} already holds cluster keys; remove it or pick another DIR.")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.chmod(0o700)
    (d / "authorized").mkdir(exist_ok=True)
    zmq.auth.create_certificates(d, "server")
    zmq.auth.create_certificates(d, "client")
    shutil.copy(d / "client.key", d / "authorized" / "client.key")
    for secret in d.glob("*.key_secret"):
        secret.chmod(0o600)
    return d


def write_keys(keys: Keys, directory: Path) -> Keys:
    """Write in-memory ``keys`` as a key directory at ``directory`` (replacing one there:
    the caller owns the address it is named after). Returns them with their directory."""
    directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        (tmp / "authorized").mkdir()
        for name, public, secret in (
            ("server", keys.server_public, keys.server_secret),
            ("client", keys.client_public, keys.client_secret),
        ):
            _write_certificate(tmp / f"{name}.key", public, None)
            _write_certificate(tmp / f"{name}.key_secret", public, secret)
        _write_certificate(tmp / "authorized" / "client.key", keys.client_public, None)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_keys(directory)


def _write_certificate(path: Path, public: bytes, secret: bytes | None) -> None:
    lines = ["metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


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
    allowed: frozenset[bytes] = frozenset()
    if (d / "authorized").is_dir():
        allowed = frozenset(zmq.auth.load_certificates(d / "authorized"))
    if not allowed:
        allowed = frozenset({client_public})
    return Keys(d, server_public, server_secret, client_public, client_secret, allowed)


_PROCESS_KEYS: Keys | None = None


def set_process_keys(keys: Keys | None) -> None:
    """The keys an actor process was started with (its spawn request), for the sockets it
    opens itself (:mod:`harness_zmq.inference`'s remote acting)."""
    global _PROCESS_KEYS
    _PROCESS_KEYS = keys


def process_keys() -> Keys | None:
    return _PROCESS_KEYS


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


def addresses_of(host: str) -> frozenset[Any]:
    """The IP addresses ``host`` stands for (itself when it is one; empty when unknown)."""
    host = host.strip("[]")
    try:
        return frozenset({_plain_ip(ipaddress.ip_address(host))})
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return frozenset()
    return frozenset(_plain_ip(ipaddress.ip_address(i[4][0])) for i in infos)


def _plain_ip(ip: Any) -> Any:
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:10.0.0.1 is 10.0.0.1
    return mapped if mapped is not None else ip


def local_addresses() -> frozenset[Any]:
    """Every IP address of this host's interfaces (psutil)."""
    import psutil

    found = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    found.add(_plain_ip(ipaddress.ip_address(a.address.split("%")[0])))
    return frozenset(found)


def endpoint_problem(endpoint: str, admitted: str) -> str | None:
    """Why a worker admitted from ``admitted`` (its peer address) may not report ``endpoint``
    for an actor it runs, or None when it may: the endpoint must be TCP on that very address,
    or on loopback where the worker itself came over loopback (a worker on this host)."""
    try:
        host = host_of(endpoint)
    except HarnessError:
        return f"{endpoint[:80]!r} is not a tcp://HOST:PORT endpoint"
    ips = addresses_of(host)
    origin = addresses_of(admitted)
    if not ips or not origin:
        return f"cannot resolve {host!r} or the worker's address {admitted!r}"
    if all(ip.is_loopback for ip in origin):
        if all(ip.is_loopback for ip in ips):
            return None
        return f"{host} is not loopback, and the worker joined over loopback"
    if ips <= origin:
        return None
    return f"{host} is not the address the worker joined from ({admitted})"


class Guard:
    """CURVE setup for one process: runs the ZAP handler (once per context) for the sockets
    it binds and configures the sockets it connects. Without keys a socket may only connect
    (to a master, which never unpickles): binding needs keys, loopback included."""

    def __init__(self, context: zmq.Context[Any], keys: Keys | None) -> None:
        self.context = context
        self.keys = keys
        self._zap: _ZapHandler | None = None

    def server(self, sock: zmq.Socket[Any], host: str) -> None:
        """Prepare ``sock`` to bind on ``host`` (call before bind)."""
        if self.keys is None:
            raise InsecureBind(
                f"refusing to listen on {host!r} without CURVE keys: any process that can "
                f"reach it could connect. Generate keys with 'harness cluster keys DIR' and "
                f"pass --keys DIR (every host needs a copy)."
            )
        if self._zap is None:
            self._zap = _ZapHandler(self.context, self.keys.admitted())
        sock.zap_domain = b"harness"
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

    @property
    def denied(self) -> int:
        """Handshakes the ZAP handler refused (wrong or unknown client keys)."""
        return 0 if self._zap is None else self._zap.denied

    def close(self) -> None:
        if self._zap is not None:
            self._zap.close()
            self._zap = None


ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class _ZapHandler:
    """ZeroMQ's ZAP protocol (RFC 27) in one small thread: admits CURVE clients whose public
    key is in ``allowed``, denies everything else (pyzmq's authenticator would pull asyncio
    into every actor)."""

    def __init__(self, context: zmq.Context[Any], allowed: frozenset[bytes]) -> None:
        self.allowed = frozenset(zmq.utils.z85.decode(k) for k in allowed)
        self.denied = 0
        self._sock = context.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = context.socket(zmq.PAIR)
        self._stop.linger = 0
        name = f"inproc://harness-zap-{id(self)}"
        self._stop.bind(name)
        stop_peer = context.socket(zmq.PAIR)
        stop_peer.linger = 0
        stop_peer.connect(name)
        self._thread = threading.Thread(
            target=self._run, args=(stop_peer,), name="harness-zap", daemon=True
        )
        self._thread.start()

    def _run(self, stop: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop in events:
                    return
                frames = self._sock.recv_multipart()
                self._sock.send_multipart(self._answer(frames))
        except zmq.ZMQError:
            return
        finally:
            stop.close()
            self._sock.close()

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, identity, mechanism, credentials...
        request_id = frames[1] if len(frames) > 1 else b""
        ok = (
            len(frames) >= 7
            and frames[0] == b"1.0"
            and frames[5] == b"CURVE"
            and frames[6] in self.allowed
        )
        if not ok:
            self.denied += 1
            if self.denied <= 10 or self.denied % 1000 == 0:  # a flood must not flood the log
                peer = frames[3].decode(errors="replace") if len(frames) > 3 else "?"
                log.warning(
                    "refused a peer at %s: it does not hold the cluster's keys (%d refused)",
                    peer,
                    self.denied,
                )
            return [b"1.0", request_id, b"400", b"unknown key", b"", b""]
        return [b"1.0", request_id, b"200", b"OK", b"", b""]

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._stop.send(b"")
        self._thread.join(timeout=2.0)
        self._stop.close()
