"""The cluster's web monitor: ``host_stats()`` for worker heartbeats and an HTTP server.

``MonitorServer(status_fn)`` serves, on loopback by default:

- ``GET /``: one self-contained page (inline CSS and JavaScript, no external resources) that
  polls ``/api/status`` every second and renders the master, workers, clients, jobs and queues
  (``monitor.html``, package data read with :mod:`importlib.resources`);
- ``GET /api/status``: ``status_fn()`` as JSON (the status contract in docs/distributed.md);
  a raising ``status_fn`` answers 500 with ``{"error": ...}`` and the server keeps serving;
- with a ``live`` store (:class:`~harness_zmq.live.LiveStore`, the master's): ``GET
  /api/logs`` (every actor's last lines), ``GET /api/logs/ACTOR?since=N`` (one actor's output
  after byte offset N, to follow it) and ``GET /api/runs`` (the runs' recent metrics).

The status names hosts, pids and endpoints, and the logs carry actors' output, so binding a
non-loopback address needs a ``token``: every request must then carry it, as the header
``Authorization: Bearer TOKEN`` or as the cookie that visiting ``/?token=TOKEN`` once sets
(compared in constant time); anything else is answered 401 and shows nothing. Without a token
a non-loopback bind is refused (:class:`~harness_zmq.security.InsecureBind`). On loopback no
token is asked: the server is reachable only from this host, whose users can read most of the
status from ``/proc`` (pids, command lines, sockets), and a token would add a secret to every
local ``curl`` and tunnel; the actors' output is the exception (docs/distributed.md, "Threat
model", says where that matters).

``host_stats()`` is cheap enough to call every second: it keeps its ``psutil.Process`` objects
between calls (so their ``cpu_percent`` is measured since the previous call, without blocking)
and initialises NVML once.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psutil

from harness_zmq.live import LiveStore
from harness_zmq.security import InsecureBind, is_loopback

log = logging.getLogger(__name__)

__all__ = ["MonitorServer", "host_stats", "make_token"]

# ----------------------------------------------------------------------------------------------
# host_stats


class _TreeSampler:
    """CPU and memory of this process and all its descendants (a worker and its actors).

    ``psutil.Process.cpu_percent(interval=None)`` compares against the previous call on the
    same object, so the objects are kept per pid and only new pids get new objects (their first
    sample reads 0.0). Over a very short interval those percentages are noise (CPU times tick
    in 10 ms), so CPU is re-measured at most every ``MIN_CPU_INTERVAL_S``; calls in between
    repeat the previous CPU figures (memory is always fresh).
    """

    MIN_CPU_INTERVAL_S = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root = psutil.Process()
        self.pid = self._root.pid
        self._procs: dict[int, psutil.Process] = {}
        self._cpu_at = -math.inf
        self._cpu = 0.0
        self._host_cpu = 0.0

    def sample(self) -> tuple[float, float, float]:
        """(CPU percent of one core summed over the tree, host CPU percent, tree RSS in MB)."""
        with self._lock:
            now = time.monotonic()
            measure_cpu = now - self._cpu_at >= self.MIN_CPU_INTERVAL_S
            try:
                children = self._root.children(recursive=True)
            except psutil.Error:
                children = []
            seen: dict[int, psutil.Process] = {}
            fresh: set[int] = set()
            for child in children:
                # Reuse the stored object unless the pid was recycled by another process.
                kept = self._procs.get(child.pid)
                if kept is not None and kept == child:
                    seen[child.pid] = kept
                else:
                    seen[child.pid] = child
                    fresh.add(child.pid)
                    with contextlib.suppress(psutil.Error):
                        child.cpu_percent(None)  # the baseline: its first reading is 0.0
            self._procs = seen
            cpu = 0.0
            rss = 0
            for proc in (self._root, *seen.values()):
                try:
                    with proc.oneshot():
                        if measure_cpu and proc.pid not in fresh:
                            cpu += proc.cpu_percent(None)
                        rss += proc.memory_info().rss
                except psutil.Error:  # exited between children() and here
                    continue
            if measure_cpu:
                self._cpu_at = now
                self._cpu = min(cpu, 100.0 * (os.cpu_count() or 1))
                self._host_cpu = psutil.cpu_percent(None)
            return self._cpu, self._host_cpu, rss / 2**20


class _Gpus:
    """NVML queries; NVML is initialised at most once and its absence is remembered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._tried = False
        self._count = 0

    def _init(self) -> None:
        self._tried = True
        try:
            import pynvml  # nvidia-ml-py, the `gpu-monitor` extra

            pynvml.nvmlInit()
            self._count = int(pynvml.nvmlDeviceGetCount())
            self._nvml = pynvml
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
            log.debug("no GPU statistics: %s", e)
            self._nvml = None

    def sample(self) -> list[dict[str, Any]]:
        with self._lock:
            if not self._tried:
                self._init()
            nvml = self._nvml
            if nvml is None:
                return []
            out: list[dict[str, Any]] = []
            for index in range(self._count):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    util = nvml.nvmlDeviceGetUtilizationRates(handle)
                    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                except Exception as e:  # a device that fell off the bus, a driver reload
                    log.debug("GPU %d: %s", index, e)
                    continue
                out.append(
                    {
                        "index": index,
                        "util": float(util.gpu),
                        "memory_used_mb": mem.used / 2**20,
                        "memory_total_mb": mem.total / 2**20,
                    }
                )
            return out


