"""The cluster monitor: ``MonitorServer`` (HTTP + JSON), ``host_stats()``, and the page as a
real headless Chromium renders it, against a fake status and against a real cluster.

The browser tests need ``chromium`` (``tools/install_chromium.sh`` installs Debian's package);
when it is missing the fixture runs that script once and skips only if it is still missing.
Set ``HARNESS_ARTIFACTS=DIR`` to keep the screenshots there as well as under ``tmp_path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psutil
import pytest
from browser import check_screenshot, chromium_binary, open_page

from harness_zmq import monitor
from harness_zmq.monitor import MonitorServer, host_stats
from harness_zmq.security import InsecureBind

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "plugins" / "harness_zmq"


def sample_status() -> dict[str, Any]:
    """A status that follows the contract in docs/distributed.md, with an id that would be
    markup if the page used innerHTML."""
    return {
        "master": {
            "address": "tcp://127.0.0.1:7450",
            "pid": 1,
            "version": "0.1.0",
            "protocol": 1,
            "curve": False,
            "uptime_s": 12.5,
            "malformed": 0,
            "refused": 0,
        },
        "workers": [
            {
                "id": "w1",
                "name": "gpu-box-1",
                "host": "127.0.0.1",
                "pid": 2,
                "cpus": 2,
                "cpus_used": 1.0,
                "gpus": 0,
                "actors": 1,
                "alive": True,
                "last_heartbeat_s": 0.4,
                "cpu_percent": 35.0,
                "memory_mb": 410.0,
                "memory_total_mb": 24000.0,
                "gpu": [],
            },
            {
                "id": "w2-<b>gpu</b>",
                "host": "node7",
                "pid": 5,
                "cpus": 8,
                "cpus_used": 3.5,
                "gpus": 1,
                "actors": 3,
                "alive": False,
                "last_heartbeat_s": 9.0,
                "cpu_percent": 120.0,
                "memory_mb": 4100.0,
                "memory_total_mb": 64000.0,
                "gpu": [
                    {"index": 0, "util": 71.0, "memory_used_mb": 5120.0, "memory_total_mb": 81920.0}
                ],
            },
        ],
        "clients": [
            {
                "id": "c1",
                "host": "127.0.0.1",
                "pid": 3,
                "actors": 1,
                "connected_s": 10.0,
                "metrics": {
                    "steps_per_s": 1500.0,
                    "policy_lag": 0.5,
                    "inbox": 2,
                    "dropped": 0,
                    "gpu_util": 63.0,
                    "gpu_memory_used_mb": 2048.0,
                    "gpu_memory_total_mb": 81920.0,
                },
            },
            {
                "id": "c2",
                "host": "10.0.0.7",
                "pid": 5,
                "actors": 0,
                "connected_s": 2.0,
                "metrics": {"steps_per_s": 0.0, "policy_lag": 0.0, "inbox": 0, "dropped": 0},
            },
        ],
        "jobs": [
            {
                "actor_id": "a1",
                "client_id": "c1",
                "worker_id": "w1",
                "pid": 4,
                "cpus": 1.0,
                "state": "running",
            }
        ],
        "queues": {"pending_spawns": 0},
    }


def get(url: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def server() -> Iterator[MonitorServer]:
    s = MonitorServer(sample_status).start()
    try:
        yield s
    finally:
        s.close()


# ----------------------------------------------------------------------------------------------
# HTTP


def test_status_json_equals_the_status_fn(server: MonitorServer) -> None:
    code, headers, body = get(server.url + "api/status")
    assert code == 200
    assert headers["Content-Type"].startswith("application/json")
    assert headers["Cache-Control"] == "no-store"
    assert json.loads(body) == sample_status()
    # A query string (cache busting) is the same route.
    assert json.loads(get(server.url + "api/status?t=1")[2]) == sample_status()


def test_page_is_self_contained(server: MonitorServer) -> None:
    code, headers, body = get(server.url)
    assert code == 200
    assert headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert "<title>harness cluster</title>" in page
    assert 'id="workers"' in page
    assert 'fetch("/api/status"' in page
    # No CDN or other external resource: the test machines have no internet.
    for needle in ('src="http', "src='http", 'href="http', "href='http", "@import", "//cdn"):
        assert needle not in page
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_unknown_path_is_404(server: MonitorServer) -> None:
    code, _, body = get(server.url + "api/nope")
    assert code == 404
    assert "error" in json.loads(body)
    assert get(server.url + "favicon.ico")[0] == 404


def test_raising_status_fn_is_500_and_the_server_keeps_serving() -> None:
    fail = {"on": True}

    def status() -> dict[str, Any]:
        if fail["on"]:
            raise RuntimeError("master state is locked")
        return sample_status()

    with MonitorServer(status) as s:
        for _ in range(2):
            code, headers, body = get(s.url + "api/status")
            assert code == 500
            assert headers["Content-Type"].startswith("application/json")
            assert "RuntimeError: master state is locked" in json.loads(body)["error"]
        fail["on"] = False
        code, _, body = get(s.url + "api/status")
        assert code == 200
        assert json.loads(body) == sample_status()
        assert get(s.url)[0] == 200


def test_non_finite_numbers_become_null() -> None:
    status = {"master": {"uptime_s": float("nan")}, "workers": [{"cpu_percent": float("inf")}]}
    with MonitorServer(lambda: status) as s:
        code, _, body = get(s.url + "api/status")
    assert code == 200
    assert b"NaN" not in body and b"Infinity" not in body
    assert json.loads(body) == {"master": {"uptime_s": None}, "workers": [{"cpu_percent": None}]}


def test_requests_are_served_concurrently() -> None:
    def slow() -> dict[str, Any]:
        time.sleep(0.6)
        return sample_status()

    with MonitorServer(slow) as s:
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(get(s.url + "api/status")[0]))
            for _ in range(4)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        elapsed = time.monotonic() - t0
    assert results == [200] * 4
    assert elapsed < 2.0, f"4 requests of 0.6 s each took {elapsed:.1f} s: not threaded"


def test_non_loopback_bind_is_refused() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.10"):
        with pytest.raises(InsecureBind, match="loopback"):
            MonitorServer(sample_status, host=host)
    # With a token it may (the master makes one for a monitor off loopback); not started
    # here: test_trust.py serves one on a namespace's address and asks for the token
    MonitorServer(sample_status, host="0.0.0.0", token="t0ken")
    with MonitorServer(sample_status, host="localhost") as s:
        assert get(s.url + "api/status")[0] == 200


def test_port_url_and_close() -> None:
    s = MonitorServer(sample_status).start()
    port = s.port
    assert port > 0
    assert s.url == f"http://127.0.0.1:{port}/"
    assert s.start() is s  # idempotent
    s.close()
    s.close()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # The port is free again.
    with MonitorServer(sample_status, port=port) as again:
        assert again.port == port
        assert get(again.url + "api/status")[0] == 200


# ----------------------------------------------------------------------------------------------
# host_stats


def test_host_stats_fields_and_values() -> None:
    stats = host_stats()
    for field in ("cpu_percent", "memory_mb", "memory_total_mb", "cpus", "gpu"):
        assert field in stats, field
    assert stats["cpus"] == os.cpu_count()
    assert isinstance(stats["gpu"], list)
    assert 0 <= stats["cpu_percent"] <= 100 * stats["cpus"] + 1
    assert 1 < stats["memory_mb"] < stats["memory_total_mb"]
    assert stats["host_memory_used_mb"] <= stats["memory_total_mb"]
    json.dumps(stats)  # goes into a msgpack/JSON heartbeat as is
    for gpu in stats["gpu"]:
        assert set(gpu) == {"index", "util", "memory_used_mb", "memory_total_mb"}


def test_host_stats_is_cheap() -> None:
    host_stats()
    t0 = time.perf_counter()
    for _ in range(20):
        host_stats()
    per_call = (time.perf_counter() - t0) / 20
    assert per_call < 0.05, f"host_stats took {per_call * 1000:.1f} ms per call"


def test_host_stats_counts_child_processes() -> None:
    """The worker's actors are its children: their CPU and memory are in the numbers."""
    code = (
        "import sys, time\n"
        "block = bytearray(300 * 2**20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "print('ready', flush=True)\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 20: pass\n"
    )
    before = host_stats()["memory_mb"]
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        host_stats()  # the first sample of a new process reads 0 CPU
        time.sleep(1.0)
        stats = host_stats()
        assert stats["memory_mb"] > before + 250, (before, stats)
        assert stats["cpu_percent"] > 10, stats
    finally:
        child.kill()
        child.wait(timeout=10)


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(fail_init: bool, calls: list[str]) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def nvmlInit() -> None:
        calls.append("init")
        if fail_init:
            raise _FakeNvmlError("NVML Shared Library Not Found")

    mod.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * (h + 1))  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=(h + 1) * 2**30, total=80 * 2**30
    )
    return mod


