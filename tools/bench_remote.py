"""Remote-call benchmark: harness ``@remote`` vs raw pyzmq, PARL 2.2.1 and Ray, side by side.

Run from the repository root (the orchestrator itself needs only the standard library; every
implementation runs in a subprocess with its own interpreter):

    bash tools/bench_peers_env.sh                     # once: creates .venv-parl and .venv-ray
    python3 tools/bench_remote.py                     # full run (~9 min: 2 rounds)
    python3 tools/bench_remote.py --quick             # smoke run (~1.5 min)
    python3 tools/bench_remote.py --peers raw,harness --cases tiny
    python3 tools/bench_remote.py --auth       # ~1 min: harness (CURVE) against raw CURVE

Cases (one remote object class, ``Echo`` below, hosted by every implementation):

* ``tiny``: ``obj.add(1)`` round trip, blocking, one actor: latency median/p99, calls/s.
* ``array``: ``obj.echo(a)`` with a 1 MiB float32 numpy array (262,144 elements) that comes
  back: round trip median/p99 and the effective bandwidth, 2 x 1 MiB / median round trip
  (payload bytes moved out and back per second, MB = 10^6 bytes).
* ``pipelined``: ``obj.add(i)`` spread round-robin over 2 actors with up to ``--window`` (256)
  calls in flight: calls/s, median of ``--repeats`` timed rounds.

Implementations:

* ``raw-bytes``: pyzmq DEALER -> ROUTER echo server process, no serialization at all (the
  physical limit of this stack); the 1 MiB array goes as one zero-copy frame both ways
  (``copy=False``), and comes back as a read-only ``np.frombuffer`` view of the received frame.
* ``raw-bytes-ipc``: the same over a Unix-domain socket (``ipc://``) in a private directory,
  the transport of harness's local farm with ``connect(local_ipc=True)``.
* ``raw-envelope``: the same (TCP) sockets with a minimal RPC envelope, as harness's wire format has
  it: frame 0 a msgpack header ``{"v", "k", "id", "m"}``, then a pickle-5 stream whose big
  buffers travel out-of-band as their own zero-copy frames; the server really calls
  ``Echo.add``/``Echo.echo``. This is the least any msgpack+pickle RPC in Python can do.
* ``raw-bytes-curve``, ``raw-envelope-curve``: ``raw-bytes`` and ``raw-envelope`` with CURVE on
  both ends (the server a CURVE server with a fresh key pair, the client a CURVE client with
  its own), as every harness socket is since issue 48: the reference for the cost of
  authentication ("harness / raw ... with CURVE" in the targets).
* ``harness``: ``harness.remote(Echo)`` under ``with harness.connect():`` (the embedded local
  farm, loopback TCP); pipelined uses ``proxy.add.future(i)`` with a FIFO sliding window.
  ``harness-ipc``: the same with ``connect(local_ipc=True)`` (Unix-domain sockets). Each is
  compared with raw pyzmq over its own transport.
* ``parl``: ``parl.remote_class(Echo)`` on a local PARL cluster (master + worker with
  ``--cpu_num 2``, started exactly as ``xparl start`` starts them, minus the web monitor);
  pipelined uses ``@parl.remote_class(wait=False)`` futures with the same sliding window.
  PARL 2.2.1 needs the small heartbeat patch that tools/bench_peers_env.sh applies
  on Python 3.11 (without it every PARL actor is killed 20-30 s after it starts); the patch is
  outside the call path.
* ``ray``: ``ray.remote(Echo)`` after ``ray.init(num_cpus=2, include_dashboard=False)``;
  blocking calls are ``ray.get(a.add.remote(1))``; pipelined submits batches of ``--window``
  calls and ``ray.get``-s each batch (Ray's documented idiom).
* ``harness-ray``: ``harness.remote(Echo)`` under ``with harness.connect(transport="ray"):``
  after the same ``ray.init`` (the transport uses the Ray already initialised); blocking calls
  are ``proxy.add(1)``; pipelined submits the same batches as ``.future()`` calls and takes
  each batch's ``.result()``-s (the same call pattern as raw Ray's batch and ``ray.get``).
  Compared with ``ray``, the same Ray 2.60 in another interpreter: see interleaving below.

Each (case, implementation) pair runs in a fresh subprocess: raw and harness in the harness
venv (``.venv-bench`` if it has pyzmq, else ``.venv``), PARL in ``.venv-parl``, Ray in
``.venv-ray``, harness-ray in ``.venv`` (harness with its ray extra). A missing venv or a
failing peer is reported as "not run (reason)" in the table.

Interleaving: this VM's speed drifts by 20-40% within minutes, so pairs whose ratio is a target
take turns in one run instead of running one after the other: raw pyzmq and harness (tiny and
array cases), and raw Ray and harness-ray (tiny, array and pipelined; each with its own Ray in
its own network namespace, both clusters up all along). Every worker starts and warms up, then
they time ``--blocks`` blocks in alternating order (``--block-calls`` blocking calls, or one
pipelined round of ``--pipelined-block`` calls, per block); the others wait blocked on a pipe.

``--array-copies K`` makes the array case cycle through K distinct arrays of the same content:
harness-ray puts an argument it has seen before in Ray's object store only once (it keeps the
last 4), so with the default of 1 it moves the array to the actor once, raw Ray on every call;
K > 4 makes every call put its array.

Network: PARL and Ray bind every interface and advertise the host's outward IP address, so by
default (``--netns auto``, when ``unshare -n`` works, i.e. as root) every subprocess runs in a
private network namespace that has only a loopback interface (PARL/Ray then advertise 127.0.0.2,
a loopback address). Nothing can leave the machine, and raw/harness run in the same conditions.
Without a namespace raw and harness still run (they use 127.0.0.1 only); PARL and Ray are then
"not run" unless ``--netns off`` is given explicitly. Each subprocess runs in its own session;
when it ends, every process left in that session or that namespace is killed by PID.

Timing: ``time.perf_counter_ns`` around each blocking call, after a warm-up; the client and the
servers share the machine's cores (2 on the development machine), so pipelined runs with 2
actors plus the client oversubscribe them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class Echo:
    """The remote object every implementation hosts.

    Kept above everything that needs a third-party import: PARL's job imports this file up to
    the end of this class (it re-imports the module rather than unpickling the class)."""

    def add(self, x: Any) -> Any:
        return x + 1

    def echo(self, a: Any) -> Any:
        return a


REPO = Path(__file__).resolve().parent.parent
IMPLS = (
    "raw-bytes",
    "raw-bytes-ipc",
    "raw-envelope",
    "raw-bytes-curve",
    "raw-envelope-curve",
    "harness",
    "harness-ipc",
    "parl",
    "ray",
    "harness-ray",
)
RAY_PAIR = ("ray", "harness-ray")
"""Raw Ray and harness on Ray: interleaved in all three cases, each in its own netns."""
CASES = ("tiny", "array", "pipelined")
ARRAY_ELEMENTS = 262_144  # float32: 1 MiB
NETNS_SETUP = "ip link set lo up && ip route add default dev lo src 127.0.0.2"
PARL_PORT = 8010


# ==========================================================================================
# measurement helpers (run inside the case subprocesses)


_SERVE_BLOCKS = False  # set in a case worker started with --serve-blocks (see interleaved)


def _blocking_stats(call: Any, calls: int, warmup: int) -> dict[str, Any]:
    import numpy as np

    for _ in range(warmup):
        call()
    if _SERVE_BLOCKS:
        return _serve_blocks(call)
    lat = np.empty(calls, dtype=np.int64)
    clock = time.perf_counter_ns
    start = clock()
    for i in range(calls):
        t0 = clock()
        call()
        lat[i] = clock() - t0
    elapsed = (clock() - start) / 1e9
    return {
        "calls": calls,
        "median_us": float(np.median(lat)) / 1e3,
        "p99_us": float(np.percentile(lat, 99)) / 1e3,
        "mean_us": float(lat.mean()) / 1e3,
        "calls_per_s": calls / elapsed,
        "elapsed_s": elapsed,
        "lat_ns": lat.tolist(),  # pooled across rounds by the orchestrator
    }


def _serve_blocks(call: Any) -> dict[str, Any]:
    """The worker's half of an interleaved run: says READY, then times ``run N`` blocks of
    blocking calls as the orchestrator asks (each answered by one BLOCK line of latencies),
    until ``quit``; returns the stats of every block together."""
    clock = time.perf_counter_ns
    lat: list[int] = []
    elapsed = 0
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] != "run":
            break
        block = []
        start = clock()
        for _ in range(int(words[1])):
            t0 = clock()
            call()
            block.append(clock() - t0)
        elapsed += clock() - start
        lat += block
        print("BLOCK " + json.dumps(block), flush=True)
    lat.sort()
    return {
        "calls": len(lat),
        "median_us": _percentile(lat, 50) / 1e3,
        "p99_us": _percentile(lat, 99) / 1e3,
        "mean_us": sum(lat) / max(1, len(lat)) / 1e3,
        "calls_per_s": len(lat) / max(elapsed / 1e9, 1e-9),
        "elapsed_s": elapsed / 1e9,
    }


def _window_rate(submit: Any, wait: Any, total: int, window: int) -> float:
    """calls/s of ``total`` calls with at most ``window`` in flight, completed in FIFO order."""
    from collections import deque

    pending: deque[Any] = deque()
    start = time.perf_counter()
    for i in range(total):
        if len(pending) >= window:
            wait(pending.popleft())
        pending.append(submit(i))
    while pending:
        wait(pending.popleft())
    return total / (time.perf_counter() - start)


def _pipelined_stats(run_round: Any, total: int, repeats: int) -> dict[str, Any]:
    import statistics

    run_round(max(total // 5, 256))  # warm-up
    if _SERVE_BLOCKS:
        return _serve_rounds(run_round)
    rates = [run_round(total) for _ in range(repeats)]
    return {
        "calls": total,
        "repeats": repeats,
        "calls_per_s": statistics.median(rates),
        "rates": rates,
    }


def _serve_rounds(run_round: Any) -> dict[str, Any]:
    """The pipelined counterpart of :func:`_serve_blocks`: each ``run N`` is one timed round
    of N pipelined calls, answered by a BLOCK line with its calls/s."""
    import statistics

    rates: list[float] = []
    calls = 0
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] != "run":
            break
        rates.append(run_round(int(words[1])))
        calls += int(words[1])
        print("BLOCK " + json.dumps(rates[-1]), flush=True)
    return {
        "calls": calls,
        "repeats": len(rates),
        "calls_per_s": statistics.median(rates) if rates else 0.0,
        "rates": rates,
    }


def _array() -> Any:
    import numpy as np

    return np.random.default_rng(0).random(ARRAY_ELEMENTS, dtype=np.float32)


def _arrays(copies: int) -> tuple[Any, Any]:
    """(the array, a function returning it or one of ``copies`` distinct arrays of the same
    content, in turn): with copies > 1 no two consecutive calls send the same object."""
    import itertools

    arrays = [_array() for _ in range(max(1, copies))]
    return arrays[0], itertools.cycle(arrays).__next__


def _check_array(sent: Any, got: Any) -> None:
    import numpy as np

    if not (got.shape == sent.shape and got.dtype == sent.dtype and np.array_equal(got, sent)):
        raise AssertionError("the echoed array differs from the one sent")


def _common_versions() -> dict[str, str]:
    import numpy
    import zmq

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
    }


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


# ------------------------------------------------------------------------------------------
# raw pyzmq: server process and client


def _env_dumps(obj: Any) -> list[Any]:
    import pickle

    buffers: list[Any] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < 4096:
            return True
        buffers.append(raw)
        return False

    return [pickle.dumps(obj, protocol=5, buffer_callback=keep), *buffers]


def _env_loads(frames: list[Any]) -> Any:
    import pickle

    return pickle.loads(_view(frames[0]), buffers=[_view(f) for f in frames[1:]])


def _map_prefix(*items: Any) -> bytes:
    """The packed msgpack map {items[0]: items[1], ..., items[-1]: <value appended later>}."""
    import msgpack

    return bytes([0x80 | (len(items) + 1) // 2]) + b"".join(msgpack.packb(x) for x in items)


def _view(frame: Any) -> Any:
    buffer = getattr(frame, "buffer", None)
    return buffer if buffer is not None else frame


CURVE_VARIABLE = "HARNESS_BENCH_CURVE"
"""The raw CURVE server's key pair, "PUBLIC SECRET" (z85), from its client."""