_sampler: _TreeSampler | None = None
_gpus = _Gpus()
_init_lock = threading.Lock()


def host_stats() -> dict[str, Any]:
    """This host as a worker heartbeat reports it. Never raises.

    - ``cpu_percent``: CPU use of the calling process and all its descendants (a worker and
      its actor processes), in percent of one core as ``top`` shows it (so up to
      ``100 * cpus``), measured since the previous call at least 0.5 s earlier (the first
      call reads 0);
    - ``memory_mb``: resident memory (RSS) of that same process tree, in MB;
    - ``memory_total_mb``: the host's physical memory, in MB;
    - ``cpus``: ``os.cpu_count()``;
    - ``gpu``: ``[{"index", "util" (percent), "memory_used_mb", "memory_total_mb"}]`` via NVML
      (``pynvml`` from nvidia-ml-py) when it imports and initialises; ``[]`` otherwise;
    - ``host_cpu_percent`` and ``host_memory_used_mb``: the whole machine, for context.
    """
    global _sampler
    stats: dict[str, Any] = {
        "cpu_percent": 0.0,
        "memory_mb": 0.0,
        "memory_total_mb": 0.0,
        "cpus": os.cpu_count() or 1,
        "gpu": [],
        "host_cpu_percent": 0.0,
        "host_memory_used_mb": 0.0,
    }
    try:
        if _sampler is None or _sampler.pid != os.getpid():  # first call, or a forked child
            with _init_lock:
                if _sampler is None or _sampler.pid != os.getpid():
                    _sampler = _TreeSampler()
        cpu, host_cpu, rss_mb = _sampler.sample()
        stats["cpu_percent"] = round(cpu, 1)
        stats["host_cpu_percent"] = round(host_cpu, 1)
        stats["memory_mb"] = round(rss_mb, 1)
        vm = psutil.virtual_memory()
        stats["memory_total_mb"] = round(vm.total / 2**20, 1)
        stats["host_memory_used_mb"] = round((vm.total - vm.available) / 2**20, 1)
    except Exception as e:  # pragma: no cover - psutil failing on an exotic platform
        log.debug("host_stats: %s", e)
    try:
        stats["gpu"] = _gpus.sample()
    except Exception as e:  # pragma: no cover - _Gpus already catches per call
        log.debug("host_stats gpu: %s", e)
    return stats


# ----------------------------------------------------------------------------------------------
# HTTP server


def _finite(value: Any) -> Any:
    """JSON without NaN/Infinity (the browser's JSON.parse rejects them): those become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_PAGE_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


PAGE_FILE = "monitor.html"
COOKIE = "harness_monitor"
"""The cookie that carries a non-loopback monitor's token (set by visiting ``/?token=``)."""
TOKEN_FILE = "monitor.token"
"""The token's file (mode 0600) in the cluster's key directory."""


def make_token(directory: Path | None) -> str:
    """A fresh monitor token, written (0600, replacing an earlier one) as ``directory /
    TOKEN_FILE`` where there is a directory."""
    token = secrets.token_urlsafe(32)
    if directory is not None:
        path = directory / TOKEN_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        tmp.replace(path)
    return token