def test_gpu_stats_with_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(False, calls))
    monkeypatch.setattr(monitor, "_gpus", monitor._Gpus())
    for _ in range(2):
        gpus = host_stats()["gpu"]
        assert gpus == [
            {"index": 0, "util": 10.0, "memory_used_mb": 1024.0, "memory_total_mb": 81920.0},
            {"index": 1, "util": 20.0, "memory_used_mb": 2048.0, "memory_total_mb": 81920.0},
        ]
    assert calls == ["init"]


def test_gpu_stats_without_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU driver ``nvmlInit`` raises: tried once, remembered, an empty list."""
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(True, calls))
    monkeypatch.setattr(monitor, "_gpus", monitor._Gpus())
    assert host_stats()["gpu"] == []
    assert host_stats()["gpu"] == []
    assert calls == ["init"]


def test_gpu_stats_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    monkeypatch.setattr(monitor, "_gpus", monitor._Gpus())
    assert host_stats()["gpu"] == []


# ----------------------------------------------------------------------------------------------
# A real browser


@pytest.fixture(scope="session")
def chromium() -> str:
    return chromium_binary()


def run_chromium(
    binary: str, tmp_path: Path, url: str, *mode: str, budget_ms: int = 5000
) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run on the monitor (served on loopback, so not offline)."""
    return open_page(binary, tmp_path, url, *mode, budget_ms=budget_ms, offline=False)