def serve_raw(mode: str, copy: bool, ipc: str = "") -> None:
    """A ROUTER echo server on 127.0.0.1 (random port) or on the Unix-domain socket ``ipc``;
    prints its endpoint on stdout; ends on EOF of stdin or when its parent dies. A CURVE server
    when its client put a key pair in ``CURVE_VARIABLE``."""
    import threading

    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    curve = os.environ.pop(CURVE_VARIABLE, "")
    if curve:
        public, secret = curve.encode().split()
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = public, secret
    if ipc:
        endpoint = f"ipc://{ipc}"
        sock.bind(endpoint)
    else:
        endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    print(endpoint, flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    obj = Echo()
    if mode == "bytes":
        while True:
            sock.send_multipart(sock.recv_multipart(copy=copy), copy=copy)
    else:
        packb, unpackb = msgpack.packb, msgpack.unpackb
        prefix = _map_prefix("v", 1, "k", "result", "id")
        while True:
            frames = sock.recv_multipart(copy=copy)
            head = unpackb(_view(frames[1]))
            args, kwargs = _env_loads(frames[2:])
            result = getattr(obj, head["m"])(*args, **kwargs)
            reply = prefix + packb(head["id"])
            sock.send_multipart([frames[0], reply, *_env_dumps(result)], copy=copy)


class RawActor:
    """Client side of one raw server: a DEALER socket."""

    def __init__(self, ctx: Any, mode: str, copy: bool, ipc: str = "", curve: bool = False) -> None:
        import zmq

        env = dict(os.environ)
        if curve:
            server_public, server_secret = zmq.curve_keypair()
            env[CURVE_VARIABLE] = f"{server_public.decode()} {server_secret.decode()}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-raw",
                mode,
                "--copy",
                str(int(copy)),
                "--ipc",
                ipc,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        endpoint = self.proc.stdout.readline().strip()
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve:
            self.sock.curve_serverkey = server_public
            self.sock.curve_publickey, self.sock.curve_secretkey = zmq.curve_keypair()
        self.sock.connect(endpoint)
        self.mode, self.copy, self.next_id = mode, copy, 0
        import msgpack

        self.packb, self.unpackb = msgpack.packb, msgpack.unpackb
        self.heads: dict[str, bytes] = {}

    # envelope mode -------------------------------------------------------------
    def send_call(self, method: str, *args: Any) -> int:
        self.next_id += 1
        prefix = self.heads.get(method)
        if prefix is None:  # the constant part of the header map, packed once
            prefix = self.heads[method] = _map_prefix("v", 1, "k", "call", "m", method, "id")
        head = prefix + self.packb(self.next_id)
        self.sock.send_multipart([head, *_env_dumps((args, {}))], copy=self.copy)
        return self.next_id

    def recv_result(self) -> tuple[int, Any]:
        frames = self.sock.recv_multipart(copy=self.copy)
        head = self.unpackb(_view(frames[0]))
        return head["id"], _env_loads(frames[1:])

    def call(self, method: str, *args: Any) -> Any:
        call_id = self.send_call(method, *args)
        got, value = self.recv_result()
        if got != call_id:
            raise AssertionError("out-of-order reply")
        return value

    # bytes mode ------------------------------------------------------------------
    def echo_bytes(self, data: Any) -> Any:
        self.sock.send(data, copy=self.copy)
        return self.sock.recv(copy=self.copy)

    def close(self) -> None:
        self.sock.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_raw(mode: str, case: str, cfg: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import zmq

    copy = case != "array"  # zero-copy frames only pay off for big messages
    curve = mode.endswith("-curve")
    mode = mode.removesuffix("-curve")
    ipc_dir = ""
    if mode.endswith("-ipc"):  # Unix-domain sockets in a private directory, as harness's
        mode = mode.removesuffix("-ipc")  # local farm uses them
        ipc_dir = tempfile.mkdtemp(prefix="raw-")
    ctx = zmq.Context()
    actors = [
        RawActor(ctx, mode, copy, os.path.join(ipc_dir, f"{i}.sock") if ipc_dir else "", curve)
        for i in range(2 if case == "pipelined" else 1)
    ]
    try:
        a = actors[0]
        if case == "tiny":
            if mode == "bytes":
                msg = (1).to_bytes(8, "little")
                assert a.echo_bytes(msg) == msg
                stats = _blocking_stats(lambda: a.echo_bytes(msg), cfg.calls, cfg.warmup)
            else:
                assert a.call("add", 1) == 2
                stats = _blocking_stats(lambda: a.call("add", 1), cfg.calls, cfg.warmup)
        elif case == "array":
            arr, next_array = _arrays(cfg.array_copies)
            if mode == "bytes":

                def one() -> Any:
                    frame = a.echo_bytes(memoryview(next_array()))
                    return np.frombuffer(frame.buffer, dtype=np.float32)

            else:

                def one() -> Any:
                    return a.call("echo", next_array())

            _check_array(arr, one())
            stats = _blocking_stats(one, cfg.calls, cfg.warmup)
        else:
            stats = _pipelined_stats(
                lambda n: _raw_pipelined(actors, mode, n, cfg.window), cfg.pipelined, cfg.repeats
            )
    finally:
        for actor in actors:
            actor.close()
        ctx.term()
        if ipc_dir:
            shutil.rmtree(ipc_dir, ignore_errors=True)
    return {**stats, "versions": {**_common_versions(), "msgpack": _dist_version("msgpack")}}


def _raw_pipelined(actors: list[RawActor], mode: str, total: int, window: int) -> float:
    """Many requests in flight on the DEALER sockets; each reply frees a slot for the next
    request on the same socket (the load stays balanced)."""
    import msgpack
    import zmq

    unpackb = msgpack.unpackb
    poller = zmq.Poller()
    for actor in actors:
        poller.register(actor.sock, zmq.POLLIN)
    by_sock = {actor.sock: actor for actor in actors}
    msg = (1).to_bytes(8, "little")
    outstanding: set[int] = set()

    def send(actor: RawActor, i: int) -> None:
        if mode == "bytes":
            actor.sock.send(msg)
        else:
            outstanding.add(actor.send_call("add", i) * 4 + actors.index(actor))

    start = time.perf_counter()
    sent = 0
    while sent < min(window, total):
        send(actors[sent % len(actors)], sent)
        sent += 1
    done = 0
    while done < total:
        for sock, _ in poller.poll(10_000):
            actor = by_sock[sock]
            while True:
                try:
                    if mode == "bytes":
                        sock.recv(zmq.NOBLOCK)
                    else:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                        head = unpackb(frames[0])
                        _env_loads(frames[1:])
                        outstanding.remove(head["id"] * 4 + actors.index(actor))
                except zmq.Again:
                    break
                done += 1
                if sent < total:
                    send(actor, sent)
                    sent += 1
    return total / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------------
# harness


def run_harness(case: str, cfg: argparse.Namespace, local_ipc: bool = False) -> dict[str, Any]:
    import harness

    remote_echo = harness.remote(Echo)
    with harness.connect(local_ipc=True) if local_ipc else harness.connect():
        if case == "tiny":
            a = remote_echo()
            assert a.add(1) == 2
            stats = _blocking_stats(lambda: a.add(1), cfg.calls, cfg.warmup)
        elif case == "array":
            a = remote_echo()
            arr, next_array = _arrays(cfg.array_copies)
            _check_array(arr, a.echo(arr))
            stats = _blocking_stats(lambda: a.echo(next_array()), cfg.calls, cfg.warmup)
        else:
            actors = [remote_echo(), remote_echo()]
            assert [x.add(1) for x in actors] == [2, 2]
            methods = [x.add.future for x in actors]
            stats = _pipelined_stats(
                lambda n: _window_rate(
                    lambda i: methods[i & 1](i), lambda f: f.result(), n, cfg.window
                ),
                cfg.pipelined,
                cfg.repeats,
            )
    versions = {**_common_versions(), "harness": _dist_version("harness")}
    return {**stats, "versions": versions}


def run_harness_ray(case: str, cfg: argparse.Namespace) -> dict[str, Any]:
    """harness's ray transport on a Ray started exactly as :func:`run_ray` starts it."""
    import harness

    temp_dir = _ray_init()
    import ray

    remote_echo = harness.remote(Echo)
    try:
        with harness.connect(transport="ray"):  # the Ray initialised above, as it is
            if case == "tiny":
                a = remote_echo()
                assert a.add(1) == 2
                stats = _blocking_stats(lambda: a.add(1), cfg.calls, cfg.warmup)
            elif case == "array":
                a = remote_echo()
                arr, next_array = _arrays(cfg.array_copies)
                _check_array(arr, a.echo(arr))
                stats = _blocking_stats(lambda: a.echo(next_array()), cfg.calls, cfg.warmup)
            else:
                actors = [remote_echo(), remote_echo()]
                assert [x.add(1) for x in actors] == [2, 2]
                methods = [x.add.future for x in actors]
                window = cfg.window

                def one_round(total: int) -> float:
                    """Raw Ray's pattern: a batch of ``window`` calls, then every result."""
                    start = time.perf_counter()
                    for first in range(0, total, window):
                        n = min(window, total - first)
                        batch = [methods[i & 1](i) for i in range(first, first + n)]
                        for future in batch:
                            future.result()
                    return total / (time.perf_counter() - start)

                stats = _pipelined_stats(one_round, cfg.pipelined, cfg.repeats)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    versions = {**_common_versions(), "harness": _dist_version("harness"), "ray": ray.__version__}
    return {**stats, "versions": versions}


# ------------------------------------------------------------------------------------------
# PARL


def run_parl(case: str, cfg: argparse.Namespace) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.find_spec("parl")
    if spec is None or spec.origin is None:
        raise RuntimeError("parl is not installed in this interpreter")
    start_py = str(Path(spec.origin).parent / "remote" / "start.py")
    port = cfg.parl_port or _free_port()
    log = open("parl_cluster.log", "w")  # noqa: SIM115 - lives as long as the cluster
    # what `xparl start --port P --cpu_num 2` runs, minus its web monitor; these processes stay
    # in this process's session, which the orchestrator sweeps when the case ends
    master = subprocess.Popen(
        [
            sys.executable,
            start_py,
            "--name",
            "master",
            "--port",
            str(port),
            "--monitor_port",
            str(port + 1),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    time.sleep(1.0)
    worker = subprocess.Popen(
        [
            sys.executable,
            start_py,
            "--name",
            "worker",
            "--address",
            f"localhost:{port}",
            "--cpu_num",
            "2",
            "--log_server_port",
            str(cfg.parl_port + 2 if cfg.parl_port else _free_port()),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        import parl

        parl.connect(f"localhost:{port}")
        if case in ("tiny", "array"):
            a = parl.remote_class(Echo)()
            if case == "tiny":
                assert a.add(1) == 2
                stats = _blocking_stats(lambda: a.add(1), cfg.calls, cfg.warmup)
            else:
                arr, next_array = _arrays(cfg.array_copies)
                _check_array(arr, a.echo(arr))
                stats = _blocking_stats(lambda: a.echo(next_array()), cfg.calls, cfg.warmup)
        else:
            remote_nowait = parl.remote_class(wait=False)(Echo)
            actors = [remote_nowait(), remote_nowait()]
            assert [x.add(1).get() for x in actors] == [2, 2]
            stats = _pipelined_stats(
                lambda n: _window_rate(
                    lambda i: actors[i & 1].add(i), lambda f: f.get(), n, cfg.window
                ),
                cfg.pipelined,
                cfg.repeats,
            )
    finally:
        for proc in (worker, master):
            proc.kill()
    versions = {
        **_common_versions(),
        "parl": _dist_version("parl"),
        "cloudpickle": _dist_version("cloudpickle"),
    }
    return {**stats, "versions": versions}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------
# Ray


def _ray_init() -> str:
    """``ray.init`` as both Ray cases start it; returns Ray's temp dir (removed after)."""
    import ray

    # Ray's unix socket paths live under its temp dir and may not exceed 107 bytes
    temp_dir = str(Path.cwd() / "r")
    if len(temp_dir) > 40:
        temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
    )
    return temp_dir


def run_ray(case: str, cfg: argparse.Namespace) -> dict[str, Any]:
    import ray

    temp_dir = _ray_init()
    try:
        remote_echo = ray.remote(Echo)
        if case == "tiny":
            a = remote_echo.remote()
            assert ray.get(a.add.remote(1)) == 2
            stats = _blocking_stats(lambda: ray.get(a.add.remote(1)), cfg.calls, cfg.warmup)
        elif case == "array":
            a = remote_echo.remote()
            arr, next_array = _arrays(cfg.array_copies)
            _check_array(arr, ray.get(a.echo.remote(arr)))
            stats = _blocking_stats(
                lambda: ray.get(a.echo.remote(next_array())), cfg.calls, cfg.warmup
            )
        else:
            actors = [remote_echo.remote(), remote_echo.remote()]
            assert ray.get([x.add.remote(1) for x in actors]) == [2, 2]
            window = cfg.window

            def one_round(total: int) -> float:
                start = time.perf_counter()
                for first in range(0, total, window):
                    n = min(window, total - first)
                    ray.get([actors[i & 1].add.remote(i) for i in range(first, first + n)])
                return total / (time.perf_counter() - start)

            stats = _pipelined_stats(one_round, cfg.pipelined, cfg.repeats)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {**stats, "versions": {**_common_versions(), "ray": ray.__version__}}


def _mb_per_s(median_us: float) -> float:
    """Bandwidth of the array case: 2 x 1 MiB moved per round trip."""
    return 2 * ARRAY_ELEMENTS * 4 / (median_us / 1e6) / 1e6


def case_main(cfg: argparse.Namespace) -> None:
    """One (implementation, case) in this process; the result goes to ``cfg.out`` as JSON."""
    global _SERVE_BLOCKS
    _SERVE_BLOCKS = bool(cfg.serve_blocks)
    with contextlib.suppress(OSError):
        Path(cfg.out + ".netns").write_text(os.readlink("/proc/self/ns/net"))
    impl, case = cfg.impl, cfg.case
    if impl.startswith("raw-"):
        result = run_raw(impl.removeprefix("raw-"), case, cfg)
    else:
        runners = {
            "harness": run_harness,
            "harness-ipc": lambda case, cfg: run_harness(case, cfg, local_ipc=True),
            "parl": run_parl,
            "ray": run_ray,
            "harness-ray": run_harness_ray,
        }
        result = runners[impl](case, cfg)
    if case == "array":
        result["mb_per_s"] = _mb_per_s(result["median_us"])
    result.update(impl=impl, case=case, ok=True, loadavg=os.getloadavg())
    Path(cfg.out).write_text(json.dumps(result))


# ==========================================================================================
# the orchestrator (standard library only)


def _venv_python(name: str) -> Path:
    return REPO / name / "bin" / "python"


def _harness_python() -> tuple[Path | None, str]:
    probe = "import zmq, msgpack, cloudpickle, numpy, harness, harness_zmq"
    tried = []
    for name in (".venv-bench", ".venv"):
        py = _venv_python(name)
        if not py.exists():
            tried.append(f"{name} missing")
            continue
        ok = subprocess.run([str(py), "-c", probe], capture_output=True, timeout=120)
        if ok.returncode == 0:
            return py, name
        tried.append(f"{name} lacks pyzmq/msgpack/harness_zmq")
    return None, "; ".join(tried)


def _imports(python: Path, modules: str) -> bool:
    """Whether ``python`` can import ``modules`` (a comma list)."""
    try:
        done = subprocess.run([str(python), "-c", f"import {modules}"], capture_output=True,
                              timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _netns_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    try:
        probe = subprocess.run(
            ["unshare", "-n", "sh", "-c", NETNS_SETUP], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def _sweep(sid: int, netns: str | None) -> list[int]:
    """Kill (SIGKILL, by PID) every live process of session ``sid``, and of network namespace
    ``netns`` when that is a private one (never this process's own)."""
    own_ns = os.readlink("/proc/self/ns/net")
    killed: list[int] = []
    for _ in range(3):
        victims = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            pid = int(entry)
            stat = _proc_stat(pid)
            if stat is None or stat[0] == "Z":
                continue
            in_ns = False
            if netns and netns != own_ns:
                with contextlib.suppress(OSError):
                    in_ns = os.readlink(f"/proc/{pid}/ns/net") == netns
            if stat[1] == sid or in_ns:
                victims.append(pid)
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            (s := _proc_stat(p)) is not None and s[0] != "Z" for p in victims
        ):
            time.sleep(0.05)
    return killed


def run_case(
    impl: str,
    case: str,
    python: Path,
    args: argparse.Namespace,
    use_netns: bool,
    tmp: Path,
    round_no: int = 0,
) -> dict[str, Any]:
    """Run one (implementation, case) in a fresh subprocess and session; return its result
    or {"ok": False, "reason": ...}."""
    work = tmp / f"{round_no}-{impl}-{case}"  # short: Ray puts unix sockets below it
    work.mkdir()
    (work / "home").mkdir()
    script = Path(__file__).resolve()
    if impl == "parl":
        # PARL ships every .py file next to the main script to its jobs and re-imports the
        # script there: run a copy that sits alone in its folder
        script = Path(shutil.copy(script, work / "bench_remote.py"))
    out = work / "result.json"
    cmd = [
        str(python), str(script), "--case-worker", "--impl", impl, "--case", case,
        "--out", str(out), "--calls", str(args.calls), "--warmup", str(args.warmup),
        "--pipelined", str(args.pipelined), "--repeats", str(args.repeats),
        "--window", str(args.window), "--parl-port", str(PARL_PORT if use_netns else 0),
        "--array-copies", str(args.array_copies),
    ]  # fmt: skip
    if use_netns:
        cmd = ["unshare", "-n", "sh", "-c", NETNS_SETUP + ' && exec "$@"', "sh", *cmd]
    env = dict(os.environ)
    env.update(
        HOME=str(work / "home"),  # PARL's ~/.parl_data, Ray's ~/.ray
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        PYTHONPATH="",
    )
    log_path = work / "log.txt"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        netns_file = Path(str(out) + ".netns")
        try:
            rc: int | None = proc.wait(timeout=args.case_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also on Ctrl-C / SIGTERM: nothing the case started may outlive it
            _sweep(proc.pid, netns_file.read_text() if netns_file.exists() else None)
            proc.wait(timeout=10)
    seconds = time.monotonic() - started
    if rc == 0 and out.exists():
        result: dict[str, Any] = json.loads(out.read_text())
        result["seconds"] = seconds
        return result
    tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
    reason = (
        f"timed out after {args.case_timeout:.0f} s"
        if rc is None
        else f"exit {rc}: " + _last_error(tail)
    )
    if args.verbose:
        print("\n".join(tail), file=sys.stderr)
    return {"impl": impl, "case": case, "ok": False, "reason": reason, "log_tail": tail}


class _Lines:
    """Lines from a pipe, with a deadline (a worker that hangs must not hang the benchmark)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def wait_for(self, prefix: str, timeout: float) -> str:
        import select

        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(prefix):
                    return text[len(prefix) :]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError(f"no {prefix.strip()} line within {timeout:.0f} s")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError(f"the worker exited before its {prefix.strip()} line")
            self.buf += chunk


def run_interleaved(
    impls: list[str],
    pythons: dict[str, Path],
    args: argparse.Namespace,
    tmp: Path,
    case: str,
    use_netns: bool = False,
) -> dict[str, dict[str, Any]]:
    """One case of ``impls`` at once: every worker sets up and warms up, then they take turns,
    ``--blocks`` blocks in alternating order, so every implementation meets the same machine
    (this VM's speed drifts by 20-40% within minutes, which separate runs turn into noise in
    the ratios). A block is ``--block-calls`` timed blocking calls (tiny, array) or one
    pipelined round of ``--pipelined-block`` calls. Workers wait blocked on a pipe while
    another measures; with ``use_netns`` each runs in its own private network namespace."""
    script = str(Path(__file__).resolve())
    procs: dict[str, subprocess.Popen[bytes]] = {}
    lines: dict[str, _Lines] = {}
    outs: dict[str, Path] = {}
    results: dict[str, dict[str, Any]] = {}
    per_block = args.pipelined_block if case == "pipelined" else args.block_calls
    try:
        for impl in impls:
            work = tmp / f"il-{case}-{impl}"
            work.mkdir()
            outs[impl] = work / "result.json"
            cmd = [
                str(pythons[impl]), script, "--case-worker", "--serve-blocks", "--impl", impl,
                "--case", case, "--out", str(outs[impl]), "--calls", "0",
                "--warmup", str(args.warmup), "--pipelined", str(per_block),
                "--window", str(args.window), "--array-copies", str(args.array_copies),
            ]  # fmt: skip
            if use_netns:
                cmd = ["unshare", "-n", "sh", "-c", NETNS_SETUP + ' && exec "$@"', "sh", *cmd]
            env = dict(
                os.environ,
                HOME=str(work),
                PYTHONUNBUFFERED="1",
                PYTHONPATH="",
                RAY_USAGE_STATS_ENABLED="0",
            )
            with open(work / "log.txt", "w") as log:
                procs[impl] = subprocess.Popen(
                    cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=log, start_new_session=True,
                )  # fmt: skip
            assert procs[impl].stdout is not None
            lines[impl] = _Lines(procs[impl].stdout.fileno())
        for impl in impls:
            try:
                lines[impl].wait_for("READY", args.case_timeout)
            except (TimeoutError, EOFError) as exc:
                results[impl] = {"impl": impl, "case": case, "ok": False, "reason": str(exc)}
        running = [i for i in impls if i not in results]
        medians: dict[str, dict[str, float]] = {i: {} for i in running}
        for block in range(args.blocks):
            for impl in running if block % 2 == 0 else running[::-1]:
                stdin = procs[impl].stdin
                assert stdin is not None
                stdin.write(f"run {per_block}\n".encode())
                stdin.flush()
                answer = json.loads(lines[impl].wait_for("BLOCK ", args.case_timeout))
                if case == "pipelined":  # calls/s of the block's round
                    medians[impl][str(block)] = answer
                    continue
                median = _percentile(sorted(answer), 50) / 1e3
                # per block: what the report compares (latency, or bandwidth for arrays)
                medians[impl][str(block)] = median if case == "tiny" else _mb_per_s(median)
        for impl in running:
            stdin = procs[impl].stdin
            assert stdin is not None
            stdin.write(b"quit\n")
            stdin.close()
        for impl in running:
            procs[impl].wait(timeout=60)
            if procs[impl].returncode == 0 and outs[impl].exists():
                result = json.loads(outs[impl].read_text())
                result.update(
                    per_round=medians[impl], blocks=args.blocks, seconds=0.0, group=",".join(impls)
                )
            else:
                log = (outs[impl].parent / "log.txt").read_text(errors="replace")
                reason = f"exit {procs[impl].returncode}: {_last_error(log.splitlines()[-15:])}"
                result = {"impl": impl, "case": case, "ok": False, "reason": reason}
            results[impl] = result
    finally:
        for impl, proc in procs.items():
            netns_file = Path(str(outs[impl]) + ".netns")
            _sweep(proc.pid, netns_file.read_text() if use_netns and netns_file.exists() else None)
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
    return results


def _last_error(lines: list[str]) -> str:
    for line in reversed(lines):
        text = line.strip()
        if text and ("Error" in text or "Exception" in text or "error" in text):
            return text[:160]
    return lines[-1].strip()[:160] if lines else "no output"


def _cpus() -> str:
    """benchlib's CPU description ("2 CPUs (AMD EPYC ...)"). benchlib imports harness, which
    the orchestrator may run without (it needs only the standard library): then the CPUs this
    process may use and the model named in /proc/cpuinfo."""
    try:
        from benchlib import cpus_and_model
    except ImportError:
        model = platform.machine()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        return f"{len(os.sched_getaffinity(0))} CPUs ({model})"
    return cpus_and_model()


def machine() -> dict[str, Any]:
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024**2:.0f} GiB"
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpus()}, {mem} RAM, Linux {platform.release()}",
        "commit": commit,
        "loadavg": os.getloadavg(),
    }


# ------------------------------------------------------------------------------------------
# report


def _percentile(sorted_values: list[int], q: float) -> float:
    """numpy's default (linear) percentile of an already sorted list."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result per (implementation, case) from its rounds: blocking-call latencies pooled
    (median and p99 over all timed calls of all rounds, calls/s = all calls / all time),
    pipelined rates: the median over every round's timed repeats."""
    import statistics

    good = [r for r in rounds if r.get("ok")]
    failed = [r for r in rounds if not r.get("ok")]
    if not good:
        return failed[0]
    merged = dict(good[0])
    merged["rounds"] = len(good)
    key = {"tiny": "median_us", "array": "mb_per_s"}.get(merged["case"], "calls_per_s")
    merged["per_round"] = {str(r.get("round", i)): r[key] for i, r in enumerate(good)}
    if "lat_ns" in merged:
        lat = sorted(x for r in good for x in r["lat_ns"])
        elapsed = sum(r["elapsed_s"] for r in good)
        merged.update(
            calls=len(lat),
            median_us=_percentile(lat, 50) / 1e3,
            p99_us=_percentile(lat, 99) / 1e3,
            mean_us=sum(lat) / len(lat) / 1e3,
            calls_per_s=len(lat) / elapsed,
            round_medians_us=[r["median_us"] for r in good],
        )
        del merged["lat_ns"]
        if "mb_per_s" in merged:
            merged["mb_per_s"] = _mb_per_s(merged["median_us"])
    else:
        merged["rates"] = [x for r in good for x in r["rates"]]
        merged["calls_per_s"] = statistics.median(merged["rates"])
    if failed:
        merged["failed_rounds"] = [r["reason"] for r in failed]
    return merged


def _num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def report(header: dict[str, Any], results: list[dict[str, Any]], impls: list[str]) -> str:
    by = {(r["impl"], r["case"]): r for r in results}
    cases = [c for c in CASES if any(r["case"] == c for r in results)]
    label = {
        "raw-bytes": "raw pyzmq, bytes echo (TCP)",
        "raw-bytes-ipc": "raw pyzmq, bytes echo (IPC)",
        "raw-envelope": "raw pyzmq, msgpack+pickle-5 envelope (TCP)",
        "raw-bytes-curve": "raw pyzmq, bytes echo (TCP, CURVE)",
        "raw-envelope-curve": "raw pyzmq, msgpack+pickle-5 envelope (TCP, CURVE)",
        "harness": "**harness `@remote`** (TCP, CURVE)",
        "harness-ipc": "harness `@remote`, `local_ipc=True` (IPC)",
        "parl": "PARL 2.2.1 `@parl.remote_class`",
        "ray": "Ray actor",
        "harness-ray": "**harness `@remote`, ray transport**",
    }
    if "array" in cases:
        label_array = dict(
            label,
            **{
                "raw-bytes": "raw pyzmq, zero-copy frame echo (TCP)",
                "raw-bytes-ipc": "raw pyzmq, zero-copy frame echo (IPC)",
                "raw-bytes-curve": "raw pyzmq, zero-copy frame echo (TCP, CURVE)",
            },
        )
    # one entry per package; a package whose version differs between interpreters is listed
    # per implementation
    seen: dict[str, dict[str, str]] = {}
    for r in results:
        for k, v in r.get("versions", {}).items():
            seen.setdefault(k, {}).setdefault(r["impl"].split("-")[0], v)
    versions: dict[str, str] = {}
    for k, per_impl in seen.items():
        if len(set(per_impl.values())) == 1:
            versions[k] = next(iter(per_impl.values()))
        else:
            versions.update({f"{k} ({impl})": v for impl, v in per_impl.items()})
    lines = [
        f"Date: {header['date']}; command: `{header['command']}`",
        "",
        f"Machine: {header['machine']}; commit {header['commit'] or '?'}; network: "
        f"{header['network']}; load average (1/5/15 min) "
        f"{', '.join(f'{x:.2f}' for x in header['loadavg'])} at start, "
        f"{', '.join(f'{x:.2f}' for x in header['loadavg_end'])} at end; interpreters: "
        f"{header.get('venvs') or 'not recorded'}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".",
        "",
        f"Calls: {header['rounds']} round(s), each implementation and case in a fresh "
        f"subprocess per round (order reversed every other round); per round {header['calls']} "
        f"timed blocking calls after {header['warmup']} warm-up calls, latencies pooled over "
        f"the rounds; pipelined: {header['pipelined']} calls x {header['repeats']} timed "
        f"repeats per round, window {header['window']}, 2 actors."
        + (
            f" The {header['interleaved']}; latencies pooled over the blocks, "
            f"ratios also block by block."
            if header.get("interleaved")
            else ""
        )
        + (
            f" The {header['interleaved_ray']}; pipelined: the median of the blocks' rates."
            if header.get("interleaved_ray")
            else ""
        ),
        "",
    ]

    def row_missing(impl: str, case: str, width: int, names: dict[str, str]) -> str:
        r = by.get((impl, case))
        reason = r["reason"] if r else "not selected"
        return f"| {names[impl]} | not run ({reason}) |" + " |" * (width - 1)

    def ref(impl: str, case: str, key: str) -> float | None:
        r = by.get((impl, case))
        return r[key] if r and r.get("ok") else None

    if "tiny" in cases:
        lines += [
            "**1. Tiny-argument round trip** `obj.add(1)`, one actor, blocking",
            "",
            "| implementation | median RTT (µs) | p99 (µs) | calls/s | median / raw bytes "
            "| median / raw envelope |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        rb, re_ = ref("raw-bytes", "tiny", "median_us"), ref("raw-envelope", "tiny", "median_us")
        for impl in impls:
            r = by.get((impl, "tiny"))
            if not r or not r.get("ok"):
                lines.append(row_missing(impl, "tiny", 5, label))
                continue
            m = r["median_us"]
            lines.append(
                f"| {label[impl]} | {_num(m, 1)} | {_num(r['p99_us'], 1)} | "
                f"{_num(r['calls_per_s'])} | {_ratio(m / rb if rb else None)} | "
                f"{_ratio(m / re_ if re_ else None)} |"
            )
        lines.append("")
    if "array" in cases:
        lines += [
            "**2. 1 MiB float32 array echoed back** `obj.echo(a)`, one actor, blocking "
            "(bandwidth: 2 x 1 MiB / median RTT)",
            "",
            "| implementation | median RTT (ms) | p99 (ms) | MB/s both ways | "
            "bandwidth / raw zero-copy |",
            "|---|---:|---:|---:|---:|",
        ]
        rb = ref("raw-bytes", "array", "mb_per_s")
        for impl in impls:
            r = by.get((impl, "array"))
            if not r or not r.get("ok"):
                lines.append(row_missing(impl, "array", 4, label_array))
                continue
            lines.append(
                f"| {label_array[impl]} | {_num(r['median_us'] / 1e3, 3)} | "
                f"{_num(r['p99_us'] / 1e3, 3)} | {_num(r['mb_per_s'])} | "
                f"{_ratio(r['mb_per_s'] / rb if rb else None)} |"
            )
        lines.append("")
    if "pipelined" in cases:
        lines += [
            f"**3. Pipelined calls over 2 actors**, up to {header['window']} in flight "
            "(calls/s: median of all timed repeats; their range beside it)",
            "",
            "| implementation | how | calls/s | repeats (min-max) | / raw bytes |",
            "|---|---|---:|---:|---:|",
        ]
        how = {
            "raw-bytes": "DEALER sockets, reply frees a slot",
            "raw-bytes-ipc": "same, over IPC",
            "raw-envelope": "same, with the envelope",
            "raw-bytes-curve": "same, CURVE",
            "raw-envelope-curve": "same, with the envelope, CURVE",
            "harness": "`.future()`, FIFO sliding window",
            "harness-ipc": "same, over IPC",
            "parl": "`wait=False` futures, FIFO sliding window",
            "ray": f"batches of {header['window']} `.remote()` + `ray.get(list)`",
            "harness-ray": f"batches of {header['window']} `.future()` + `.result()` each",
        }
        rb = ref("raw-bytes", "pipelined", "calls_per_s")
        for impl in impls:
            r = by.get((impl, "pipelined"))
            if not r or not r.get("ok"):
                lines.append(row_missing(impl, "pipelined", 4, label))
                continue
            rates = r["rates"]
            lines.append(
                f"| {label[impl]} | {how[impl]} | {_num(r['calls_per_s'])} | "
                f"{_num(min(rates))}-{_num(max(rates))} | "
                f"{_ratio(r['calls_per_s'] / rb if rb else None)} |"
            )
        lines.append("")
    lines += _targets(by, cases)
    return "\n".join(lines)


def _targets(by: dict[tuple[str, str], dict[str, Any]], cases: list[str]) -> list[str]:
    def get(impl: str, case: str, key: str) -> float | None:
        r = by.get((impl, case))
        return r[key] if r and r.get("ok") else None

    rows: list[str] = []

    def add(
        what: str, value: float | None, target: str, met: bool | None, fmt: str, each: str = ""
    ) -> None:
        shown = "not run" if value is None else fmt.format(value)
        verdict = "—" if met is None else ("**yes**" if met else "**no**")
        rows.append(f"| {what} | {shown} | {each or '—'} | {target} | {verdict} |")

    def paired(a: str, b: str, case: str) -> str:
        """a/b within each round where both ran."""
        ra, rb = by.get((a, case), {}), by.get((b, case), {})
        if ("blocks" in ra) != ("blocks" in rb):  # interleaved blocks against separate rounds
            return ""
        if ra.get("group") != rb.get("group"):  # blocks of two groups, taken at other times
            return ""
        pa, pb = ra.get("per_round", {}), rb.get("per_round", {})
        both = sorted(set(pa) & set(pb), key=int)
        ratios = [pa[k] / pb[k] for k in both]
        if len(ratios) > 6:  # interleaved blocks: their median and spread
            ratios.sort()
            q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
            return (
                f"median {_percentile(ratios, 50):.2f}x, middle half {q1:.2f}-{q3:.2f}x "
                f"({len(ratios)} blocks)"
            )
        return ", ".join(f"{r:.2f}x" for r in ratios) if len(ratios) > 1 else ""

    # each harness variant against raw pyzmq over the same transport (the limit of its stack)
    pairs = (
        ("harness", "raw-bytes", "harness / raw bytes echo (TCP)"),
        ("harness-ipc", "raw-bytes-ipc", "harness / raw bytes echo, both over IPC"),
        ("harness", "raw-envelope", "harness / raw envelope (TCP)"),
        # authentication's cost: harness (CURVE on every socket since issue 48) against raw
        # pyzmq with CURVE on both ends
        ("harness", "raw-bytes-curve", "harness / raw bytes echo, both CURVE (TCP)"),
        ("harness", "raw-envelope-curve", "harness / raw envelope, both CURVE (TCP)"),
    )
    if "tiny" in cases:
        for mine, raw, what in pairs:
            h, r = get(mine, "tiny", "median_us"), get(raw, "tiny", "median_us")
            v = h / r if h and r else None
            met = None if v is None else v <= 1.2
            add(f"tiny RTT, {what}", v, "<= 1.2x", met, "{:.2f}x",
                paired(mine, raw, "tiny"))  # fmt: skip
    if "array" in cases:
        for mine, raw, what in pairs[:2] + pairs[3:4]:
            h, r = get(mine, "array", "mb_per_s"), get(raw, "array", "mb_per_s")
            v = h / r if h and r else None
            met = None if v is None else v >= 0.70
            add(f"1 MiB bandwidth, {what.replace('bytes echo', 'zero-copy')}", v, ">= 0.70x",
                met, "{:.2f}x", paired(mine, raw, "array"))  # fmt: skip
    if "pipelined" in cases:
        h = get("harness", "pipelined", "calls_per_s")
        each = by.get(("harness", "pipelined"), {}).get("per_round", {})
        shown = ", ".join(f"{each[k]:,.0f}" for k in sorted(each, key=int))
        met = None if h is None else h >= 20_000
        add("pipelined, harness calls/s", h, ">= 20,000", met, "{:,.0f}",
            shown if len(each) > 1 else "")  # fmt: skip
    # harness on Ray against raw Ray actors: the transport's own overhead
    for case, key, what, better_low in (
        ("tiny", "median_us", "tiny RTT", True),
        ("array", "mb_per_s", "1 MiB bandwidth", False),
        ("pipelined", "calls_per_s", "pipelined calls/s", False),
    ):
        if case not in cases:
            continue
        hv, rv = get("harness-ray", case, key), get("ray", case, key)
        v = None if not (hv and rv) else hv / rv
        met = None if v is None else (v <= 1.15 if better_low else v >= 0.87)
        target = "<= 1.15x" if better_low else ">= 0.87x"
        add(f"{what}, harness-ray / raw Ray", v, target, met, "{:.2f}x",
            paired("harness-ray", "ray", case))  # fmt: skip
    for peer, name in (("parl", "PARL"), ("ray", "Ray")):
        for case, key, what, better_low in (
            ("tiny", "median_us", "tiny RTT", True),
            ("array", "mb_per_s", "1 MiB bandwidth", False),
            ("pipelined", "calls_per_s", "pipelined calls/s", False),
        ):
            if case not in cases:
                continue
            hv, pv = get("harness", case, key), get(peer, case, key)
            v = None if not (hv and pv) else (pv / hv if better_low else hv / pv)
            each = paired(peer, "harness", case) if better_low else paired("harness", peer, case)
            add(f"{what}: harness speed-up over {name}", v, "—", None, "{:.2f}x", each)
    if not rows:
        return []
    return [
        "**harness against the targets and the peers** (value: from the pooled numbers above; "
        "per round: the same ratio within each round, or each interleaved block, where both "
        "ran, less hit by background load)",
        "",
        "| measure | value | per round | target | met |",
        "|---|---:|---:|---:|:---:|",
        *rows,
        "",
    ]


# ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="few calls: a smoke run")
    p.add_argument(
        "--auth",
        action="store_true",
        help="the cost of authentication, short (~1 min): harness (CURVE) interleaved with raw "
        "pyzmq with and without CURVE, tiny and array cases, 20 blocks of 150 calls",
    )
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {CASES}")
    p.add_argument(
        "--peers",
        default="raw,harness,parl,ray,harness-ray",
        help="comma list of raw (the three raw variants), raw-bytes, raw-bytes-ipc, "
        "raw-envelope, raw-curve (raw-bytes-curve and raw-envelope-curve), harness (both zmq "
        "transports), harness-ipc, parl, ray, harness-ray",
    )
    p.add_argument(
        "--calls", type=int, help="timed blocking calls per case (default 5000; quick 300)"
    )
    p.add_argument("--warmup", type=int, help="warm-up calls (default calls/10, >= 50)")
    p.add_argument(
        "--pipelined", type=int, help="calls per pipelined round (default 20000; quick 2000)"
    )
    p.add_argument("--repeats", type=int, help="pipelined rounds (default 3; quick 1)")
    p.add_argument("--window", type=int, default=256, help="pipelined calls in flight")
    p.add_argument(
        "--rounds",
        type=int,
        help="times the whole sweep runs, each in a fresh "
        "subprocess, order reversed every other round; results pooled (default 2; "
        "quick 1)",
    )
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--markdown", help="also write the report here")
    p.add_argument(
        "--netns",
        choices=("auto", "on", "off"),
        default="auto",
        help="run each case in a private loopback-only network namespace",
    )
    p.add_argument(
        "--case-timeout", type=float, help="seconds per case subprocess (default 300; quick 120)"
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="tiny and array cases: raw pyzmq and harness take turns in this many blocks "
        "(default 40; quick 6; 0: separate runs per round, as PARL, Ray and pipelined)",
    )
    p.add_argument("--block-calls", type=int, default=250, help="timed calls per block")
    p.add_argument(
        "--pipelined-block",
        type=int,
        default=2560,
        help="raw Ray and harness-ray: pipelined calls per interleaved block (10 batches)",
    )
    p.add_argument(
        "--array-copies",
        type=int,
        default=1,
        help="array case: cycle through this many distinct arrays of the same content "
        "(> 4: harness-ray's put cache never hits)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print failing cases' logs")
    p.add_argument(
        "--from-json", metavar="FILE", help="only print the report of a run saved with --json"
    )
    # internal: the case subprocess and the raw server
    p.add_argument("--case-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--parl-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--serve-raw", choices=("bytes", "envelope"), help=argparse.SUPPRESS)
    p.add_argument("--copy", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--ipc", default="", help=argparse.SUPPRESS)
    p.add_argument("--serve-blocks", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.auth:
        args.peers = "raw-bytes,raw-bytes-curve,raw-envelope-curve,harness"
        args.cases = "tiny,array"
        args.quick = True
        args.blocks = 20 if args.blocks is None else args.blocks
        args.block_calls = 150
    if args.calls is None:
        args.calls = 300 if args.quick else 5000
    if args.warmup is None:
        args.warmup = max(50, args.calls // 10)
    if args.pipelined is None:
        args.pipelined = 2000 if args.quick else 20000
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.blocks is None:
        args.blocks = 6 if args.quick else 40
    if args.case_timeout is None:
        args.case_timeout = 120.0 if args.quick else 300.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:  # re-render a saved run
        saved = json.loads(Path(args.from_json).read_text())
        results = saved["results"]
        impls = [i for i in IMPLS if any(r["impl"] == i for r in results)]
        print(report(saved["header"], results, impls))
        return 0
    if args.serve_raw:
        serve_raw(args.serve_raw, bool(args.copy), args.ipc)
        return 0
    if args.case_worker:
        case_main(args)
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    peers: list[str] = []
    for name in (x.strip() for x in args.peers.split(",") if x.strip()):
        peers += {
            "raw": ["raw-bytes", "raw-bytes-ipc", "raw-envelope"],
            "raw-curve": ["raw-bytes-curve", "raw-envelope-curve"],
            "harness": ["harness", "harness-ipc"],
        }.get(name, [name])
    bad += [x for x in peers if x not in IMPLS]
    if bad:
        print(f"unknown case/peer: {', '.join(bad)}", file=sys.stderr)
        return 2
    impls = [i for i in IMPLS if i in peers]

    netns_ok = args.netns != "off" and _netns_works()
    if args.netns == "on" and not netns_ok:
        print(
            "--netns on: 'unshare -n' does not work here (needs root and iproute2)", file=sys.stderr
        )
        return 2
    harness_py, harness_why = _harness_python()
    pythons: dict[str, tuple[Path | None, str]] = {
        "raw-bytes": (harness_py, harness_why),
        "raw-bytes-ipc": (harness_py, harness_why),
        "raw-envelope": (harness_py, harness_why),
        "raw-bytes-curve": (harness_py, harness_why),
        "raw-envelope-curve": (harness_py, harness_why),
        "harness": (harness_py, harness_why),
        "harness-ipc": (harness_py, harness_why),
    }
    for impl, venv in (("parl", ".venv-parl"), ("ray", ".venv-ray"), ("harness-ray", ".venv")):
        py = _venv_python(venv)
        if not py.exists():
            pythons[impl] = (None, f"{venv} missing: run tools/bench_peers_env.sh")
        elif impl == "harness-ray" and not _imports(py, "ray, harness, harness_ray.client"):
            pythons[impl] = (None, f"{venv} lacks ray or harness_ray: pip install -e '.[ray]'")
        elif not netns_ok and args.netns != "off":
            pythons[impl] = (
                None,
                "needs a private network namespace (unshare -n, root), "
                "or --netns off to let it use the host's addresses",
            )
        else:
            pythons[impl] = (py, venv)

    header = machine()
    header.update(
        command="python3 tools/bench_remote.py" + ("" if not sys.argv[1:] else
                                                     " " + shlex.join(sys.argv[1:])),
        network="each case in a private loopback-only network namespace" if netns_ok
        else "host network, 127.0.0.1",
        venvs=", ".join(dict.fromkeys(
            f"{impl.split('-')[0]}: {why}" for impl, (py, why) in pythons.items()
            if py is not None and impl in impls
        )),
        calls=args.calls, warmup=args.warmup, pipelined=args.pipelined,
        repeats=args.repeats, window=args.window, rounds=args.rounds,
    )  # fmt: skip
    print(f"bench_remote: {header['machine']}; load {header['loadavg']}; "
          f"{header['network']}", file=sys.stderr)  # fmt: skip
    # SIGTERM unwinds like Ctrl-C, so the running case is swept (see run_case)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
    interleaved: dict[tuple[str, str], dict[str, Any]] = {}
    local = [i for i in impls if i not in ("parl", *RAY_PAIR) and pythons[i][0] is not None]
    blocking = [c for c in cases if c in ("tiny", "array")]
    # (implementations, case, in private network namespaces) run as interleaved blocks
    groups: list[tuple[list[str], str, bool]] = []
    if blocking and args.blocks > 0 and len(local) > 1:
        groups += [(local, case, False) for case in blocking]
        header["interleaved"] = (
            f"{' and '.join(blocking)} case(s) of {', '.join(local)}: {args.blocks} blocks of "
            f"{args.block_calls} calls, taking turns (order reversed every other block)"
        )
    ray_pair = [i for i in RAY_PAIR if i in impls and pythons[i][0] is not None]
    if args.blocks > 0 and len(ray_pair) == 2:
        groups += [(ray_pair, case, netns_ok) for case in cases]
        header["interleaved_ray"] = (
            f"{', '.join(cases)} case(s) of {' and '.join(ray_pair)}: {args.blocks} blocks "
            f"each ({args.block_calls} blocking calls, or one pipelined round of "
            f"{args.pipelined_block} calls), taking turns, each worker with its own Ray"
        )
    with tempfile.TemporaryDirectory(prefix="br_") as tmp:
        for group, case, in_netns in groups:
            started = time.monotonic()
            group_pythons = {i: exe for i in group if (exe := pythons[i][0]) is not None}
            got = run_interleaved(group, group_pythons, args, Path(tmp), case, in_netns)
            for impl, result in got.items():
                interleaved[impl, case] = result
                shown = (f"not run: {result['reason']}" if not result.get("ok")
                         else f"{result['calls_per_s']:,.0f} calls/s" if case == "pipelined"
                         else f"median {result['median_us']:,.1f} us, p99 "
                         f"{result['p99_us']:,.1f} us")  # fmt: skip
                print(f"  interleaved {case:5s} {impl:14s} {shown}", file=sys.stderr)
            print(f"  ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        for round_no in range(args.rounds):
            # odd rounds run the implementations in reverse order, so that slow drifts of the
            # machine's background load do not always hit the same one, while raw and harness
            # stay next to each other in time (their ratios are also taken round by round)
            order = impls if round_no % 2 == 0 else impls[::-1]
            for case in cases:
                for impl in order:
                    if (impl, case) in interleaved:
                        continue
                    py, why = pythons[impl]
                    if py is None:
                        result = {"impl": impl, "case": case, "ok": False, "reason": why}
                    else:
                        result = run_case(impl, case, py, args, netns_ok, Path(tmp), round_no)
                    result["round"] = round_no
                    rounds.setdefault((impl, case), []).append(result)
                    if result.get("ok"):
                        shown = (f"{result['calls_per_s']:,.0f} calls/s" if case == "pipelined"
                                 else f"median {result['median_us']:,.1f} us, p99 "
                                 f"{result['p99_us']:,.1f} us")  # fmt: skip
                        print(f"  round {round_no + 1} {case:9s} {impl:12s} {shown} "
                              f"({result['seconds']:.0f} s)", file=sys.stderr)  # fmt: skip
                    else:
                        print(f"  round {round_no + 1} {case:9s} {impl:12s} not run: "
                              f"{result['reason']}", file=sys.stderr)  # fmt: skip
    header["loadavg_end"] = os.getloadavg()
    results = [merge_rounds(rs) for rs in rounds.values()]
    results += [dict(r, rounds="interleaved") for r in interleaved.values()]
    text = report(header, results, impls)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