@functools.cache
def page() -> bytes:
    """The page served at ``/``: ``monitor.html``, package data beside this module. It builds
    everything with textContent / createElement: names that peers report (worker names,
    hosts) never reach innerHTML."""
    return resources.files("harness_zmq").joinpath(PAGE_FILE).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server_version = "harness-monitor"
    monitor: MonitorServer  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
        *,
        head: bool = False,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, code: int, obj: Any, *, head: bool = False) -> None:
        body = json.dumps(_finite(obj), default=str, allow_nan=False).encode()
        self._send(code, body, "application/json; charset=utf-8", head=head)

    def _authorized(self, url: Any, *, head: bool) -> bool:
        """True when no token is needed or the request carries it; else answers it (401, or
        the cookie and a redirect for a first visit to ``/?token=TOKEN``)."""
        token = self.monitor.token
        if token is None:
            return True
        offered = ""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            offered = auth[len("Bearer ") :].strip()
        else:
            with contextlib.suppress(CookieError):
                morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
                offered = morsel.value if morsel is not None else ""
        if offered and hmac.compare_digest(offered.encode(), token.encode()):
            return True
        given = parse_qs(url.query).get("token", [""])[0]
        if url.path == "/" and given and hmac.compare_digest(given.encode(), token.encode()):
            cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            self._send(
                HTTPStatus.SEE_OTHER,
                b"",
                "text/plain",
                {"Location": "/", "Set-Cookie": cookie},
                head=head,
            )
            return False
        self._send(
            HTTPStatus.UNAUTHORIZED,
            b"this monitor needs its token: open the URL with ?token= that 'harness cluster "
            b"start' printed, or send 'Authorization: Bearer TOKEN'\n",
            "text/plain; charset=utf-8",
            {"WWW-Authenticate": 'Bearer realm="harness-monitor"'},
            head=head,
        )
        return False

    def _route(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        path = url.path
        if not self._authorized(url, head=head):
            return
        live = self.monitor.live
        if live is not None and (
            path in ("/api/logs", "/api/runs") or path.startswith("/api/logs/")
        ):
            self._live(live, path, url.query, head=head)
            return
        if path in ("/", "/index.html"):
            self._send(
                HTTPStatus.OK,
                page(),
                "text/html; charset=utf-8",
                {"Content-Security-Policy": _PAGE_CSP},
                head=head,
            )
        elif path == "/api/status":
            try:
                status = self.monitor.status_fn()
                body = json.dumps(_finite(status), default=str, allow_nan=False).encode()
            except Exception as e:
                log.warning("monitor: status function failed: %r", e)
                self._json(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    {"error": f"{type(e).__name__}: {e}"},
                    head=head,
                )
                return
            self._send(HTTPStatus.OK, body, "application/json; charset=utf-8", head=head)
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"}, head=head)

    def _live(self, live: LiveStore, path: str, query: str, *, head: bool) -> None:
        if path == "/api/runs":
            self._json(HTTPStatus.OK, {"runs": live.runs()}, head=head)
        elif path == "/api/logs":
            self._json(HTTPStatus.OK, {"actors": live.tails()}, head=head)
        else:
            actor_id = unquote(path[len("/api/logs/") :])
            since_text = parse_qs(query).get("since", ["0"])[0]
            since = int(since_text) if since_text.isdigit() else 0
            found = live.output(actor_id, since)
            if found is None:
                self._json(
                    HTTPStatus.NOT_FOUND, {"error": f"no output of actor {actor_id}"}, head=head
                )
            else:
                self._json(HTTPStatus.OK, found, head=head)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class MonitorServer:
    """The monitor's HTTP server, in a daemon thread.

    >>> server = MonitorServer(lambda: {"workers": []}).start()
    >>> server.url  # doctest: +SKIP
    'http://127.0.0.1:43117/'
    >>> server.close()
    """

    def __init__(
        self,
        status_fn: Callable[[], dict[str, Any]],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        live: LiveStore | None = None,
    ) -> None:
        if not token and not is_loopback(host):
            raise InsecureBind(
                f"the monitor would serve the cluster status on {host!r}, which is not a "
                "loopback address, without a token; it names hosts, pids and endpoints and "
                "shows the actors' output. Bind 127.0.0.1 (and use an SSH tunnel), or serve it "
                "from a cluster master, which makes a token for a non-loopback monitor."
            )
        self.token = token or None
        self.status_fn = status_fn
        self.live = live
        self.host = host
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MonitorServer:
        """Bind and serve in a daemon thread. Returns ``self``."""
        if self._httpd is not None:
            return self
        page()  # read now: a missing page file fails the start, not the first request
        handler = type("MonitorHandler", (_Handler,), {"monitor": self})
        bind_host = self.host.strip("[]")
        server_cls = _Server6 if ":" in bind_host else _Server
        self._httpd = server_cls((bind_host, self._port), handler)
        self._port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"harness-monitor:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        """The bound port (the requested one before ``start``)."""
        return self._port

    @property
    def url(self) -> str:
        host = self.host.strip("[]")
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}/"

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> MonitorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