class _PageReader(HTMLParser):
    """The rendered page: worker ids in ``#workers``, the banner and "last updated"."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.worker_ids: list[str] = []
        self.client_rows: dict[str, str] = {}  # client id -> its row's text
        self._client: str | None = None
        self.in_workers = 0
        self.error_classes: str | None = None
        self.error_text = ""
        self.updated_text = ""
        self._capture: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            if self.in_workers:
                self.in_workers += 1
            elif a.get("id") == "workers":
                self.in_workers = 1
        if tag == "tr" and self.in_workers and "data-worker-id" in a:
            self.worker_ids.append(a["data-worker-id"] or "")
        if tag == "tr" and "data-client-id" in a:
            self._client = a["data-client-id"] or ""
            self.client_rows[self._client] = ""
        elif tag == "td" and self._client is not None:
            self.client_rows[self._client] += " | "
        if a.get("id") == "error":
            self.error_classes = a.get("class") or ""
            self._capture = "error"
        elif a.get("id") == "updated":
            self._capture = "updated"

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._client = None
        if tag == "table" and self.in_workers:
            self.in_workers -= 1
        if tag in ("div", "span"):
            self._capture = None

    def handle_data(self, data: str) -> None:
        if self._client is not None:
            self.client_rows[self._client] += data
        if self._capture == "error":
            self.error_text += data
        elif self._capture == "updated":
            self.updated_text += data


def render(binary: str, tmp_path: Path, url: str) -> _PageReader:
    reader = _PageReader()
    reader.feed(run_chromium(binary, tmp_path, url, "--dump-dom").stdout)
    return reader


def screenshot(binary: str, tmp_path: Path, url: str, name: str) -> Path:
    shot = tmp_path / name
    run_chromium(binary, tmp_path, url, f"--screenshot={shot}", "--window-size=1280,900")
    check_screenshot(shot)
    return shot


def test_browser_renders_the_workers(chromium: str, tmp_path: Path) -> None:
    with MonitorServer(sample_status) as s:
        page = render(chromium, tmp_path, s.url)
        shot = screenshot(chromium, tmp_path, s.url, "monitor.png")
    expected = [w["id"] for w in sample_status()["workers"]]
    assert page.worker_ids == expected  # markup in an id stays text
    # a CUDA learner's GPU (what the farm reports through its client), and none for the other
    assert page.client_rows["c1"].endswith("| 63% · 2.0 GB / 80.0 GB"), page.client_rows
    assert page.client_rows["c2"].endswith("| none"), page.client_rows
    assert page.updated_text.startswith("last updated"), page.updated_text
    assert page.error_classes is not None and "show" not in page.error_classes.split()
    print(f"screenshot: {shot}")


def test_browser_shows_an_error_banner(chromium: str, tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("the master is gone")

    with MonitorServer(broken) as s:
        page = render(chromium, tmp_path, s.url)
    assert page.error_classes is not None and "show" in page.error_classes.split()
    assert "HTTP 500" in page.error_text and "the master is gone" in page.error_text
    assert page.worker_ids == []


# ----------------------------------------------------------------------------------------------
# A real cluster (helper B's master and CLI)

CLUSTER_MISSING = not (PLUGIN_DIR / "master.py").exists() or not (PLUGIN_DIR / "cli.py").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def harness_cli() -> list[str]:
    exe = Path(sys.executable).with_name("harness")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]


@pytest.mark.skipif(
    CLUSTER_MISSING,
    reason="plugins/harness_zmq/master.py or cli.py is missing: no cluster to monitor yet",
)
def test_browser_against_a_real_cluster(chromium: str, tmp_path: Path) -> None:
    port, monitor_port = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "HARNESS_STATE_DIR": str(tmp_path / "state")}
    log = (tmp_path / "cluster.log").open("w")
    cluster = subprocess.Popen(
        [
            *harness_cli(),
            "cluster",
            "start",
            "--cpus",
            "2",
            "--port",
            str(port),
            "--monitor-port",
            str(monitor_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{monitor_port}/"
    procs: dict[int, psutil.Process] = {}  # the cluster's processes, as the status names them

    def remember(pid: Any) -> None:
        if isinstance(pid, int) and pid > 0 and pid != os.getpid() and pid not in procs:
            with contextlib.suppress(psutil.Error):
                procs[pid] = psutil.Process(pid)

    try:
        status: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                code, _, body = get(url + "api/status", timeout=2)
                if code == 200:
                    status = json.loads(body)
                    remember(status.get("master", {}).get("pid"))
                    for w in status.get("workers", []):
                        remember(w.get("pid"))
                    if any(w.get("alive") for w in status.get("workers", [])):
                        break
            if cluster.poll() not in (None, 0):
                break
            time.sleep(0.3)
        else:
            status = {}
        assert status.get("workers"), (
            f"no worker registered within 60 s; cluster log:\n{_tail(tmp_path / 'cluster.log')}"
        )

        page = render(chromium, tmp_path, url)
        _, _, body = get(url + "api/status")
        ids_now = [w["id"] for w in json.loads(body)["workers"]]
        assert page.worker_ids, "the page rendered no worker rows"
        assert sorted(page.worker_ids) == sorted(ids_now)
        screenshot(chromium, tmp_path, url, "monitor-cluster.png")
    finally:
        stop = subprocess.run(
            [*harness_cli(), "cluster", "stop", address],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.wait(timeout=30)
        # Whatever this test started that outlived `stop`: the group it led, then the
        # processes the status named (is_running() checks the pid was not reused since).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(cluster.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.wait(timeout=10)
        for proc in procs.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()
        log.close()
    assert stop.returncode == 0, f"harness cluster stop failed: {stop.stdout}{stop.stderr}"


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


# ----------------------------------------------------------------------------------------------
# The live view: actors' output (escaped), one actor followed, runs' charts


INJECTION = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b> & </pre><script>x()</script>"


def sample_live() -> Any:
    from harness_zmq.live import LiveStore

    live = LiveStore()
    live.add_output("a1", "w1", 0, 6, "hello\n")
    line = f"{INJECTION}\n"
    live.add_output("a1", "w1", 6, 6 + len(line.encode()), line)
    live.add_output("a2-<i>x</i>", "w1", 0, 10, "second actor\n")
    live.actor_ended("a2-<i>x</i>", "w1")
    for step in range(1, 41):
        live.add_metrics(
            "c1",
            "learner <b>1</b>",
            "127.0.0.1",
            {"step": step * 1000, "steps_per_s": 900.0 + step, "episode_return": step * 2.5},
        )
    return live


class _LiveReader(HTMLParser):
    """The live sections of the rendered page: log rows' text, run cards' charts, the
    followed output and every element name (an injected tag would be one)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.live_tags: set[str] = set()  # elements inside log rows and run cards
        self.log_rows: dict[str, str] = {}
        self.charts: dict[str, dict[str, tuple[int, bool]]] = {}  # run -> series -> (n, line)
        self.follow_text = ""
        self.follow_shown = False
        self.run_titles: dict[str, str] = {}
        self._in_title = False
        self._row: str | None = None
        self._run: str | None = None
        self._series: str | None = None
        self._in_follow = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if self._row is not None or self._run is not None:
            self.live_tags.add(tag)
        if tag == "tr" and "data-log-actor-id" in a:
            self._row = a["data-log-actor-id"] or ""
            self.log_rows[self._row] = ""
        if tag == "div" and "data-run-id" in a:
            self._run = a["data-run-id"] or ""
            self.charts[self._run] = {}
        if tag == "div" and "data-series" in a and self._run is not None:
            self._series = a["data-series"] or ""
            self.charts[self._run][self._series] = (int(a.get("data-points") or 0), False)
        if tag == "polyline" and self._run is not None and self._series is not None:
            n, _ = self.charts[self._run][self._series]
            self.charts[self._run][self._series] = (n, bool(a.get("points")))
        if tag == "h3" and self._run is not None:
            self._in_title = True
            self.run_titles[self._run] = ""
        if a.get("id") == "follow":
            self.follow_shown = "show" in (a.get("class") or "").split()
        if a.get("id") == "follow-text":
            self._in_follow = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        if tag == "section":
            self._run = self._series = None
        if tag == "pre":
            self._in_follow = False
        if tag == "h3":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title and self._run is not None:
            self.run_titles[self._run] += data
        if self._row is not None:
            self.log_rows[self._row] += data
        if self._in_follow:
            self.follow_text += data


