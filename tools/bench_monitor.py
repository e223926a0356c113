"""The monitor's live view under load (issue 31's measures).

1. **Page load with 256 actors' output**: a monitor whose store holds the output of
   ``--actors`` actors (16 KiB each, what the master keeps) is loaded in headless Chromium
   (``--dump-dom``, which returns once the page's first fetches have rendered); the time is
   Chromium's wall time minus its time for ``about:blank`` (its own start-up), median of
   ``--repeat`` loads. The DOM is checked to list every actor. Target: < 2 s.
2. **Master memory with chatty actors**: a real cluster (``python -m harness_zmq.master`` and
   ``python -m harness_zmq.worker`` as processes) with ``--chatty`` actors each printing
   ``--lines-per-s`` lines of 100 characters, for ``--minutes``; the master's RSS is sampled
   every 5 s. Target: flat (the store is bounded).

    python tools/bench_monitor.py --minutes 1 --chatty 4        # smoke (2-core machine)
    python tools/bench_monitor.py --minutes 10 --chatty 64      # the issue's 10 minutes

Prints one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

import harness
from harness_zmq.live import LOG_CHARS, LiveStore
from harness_zmq.monitor import MonitorServer


def chromium() -> str:
    for name in (os.environ.get("HARNESS_CHROMIUM", ""), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return str(shutil.which(name))
    raise SystemExit("chromium is not installed (tools/install_chromium.sh)")


def dump(binary: str, url: str, profile: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            binary,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=100",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return time.perf_counter() - t0, out


def page_load(actors: int, repeat: int) -> dict[str, Any]:
    live = LiveStore()
    line = "step 123456: reward -0.0312 muscle activation 0.44 warning: contact solver " * 1
    for a in range(actors):
        text = "".join(f"{line}{i}\n" for i in range(LOG_CHARS // (len(line) + 6)))
        live.add_output(f"a{a}-bench", f"w{a % 8}", 0, len(text), text)
    status = {"master": {}, "workers": [], "clients": [], "jobs": [], "queues": {}}
    binary = chromium()
    with tempfile.TemporaryDirectory() as tmp, MonitorServer(lambda: status, live=live) as s:
        t0 = time.perf_counter()
        body = s.url + "api/logs"
        import urllib.request

        with urllib.request.urlopen(body) as r:
            api_bytes = len(r.read())
        api_s = time.perf_counter() - t0
        blank, page = [], []
        rows = 0
        for i in range(repeat):
            blank.append(dump(binary, "about:blank", f"{tmp}/b{i}")[0])
            seconds, dom = dump(binary, s.url, f"{tmp}/p{i}")
            page.append(seconds)
            rows = dom.count("data-log-actor-id=")
    return {
        "actors": actors,
        "api_logs_bytes": api_bytes,
        "api_logs_s": round(api_s, 4),
        "rows_rendered": rows,
        "chromium_blank_s": round(statistics.median(blank), 3),
        "chromium_page_s": round(statistics.median(page), 3),
        "page_load_s": round(statistics.median(page) - statistics.median(blank), 3),
        "target_s": 2.0,
    }


@harness.remote(cpus=0.01)
class Chatter:
    """Prints ``rate`` lines of 100 characters a second from a thread, until released."""

    def start(self, rate: float) -> int:
        def talk() -> None:
            n = 0
            while True:
                print(f"{n:09d} " + "y" * 90, flush=False)
                n += 1
                time.sleep(1.0 / rate)

        threading.Thread(target=talk, daemon=True).start()
        return os.getpid()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def master_memory(chatty: int, rate: float, minutes: float) -> dict[str, Any]:
    port, monitor = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    py = sys.executable
    master = subprocess.Popen(
        [py, "-m", "harness_zmq.master", "--port", str(port), "--monitor-port", str(monitor)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [py, "-m", "harness_zmq.worker", address, "--cpus", str(max(1, chatty))],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: list[tuple[float, float]] = []
    try:
        time.sleep(2.0)
        proc = psutil.Process(master.pid)
        with harness.connect(address):
            actors = [Chatter() for _ in range(chatty)]
            for a in actors:
                a.start(rate)
            t0 = time.monotonic()
            while time.monotonic() - t0 < minutes * 60:
                samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
                time.sleep(5.0)
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/api/logs") as r:
                listed = len(json.loads(r.read())["actors"])
    finally:
        for p in (worker, master):
            p.terminate()
        for p in (worker, master):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    rss = [m for _, m in samples]
    warm = rss[len(rss) // 4 :] or rss
    return {
        "chatty_actors": chatty,
        "lines_per_s_each": rate,
        "minutes": minutes,
        "actors_listed": listed,
        "master_rss_mb_first": round(rss[0], 1),
        "master_rss_mb_last": round(rss[-1], 1),
        "master_rss_mb_max": round(max(rss), 1),
        "master_rss_growth_after_warmup_mb": round(warm[-1] - warm[0], 1),
        "samples": " ".join(f"{t:.0f}s:{m:.1f}" for t, m in samples),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, default=256, help="actors whose output the page lists")
    p.add_argument("--repeat", type=int, default=3, help="page loads (the median is reported)")
    p.add_argument("--chatty", type=int, default=4, help="chatty actors for the memory run")
    p.add_argument("--lines-per-s", type=float, default=200.0, help="lines per chatty actor")
    p.add_argument("--minutes", type=float, default=1.0, help="length of the memory run")
    p.add_argument("--skip-page", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    args = p.parse_args()
    result: dict[str, Any] = {}
    if not args.skip_page:
        result["page"] = page_load(args.actors, args.repeat)
    if not args.skip_memory:
        result["memory"] = master_memory(args.chatty, args.lines_per_s, args.minutes)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
