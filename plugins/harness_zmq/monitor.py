"""The cluster's web monitor: ``host_stats()`` for worker heartbeats and an HTTP server.

``MonitorServer(status_fn)`` serves, on loopback by default:

- ``GET /``: one self-contained page (inline CSS and JavaScript, no external resources) that
  polls ``/api/status`` every second and renders the master, workers, clients, jobs and queues;
- ``GET /api/status``: ``status_fn()`` as JSON (the status contract in docs/distributed.md);
  a raising ``status_fn`` answers 500 with ``{"error": ...}`` and the server keeps serving.

The status names hosts, pids and endpoints, so binding a non-loopback address is refused
unless ``allow_remote=True`` (the master passes it only when CURVE is on).

``host_stats()`` is cheap enough to call every second: it keeps its ``psutil.Process`` objects
between calls (so their ``cpu_percent`` is measured since the previous call, without blocking)
and initialises NVML once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import psutil

from harness_zmq.security import InsecureBind, is_loopback

log = logging.getLogger(__name__)

__all__ = ["MonitorServer", "host_stats"]

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

    def _route(self, *, head: bool) -> None:
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self._send(
                HTTPStatus.OK,
                _PAGE_BYTES,
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
        allow_remote: bool = False,
    ) -> None:
        if not allow_remote and not is_loopback(host):
            raise InsecureBind(
                f"the monitor would serve the cluster status on {host!r}, which is not a "
                "loopback address; it names hosts, pids and endpoints. Bind 127.0.0.1 and "
                "use an SSH tunnel, or run the cluster with CURVE keys (allow_remote=True)."
            )
        self.status_fn = status_fn
        self.host = host
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MonitorServer:
        """Bind and serve in a daemon thread. Returns ``self``."""
        if self._httpd is not None:
            return self
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


# ----------------------------------------------------------------------------------------------
# The page. Everything is built with textContent / createElement: names that peers report
# (worker names, hosts) never reach innerHTML.

_PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>harness cluster</title>
<style>
:root {
  --bg: #f6f7f9; --panel: #fff; --fg: #1d2330; --muted: #6b7385; --line: #e3e6ec;
  --ok: #1f8f4e; --bad: #c23b3b; --warn: #b7791f; --accent: #2f6fde; --bar: #dfe6f5;
}
@media (prefers-color-scheme: dark) {
  :root { --bg: #14171d; --panel: #1c2029; --fg: #e6e9ef; --muted: #9aa3b5; --line: #2c3240;
          --ok: #4cc38a; --bad: #ff6b6b; --warn: #f0b44c; --accent: #6b9cff; --bar: #2b3550; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 6px 18px;
         padding: 14px 24px; background: var(--panel); border-bottom: 1px solid var(--line); }
header h1 { font-size: 18px; margin: 0; }
header .meta { color: var(--muted); }
header .meta b { color: var(--fg); font-weight: 600; }
#updated { margin-left: auto; color: var(--muted); font-variant-numeric: tabular-nums; }
#updated::before { content: ""; display: inline-block; width: 8px; height: 8px;
                   border-radius: 50%; margin-right: 6px; background: var(--muted); }
#updated.live::before { background: var(--ok); }
#updated.stale::before { background: var(--bad); }
#error { display: none; margin: 12px 24px 0; padding: 10px 14px; border-radius: 6px;
         background: #fdecec; color: #8a1f1f; border: 1px solid #f3bcbc; }
@media (prefers-color-scheme: dark) { #error { background: #3a1d1f; color: #ffb4b4;
                                                border-color: #6e2c2f; } }
#error.show { display: block; }
main { padding: 12px 24px 32px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(160px, 1fr));
         gap: 12px; margin: 6px 0 18px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px;
        padding: 10px 14px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase;
           letter-spacing: .04em; }
.card .v { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
section { background: var(--panel); border: 1px solid var(--line); border-radius: 8px;
          margin-bottom: 18px; overflow-x: auto; }
section h2 { font-size: 14px; margin: 0; padding: 10px 14px; border-bottom: 1px solid var(--line); }
section h2 .count { color: var(--muted); font-weight: normal; margin-left: 6px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 14px; border-bottom: 1px solid var(--line);
         white-space: nowrap; }
th { color: var(--muted); font-weight: 600; font-size: 12px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:last-child td { border-bottom: 0; }
tr.dead td { color: var(--muted); }
.empty td { color: var(--muted); font-style: italic; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; border: 1px solid currentColor; }
.ok { color: var(--ok); } .bad { color: var(--bad); } .warn { color: var(--warn); }
.muted { color: var(--muted); }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
.bar { display: inline-block; vertical-align: middle; width: 64px; height: 6px;
       margin-left: 8px; border-radius: 3px; background: var(--bar); overflow: hidden; }
.bar > i { display: block; height: 100%; background: var(--accent); }
.gpu + .gpu { margin-top: 2px; }
.name { margin-left: 8px; font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1>harness cluster</h1>
  <span class="meta">master <b id="m-address" class="mono">—</b></span>
  <span class="meta">version <b id="m-version">—</b></span>
  <span class="meta">uptime <b id="m-uptime">—</b></span>
  <span class="meta">CURVE <b id="m-curve">—</b></span>
  <span class="meta">malformed <b id="m-malformed">—</b></span>
  <span class="meta">refused <b id="m-refused">—</b></span>
  <span id="updated">waiting for the first update…</span>
</header>
<div id="error" role="alert"></div>
<main>
  <div class="cards">
    <div class="card"><div class="k">workers alive</div><div class="v" id="c-workers">—</div></div>
    <div class="card"><div class="k">CPUs reserved</div><div class="v" id="c-cpus">—</div></div>
    <div class="card"><div class="k">actors</div><div class="v" id="c-jobs">—</div></div>
    <div class="card"><div class="k">clients</div><div class="v" id="c-clients">—</div></div>
    <div class="card"><div class="k">pending spawns</div><div class="v" id="c-pending">—</div></div>
  </div>

  <section>
    <h2>Workers<span class="count" id="n-workers"></span></h2>
    <table id="workers">
      <thead><tr>
        <th>id</th><th>host</th><th class="num">pid</th><th>state</th>
        <th class="num">CPUs used / total</th><th class="num">actors</th>
        <th class="num">CPU %</th><th class="num">memory</th><th>GPU util / memory</th>
        <th class="num">last heartbeat</th>
      </tr></thead>
      <tbody></tbody>
    </table>
  </section>

  <section>
    <h2>Clients<span class="count" id="n-clients"></span></h2>
    <table id="clients">
      <thead><tr>
        <th>id</th><th>host</th><th class="num">pid</th><th class="num">actors</th>
        <th class="num">connected</th><th class="num">steps/s</th>
        <th class="num">policy lag</th><th class="num">inbox</th><th class="num">dropped</th>
        <th>learner GPU util / memory</th>
      </tr></thead>
      <tbody></tbody>
    </table>
  </section>

  <section>
    <h2>Jobs<span class="count" id="n-jobs"></span></h2>
    <table id="jobs">
      <thead><tr>
        <th>actor</th><th>client</th><th>worker</th><th class="num">pid</th>
        <th class="num">CPUs</th><th>state</th>
      </tr></thead>
      <tbody></tbody>
    </table>
  </section>

  <section>
    <h2>Queues</h2>
    <table id="queues">
      <thead><tr><th>queue</th><th class="num">length</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
</main>
<script>
"use strict";
const POLL_MS = 1000, TIMEOUT_MS = 4000, MAX_JOB_ROWS = 1000;
let lastOk = null;

const $ = (id) => document.getElementById(id);
const isNum = (x) => typeof x === "number" && isFinite(x);
function el(tag, opts, children) {
  const e = document.createElement(tag);
  if (opts) {
    if (opts.cls) e.className = opts.cls;
    if (opts.text !== undefined && opts.text !== null) e.textContent = String(opts.text);
    if (opts.title) e.title = opts.title;
    if (opts.data) for (const [k, v] of Object.entries(opts.data)) e.dataset[k] = String(v);
  }
  for (const c of children || []) if (c) e.appendChild(c);
  return e;
}
const td = (text, cls) => el("td", {text: text === undefined || text === null ? "—" : text, cls});
function fixed(x, digits) { return isNum(x) ? x.toFixed(digits) : "—"; }
function cpusText(x) { return isNum(x) ? (Number.isInteger(x) ? String(x) : x.toFixed(1)) : "—"; }
function mb(x) {
  if (!isNum(x)) return "—";
  return x >= 1024 ? (x / 1024).toFixed(1) + " GB" : x.toFixed(0) + " MB";
}
function duration(s) {
  if (!isNum(s)) return "—";
  s = Math.max(0, s);
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), sec = Math.floor(s % 60);
  const p2 = (n) => String(n).padStart(2, "0");
  if (d) return d + "d " + h + "h " + p2(m) + "m";
  if (h) return h + "h " + p2(m) + "m " + p2(sec) + "s";
  return m + "m " + p2(sec) + "s";
}
function bar(frac) {
  if (!isNum(frac)) return null;
  const w = Math.round(Math.min(1, Math.max(0, frac)) * 100);
  const fillEl = el("i");
  fillEl.style.width = w + "%";
  return el("span", {cls: "bar", title: w + "%"}, [fillEl]);
}
function fill(table, rows, empty, cols) {
  const tbody = $(table).tBodies[0];
  if (!rows.length) {
    rows = [el("tr", {cls: "empty"}, [Object.assign(el("td", {text: empty}), {colSpan: cols})])];
  }
  tbody.replaceChildren(...rows);
}

function idCell(p) {
  // The id the master assigned, and the name the peer gave itself when that differs.
  const cell = el("td", {}, [el("span", {cls: "mono", text: p.id})]);
  if (p.name && p.name !== p.id) cell.appendChild(el("span", {cls: "muted name", text: p.name}));
  return cell;
}

function workerRow(w) {
  const alive = w.alive !== false;
  const state = el("td", {}, [el("span", {cls: "badge " + (alive ? "ok" : "bad"),
                                          text: alive ? "alive" : "dead"})]);
  const cpus = el("td", {cls: "num", text: cpusText(w.cpus_used) + " / " + cpusText(w.cpus)});
  if (isNum(w.cpus) && w.cpus > 0 && isNum(w.cpus_used)) {
    cpus.appendChild(bar(w.cpus_used / w.cpus));
  }
  const mem = el("td", {cls: "num", text: mb(w.memory_mb) + (isNum(w.memory_total_mb)
                                               ? " / " + mb(w.memory_total_mb) : "")});
  if (isNum(w.memory_mb) && isNum(w.memory_total_mb) && w.memory_total_mb > 0) {
    mem.appendChild(bar(w.memory_mb / w.memory_total_mb));
  }
  const gpus = Array.isArray(w.gpu) ? w.gpu : [];
  const gpu = el("td", {cls: gpus.length ? "" : "muted", text: gpus.length ? null : "none"});
  for (const g of gpus) {
    gpu.appendChild(el("div", {cls: "gpu", text: "#" + g.index + " " + fixed(g.util, 0) + "% · "
                                   + mb(g.memory_used_mb) + " / " + mb(g.memory_total_mb)}));
  }
  const age = w.last_heartbeat_s;
  const hb = el("td", {cls: "num" + (isNum(age) && age > 3 ? " warn" : ""),
                       text: isNum(age) ? duration(age) + " ago" : "—"});
  return el("tr", {cls: alive ? "" : "dead", data: {workerId: w.id}}, [
    idCell(w), td(w.host), td(w.pid, "num"), state, cpus,
    td(w.actors, "num"), td(fixed(w.cpu_percent, 1), "num"), mem, gpu, hb,
  ]);
}

function clientRow(c) {
  const m = c.metrics || {};
  const dropped = td(m.dropped, "num" + (isNum(m.dropped) && m.dropped > 0 ? " warn" : ""));
  return el("tr", {data: {clientId: c.id}}, [
    idCell(c), td(c.host), td(c.pid, "num"), td(c.actors, "num"),
    td(duration(c.connected_s), "num"), td(fixed(m.steps_per_s, 1), "num"),
    td(fixed(m.policy_lag, 2), "num"), td(m.inbox, "num"), dropped, learnerGpu(m),
  ]);
}

function learnerGpu(m) {
  // what a CUDA learner reports (harness.runtime.farm): NVML's view, else torch's allocations
  if (isNum(m.gpu_util)) {
    return td(fixed(m.gpu_util, 0) + "% · " + mb(m.gpu_memory_used_mb) + " / "
              + mb(m.gpu_memory_total_mb));
  }
  if (isNum(m.gpu_torch_mb)) return td("torch " + mb(m.gpu_torch_mb));
  return el("td", {cls: "muted", text: "none"});
}

function jobRow(j) {
  const st = String(j.state === undefined ? "—" : j.state);
  const bad = /died|dead|fail|error|lost|killed/.test(st);
  const cls = st === "running" ? "ok" : (bad ? "bad" : "warn");
  return el("tr", {data: {actorId: j.actor_id}}, [
    el("td", {cls: "mono", text: j.actor_id}), td(j.client_id, "mono"), td(j.worker_id, "mono"),
    td(j.pid, "num"), td(cpusText(j.cpus), "num"),
    el("td", {}, [el("span", {cls: "badge " + cls, text: st})]),
  ]);
}

function render(s) {
  const m = s.master || {};
  $("m-address").textContent = m.address || "—";
  const proto = m.protocol !== undefined ? " (protocol " + m.protocol + ")" : "";
  $("m-version").textContent = (m.version || "—") + proto;
  $("m-uptime").textContent = duration(m.uptime_s);
  const curve = $("m-curve");
  curve.textContent = m.curve ? "on" : "off";
  curve.className = m.curve ? "ok" : "muted";
  for (const k of ["malformed", "refused"]) {
    const e = $("m-" + k);
    e.textContent = isNum(m[k]) ? String(m[k]) : "—";
    e.className = isNum(m[k]) && m[k] > 0 ? "warn" : "";
  }

  const workers = Array.isArray(s.workers) ? s.workers : [];
  const clients = Array.isArray(s.clients) ? s.clients : [];
  const jobs = Array.isArray(s.jobs) ? s.jobs : [];
  const queues = s.queues && typeof s.queues === "object" ? s.queues : {};
  const alive = workers.filter((w) => w.alive !== false);
  const sum = (xs, k) => xs.reduce((a, x) => a + (isNum(x[k]) ? x[k] : 0), 0);
  $("c-workers").textContent = alive.length + " / " + workers.length;
  $("c-cpus").textContent =
    cpusText(sum(alive, "cpus_used")) + " / " + cpusText(sum(alive, "cpus"));
  $("c-jobs").textContent = String(jobs.length);
  $("c-clients").textContent = String(clients.length);
  $("c-pending").textContent = isNum(queues.pending_spawns) ? String(queues.pending_spawns) : "—";
  $("n-workers").textContent = workers.length;
  $("n-clients").textContent = clients.length;
  $("n-jobs").textContent = jobs.length;

  fill("workers", workers.map(workerRow), "no workers have joined", 10);
  fill("clients", clients.map(clientRow), "no clients connected", 9);
  const jobRows = jobs.slice(0, MAX_JOB_ROWS).map(jobRow);
  if (jobs.length > MAX_JOB_ROWS) {
    jobRows.push(el("tr", {cls: "empty"}, [Object.assign(
      el("td", {text: "… and " + (jobs.length - MAX_JOB_ROWS) + " more"}), {colSpan: 6})]));
  }
  fill("jobs", jobRows, "no actors running", 6);
  const queueRows = Object.entries(queues).map(([k, v]) =>
    el("tr", {}, [td(k), td(typeof v === "object" ? JSON.stringify(v) : v, "num")]));
  fill("queues", queueRows, "no queues", 2);
}

function showError(msg) {
  const e = $("error");
  e.textContent = "Cannot update the status: " + msg +
    (lastOk ? " — showing the data from " + lastOk.toLocaleTimeString() + "." : ".");
  e.classList.add("show");
  const u = $("updated");
  u.className = "stale";
  u.textContent = lastOk
    ? "last updated " + lastOk.toLocaleTimeString() + " (stale)" : "no data yet";
}

async function poll() {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  try {
    const r = await fetch("/api/status", {cache: "no-store", signal: ctl.signal});
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (!r.ok) throw new Error("HTTP " + r.status + (body && body.error ? ": " + body.error : ""));
    if (!body || typeof body !== "object") throw new Error("the reply is not a JSON object");
    render(body);
    lastOk = new Date();
    $("error").classList.remove("show");
    const u = $("updated");
    u.className = "live";
    u.textContent = "last updated " + lastOk.toLocaleTimeString();
    u.title = lastOk.toISOString();
  } catch (e) {
    showError(e && e.name === "AbortError" ? "the master did not answer within "
              + TIMEOUT_MS / 1000 + " s" : String(e && e.message || e));
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);
  }
}
poll();
</script>
</body>
</html>
"""

_PAGE_BYTES = _PAGE.encode("utf-8")