def render_live(binary: str, tmp_path: Path, url: str) -> _LiveReader:
    reader = _LiveReader()
    reader.feed(run_chromium(binary, tmp_path, url, "--dump-dom").stdout)
    return reader


def test_live_api_serves_tails_output_and_runs() -> None:
    live = sample_live()
    with MonitorServer(sample_status, live=live) as s:
        code, _, body = get(s.url + "api/logs")
        actors = {a["actor_id"]: a for a in json.loads(body)["actors"]}
        assert code == 200 and actors["a1"]["lines"] == ["hello", INJECTION]
        assert actors["a2-<i>x</i>"]["ended"] is True
        code, _, body = get(s.url + "api/logs/a1?since=6")
        assert code == 200 and json.loads(body)["text"] == f"{INJECTION}\n"
        code, _, body = get(s.url + "api/logs/nobody")
        assert code == 404 and "nobody" in json.loads(body)["error"]
        code, _, body = get(s.url + "api/runs")
        (run,) = json.loads(body)["runs"]
        assert len(run["points"]) == 40 and run["points"][-1]["episode_return"] == 100.0
        assert run["points"][-1]["score"] is None  # not reported: no chart, not a zero
    with MonitorServer(sample_status) as s:  # without a live store (the old page still works)
        assert get(s.url + "api/logs")[0] == 404


def test_browser_lists_output_escaped_and_charts_the_runs(chromium: str, tmp_path: Path) -> None:
    with MonitorServer(sample_status, live=sample_live()) as s:
        page = render_live(chromium, tmp_path, s.url)
        screenshot(chromium, tmp_path, s.url, "monitor-live.png")
    # a log line is text: no element of it was created, all of it is shown
    assert "img" not in page.tags and page.tags.count("script") == 1, page.tags
    assert page.live_tags <= {
        "td",
        "span",
        "pre",
        "button",
        "div",
        "h3",
        "svg",
        "polyline",
        "title",
    }, page.live_tags
    assert "learner <b>1</b>" in page.run_titles["c1"]
    assert INJECTION in page.log_rows["a1"], page.log_rows
    assert (
        "second actor" in page.log_rows["a2-<i>x</i>"] and "ended" in page.log_rows["a2-<i>x</i>"]
    )
    charts = page.charts["c1"]
    assert charts["steps_per_s"] == (40, True) and charts["episode_return"] == (40, True)
    assert charts["score"] == (0, False)  # "not reported"


def test_browser_follows_one_actor(chromium: str, tmp_path: Path) -> None:
    with MonitorServer(sample_status, live=sample_live()) as s:
        page = render_live(chromium, tmp_path, s.url + "#follow=a1")
    assert page.follow_shown
    assert page.follow_text == f"hello\n{INJECTION}\n"
    assert "img" not in page.tags


def test_browser_shows_a_real_clusters_actor_output_and_run(chromium: str, tmp_path: Path) -> None:
    from test_actor_logs import Talker, handle_id, in_process_cluster, wait_for

    import harness

    with in_process_cluster(cpus=2) as c, harness.connect(c.address) as client:
        talker = Talker()
        talker.say("from a real actor <b>")
        actor_id = handle_id(talker)
        for step in (100, 200, 300):
            client.report_metrics({"step": step, "steps_per_s": 50.0 + step, "score": step / 10})
            wait_for(
                lambda step=step: any(
                    p["step"] == step for r in c.master.live.runs() for p in r["points"]
                ),
                10,
                f"step {step} on the master",
            )
        wait_for(lambda: c.master.live.output(actor_id), 10, "the actor's output")
        url = str(c.master.monitor_url)
        page = render_live(chromium, tmp_path, url)
        followed = render_live(chromium, tmp_path, url + "#follow=" + actor_id)
        screenshot(chromium, tmp_path, url, "monitor-live-cluster.png")
    assert "from a real actor <b> 0" in page.log_rows[actor_id]
    (run_id,) = page.charts
    assert page.charts[run_id]["steps_per_s"] == (3, True)
    assert page.charts[run_id]["score"] == (3, True)
    assert "from a real actor <b> 0" in followed.follow_text
