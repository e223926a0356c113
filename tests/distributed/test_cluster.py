"""`harness cluster` end to end on loopback: the real CLI in subprocesses, a master and workers
as separate processes, clients through ``harness.connect(address)``.

Every process a test starts is ended by pid (the cluster's recorded pids after checking their
create time, or the Popen it holds); every wait is bounded. State files go to a temporary
``HARNESS_STATE_DIR``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq

import harness
from harness.errors import HarnessError
from harness.remote import handle_of
from harness_zmq import wire
from harness_zmq.cli import request_status
from harness_zmq.clusters import keys_for
from harness_zmq.security import Guard, ephemeral_keys, load_keys
from harness_zmq.wire import Kind

pytestmark = pytest.mark.distributed


# ------------------------------------------------------------------------------------------
# helpers


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "cluster", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(name: str, seconds: float) -> None:
    print(f"MEASURE {name}: {seconds * 1000:.0f} ms")


class Cluster:
    def __init__(self, address: str, env: dict[str, str], stdout: str) -> None:
        self.address = address
        self.env = env
        self.stdout = stdout
        state = json.loads(Path(self.state_path).read_text())
        self.processes = state["processes"]
        self.monitor: str | None = state.get("monitor")
        self.keys: str | None = state.get("keys")

    @property
    def state_path(self) -> str:
        d = Path(self.env["HARNESS_STATE_DIR"])
        for path in d.glob("*.json"):
            if json.loads(path.read_text())["address"] == self.address:
                return str(path)
        raise AssertionError(f"no state file for {self.address} in {d}")

    def pid(self, role: str) -> int:
        return int(next(p["pid"] for p in self.processes if p["role"] == role))

    def status(self, timeout: float = 3.0) -> Any:
        from harness_zmq.security import load_keys

        keys = load_keys(self.keys) if self.keys else None
        return request_status(self.address, keys, timeout=timeout)


def start_cluster(env: dict[str, str], *extra: str) -> Cluster:
    proc = cli("start", "--port", "0", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    address = re.search(r"cluster started at (\S+)", proc.stdout)
    assert address, proc.stdout
    return Cluster(address.group(1), env, proc.stdout)


def end_recorded(state_dir: Path) -> None:
    """Kill what the state files of this test recorded (pid + create time), nothing else."""
    for path in state_dir.glob("*.json") if state_dir.is_dir() else []:
        for record in json.loads(path.read_text()).get("processes", []):
            try:
                proc = psutil.Process(record["pid"])
                if abs(proc.create_time() - record["create_time"]) < 0.01:
                    proc.kill()
                    proc.wait(timeout=10)
            except psutil.Error:
                pass


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    state = tmp_path / "state"
    environment = dict(os.environ, HARNESS_STATE_DIR=str(state))
    yield environment
    # stop what is still running: politely first, then by recorded pid
    for path in state.glob("*.json") if state.is_dir() else []:
        address = json.loads(path.read_text())["address"]
        cli("stop", address, env=environment, timeout=30)
    end_recorded(state)


@pytest.fixture
def cluster(env: dict[str, str]) -> Cluster:
    return start_cluster(env, "--cpus", "2")


ACTOR_SOURCE = """
import os
import harness

@harness.remote(cpus=1)
class Sim:
    def __init__(self, seed):
        self.seed = seed
    def step(self, action):
        return action * 2
    def pid(self):
        return os.getpid()
"""


@harness.remote(cpus=1)
class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def step(self, action: int) -> int:
        return action * 2

    def pid(self) -> int:
        return os.getpid()


def jobs_of(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status["jobs"])


# ------------------------------------------------------------------------------------------
# start / status / stop


def test_start_status_stop_via_cli(env: dict[str, str]) -> None:
    c = start_cluster(env, "--cpus", "2", "--monitor-port", "0")
    assert c.address.startswith("tcp://127.0.0.1:")
    assert c.monitor and "monitor at " + c.monitor in c.stdout
    master, worker = c.pid("master"), c.pid("worker")

    text = cli("status", env=env)  # the one recorded cluster: no address needed
    assert text.returncode == 0, text.stderr
    assert "workers 1/1 alive" in text.stdout and "CPUs used 0/2" in text.stdout
    raw = cli("status", c.address, "--json", env=env)
    status = json.loads(raw.stdout)
    assert status["master"]["address"] == c.address and status["master"]["pid"] == master
    (w,) = status["workers"]
    assert w["pid"] == worker and w["alive"] and w["cpus"] == 2 and w["cpus_used"] == 0
    assert {"cpu_percent", "memory_mb", "memory_total_mb", "gpu", "last_heartbeat_s"} <= set(w)
    assert status["queues"] == {"pending_spawns": 0}

    t0 = time.monotonic()
    c.status()
    measure("STATUS round trip (new connection)", time.monotonic() - t0)

    with urllib.request.urlopen(c.monitor + "api/status", timeout=5) as reply:
        served = json.loads(reply.read())
    assert served["master"]["address"] == c.address and len(served["workers"]) == 1

    for flag in ("keys", "start", "join", "status", "stop"):
        helped = cli(flag, "--help", env=env)
        assert helped.returncode == 0 and "usage: harness cluster " + flag in helped.stdout

    stop = cli("stop", env=env)
    assert stop.returncode == 0, stop.stderr
    assert "stopped" in stop.stdout and "killed" not in stop.stdout  # it exited by itself
    assert pid_gone(master) and pid_gone(worker)
    assert not list(Path(env["HARNESS_STATE_DIR"]).glob("*.json"))
    gone = cli("status", c.address, env=env, timeout=10)
    assert gone.returncode == 2 and "nothing is listening" in gone.stderr


def test_two_clusters_stopping_one_leaves_the_other(env: dict[str, str]) -> None:
    one = start_cluster(env, "--cpus", "1")
    two = start_cluster(env, "--cpus", "1")
    assert one.address != two.address
    ambiguous = cli("status", env=env)
    assert ambiguous.returncode == 2 and "several clusters" in ambiguous.stderr

    assert cli("stop", one.address, env=env).returncode == 0
    assert pid_gone(one.pid("master")) and pid_gone(one.pid("worker"))
    assert not pid_gone(two.pid("master")) and not pid_gone(two.pid("worker"))
    status = two.status()
    assert [w["alive"] for w in status["workers"]] == [True]
    left = cli("status", env=env)  # only one is recorded now
    assert left.returncode == 0 and two.address in left.stdout


# ------------------------------------------------------------------------------------------
# clients, actors and deaths


def test_client_creates_actors_through_the_master(cluster: Cluster) -> None:
    with harness.connect(cluster.address) as client:
        t0 = time.monotonic()
        sims = [Sim.options(cpus=0.5)(seed=i) for i in range(3)]
        measure("placing 3 actors", time.monotonic() - t0)
        assert [s.step(i) for i, s in enumerate(sims)] == [0, 2, 4]
        assert [s.seed for s in sims] == [0, 1, 2]
        assert sims[2].step.future(21).result(timeout=10) == 42
        status = cluster.status()
        assert sorted(j["state"] for j in status["jobs"]) == ["running"] * 3
        (c,) = status["clients"]
        assert c["actors"] == 3 and c["pid"] == os.getpid()
        assert {j["client_id"] for j in status["jobs"]} == {c["id"]}
        assert status["workers"][0]["cpus_used"] == 1.5
        # no room for 1 more CPU: the request waits in the master's queue until some is freed
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            late = pool.submit(lambda: Sim(seed=9))
            wait_for(
                lambda: cluster.status()["queues"]["pending_spawns"] == 1, 3, "a queued request"
            )
            harness.release(sims[0])
            assert late.result(timeout=10).step(1) == 2
        assert len(cluster.status()["jobs"]) == 3
        # still no room after the queueing time: a clear error naming the free capacity
        t0 = time.monotonic()
        with pytest.raises(HarnessError, match=r"cannot place actor request .*cpus=1.*: 0/2 cpus"):
            Sim(seed=10)
        measure("unplaceable request refused after", time.monotonic() - t0)
        del client
    wait_for(lambda: not cluster.status()["jobs"], 5, "actors ended when the client closed")
    wait_for(lambda: not cluster.status()["clients"], 5, "the client's bye")


def test_killed_actor_raises_actor_lost(cluster: Cluster) -> None:
    with harness.connect(cluster.address):
        sim = Sim(seed=1)
        pid = sim.pid()
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(harness.ActorLost):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                sim.step(1)
                time.sleep(0.01)
        measure("dead actor -> ActorLost in the client", time.monotonic() - t0)
        assert time.monotonic() - t0 < 5
        wait_for(lambda: not cluster.status()["jobs"], 3, "the job to leave the status")
        measure("dead actor -> gone from the status", time.monotonic() - t0)
        assert cluster.status()["workers"][0]["cpus_used"] == 0


def test_killed_worker_reports_its_actors_dead(cluster: Cluster) -> None:
    with harness.connect(cluster.address):
        sims = [Sim.options(cpus=0.5)(seed=i) for i in range(2)]
        pids = [s.pid() for s in sims]
        os.kill(cluster.pid("worker"), signal.SIGKILL)
        t0 = time.monotonic()
        status = wait_for(
            lambda: (s := cluster.status())["workers"][0]["alive"] is False and s,
            8,
            "the worker to be declared dead",
        )
        measure("dead worker -> declared dead", time.monotonic() - t0)
        assert status["jobs"] == [] and status["workers"][0]["cpus_used"] == 0
        text = cli("status", env=cluster.env).stdout
        assert "DEAD" in text and "workers 0/1 alive" in text
        for sim in sims:
            with pytest.raises(harness.ActorLost):
                sim.step(1)
        # the actors died with their worker (the zygote's parent-death signal)
        wait_for(lambda: all(pid_gone(p) for p in pids), 5, "the actor processes to end")


CLIENT_SCRIPT = """
import sys, time
import harness
{source}
with harness.connect(sys.argv[1]):
    sims = [Sim(seed=i) for i in range(2)]
    print(" ".join(str(s.pid()) for s in sims), flush=True)
    time.sleep(120)
"""


def test_killed_client_has_its_actors_killed(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT.format(source=textwrap.dedent(ACTOR_SOURCE)))
    proc = subprocess.Popen(
        [sys.executable, str(script), cluster.address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded: the script prints or dies (60 s test limit)
        pids = [int(x) for x in line.split()]
        assert len(pids) == 2, line
        status = cluster.status()
        assert len(status["jobs"]) == 2 and len(status["clients"]) == 1
        proc.kill()
        t0 = time.monotonic()
        wait_for(lambda: all(pid_gone(p) for p in pids), 8, "the client's actors to be killed")
        measure("dead client -> its actors killed", time.monotonic() - t0)
        status = cluster.status()
        assert status["jobs"] == [] and status["clients"] == []
        assert status["workers"][0]["cpus_used"] == 0
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_master_restart_is_survived(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    log = tmp_path / "master.log"

    def start_master() -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "harness_zmq.master", "--port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    procs = [start_master()]
    worker = None
    try:
        wait_for(lambda: b"master at" in log.read_bytes(), 10, "the master to listen")
        worker = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "cluster", "join", address, "--cpus", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: status_of(address)["workers"], 10, "the worker to join")
        with harness.connect(address):
            sim = Sim(seed=7)
            actor_pid = sim.pid()
            before = status_of(address)
            (job,) = before["jobs"]
            (client,) = before["clients"]
            worker_id = before["workers"][0]["id"]

            procs[0].kill()
            procs[0].wait(timeout=10)
            t0 = time.monotonic()
            procs.append(start_master())
            after = wait_for(
                lambda: (s := _status_or_none(address)) and s["workers"] and s["jobs"] and s,
                10,
                "the worker to come back with its actor",
            )
            measure("master restart -> worker re-registered", time.monotonic() - t0)
            (w,) = after["workers"]
            assert w["id"] == worker_id and w["alive"] and w["actors"] == 1
            assert after["jobs"][0]["actor_id"] == job["actor_id"]
            assert after["jobs"][0]["pid"] == actor_pid
            assert sim.step(5) == 10  # the client talks to its actor directly throughout
            # the client is known again (by its heartbeats) and still owns the actor
            after = wait_for(lambda: (s := status_of(address))["clients"] and s, 5, "the client")
            assert after["clients"][0]["id"] == client["id"]
            assert after["jobs"][0]["client_id"] == client["id"]
            second = Sim(seed=8)  # placing works with the new master
            assert second.step(2) == 4
        wait_for(lambda: not status_of(address)["jobs"], 5, "the release on close")
    finally:
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def status_of(address: str, timeout: float = 3.0) -> Any:
    """The status of a cluster started on this host, with the keys it recorded here."""
    return request_status(address, keys_for(None, None, address), timeout=timeout)


def _status_or_none(address: str) -> Any:
    try:
        return status_of(address, timeout=0.5)
    except HarnessError:
        return None


# ------------------------------------------------------------------------------------------
# hostile input


def _garbage(rng: random.Random) -> list[bytes]:
    """A message that the envelope itself rejects (wire.unpack raises)."""
    shape = rng.randrange(6)
    if shape == 0:  # random bytes, random frame count
        return [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 5))]
    if shape == 1:  # msgpack, but not a map
        return [msgpack.packb(rng.choice([1, "x", [1, 2], None, 3.5, b"\x00" * 10]))]
    if shape == 2:  # a map without an int v / str k
        return [
            msgpack.packb(
                rng.choice(
                    [
                        {},
                        {"v": "1", "k": "hello"},
                        {"v": 1, "k": 5},
                        {"k": "status"},
                        {"v": 1.0, "k": "place"},
                    ]
                )
            )
        ]
    if shape == 3:  # an unknown kind
        return [msgpack.packb({"v": wire.PROTOCOL, "k": rng.randbytes(8).hex()})]
    if shape == 4:  # truncated msgpack
        head = msgpack.packb({"v": wire.PROTOCOL, "k": "status", "id": 1})
        return [head[: rng.randrange(1, len(head))]]
    return [b"", rng.randbytes(50)]  # an empty header frame


def _wrong_fields(rng: random.Random) -> list[bytes]:
    """Well-formed envelopes the master must reject: wrong field types, frame counts, kinds."""
    v = wire.PROTOCOL
    options: list[list[bytes]] = [
        [msgpack.packb({"v": v, "k": "hello", "role": 5})],
        [msgpack.packb({"v": v, "k": "hello", "role": "emperor"})],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker", "cpus": "many"})],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker", "cpus": float("nan")})],
        [msgpack.packb({"v": v, "k": "hello", "role": "client", "pid": "x"})],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker", "gpus": {"a": 1}})],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker"}), msgpack.packb([1, 2])],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker"}), b"\xc1"],
        [
            msgpack.packb({"v": v, "k": "hello", "role": "worker"}),
            msgpack.packb({"actors": [{"actor_id": 5}]}),
        ],
        [msgpack.packb({"v": v, "k": "hello", "role": "worker"}), b"a", b"b"],
        [msgpack.packb({"v": v, "k": "heartbeat", "peer_id": 17})],
        [msgpack.packb({"v": v, "k": "heartbeat"})],
        [msgpack.packb({"v": v, "k": "heartbeat", "peer_id": "x"}), b"\xff\xff"],
        [msgpack.packb({"v": v, "k": "place", "id": [1], "cpus": 1})],
        [msgpack.packb({"v": v, "k": "place", "id": 1, "cpus": -1})],
        [msgpack.packb({"v": v, "k": "place", "id": 1, "cpus": True})],
        [msgpack.packb({"v": v, "k": "place", "id": 1, "memory_mb": "lots"})],
        [msgpack.packb({"v": v, "k": "place", "id": 1}), b"payload"],
        [msgpack.packb({"v": v, "k": "release", "actor_id": None})],
        [msgpack.packb({"v": v, "k": "release", "actor_id": "x" * 1000})],
        [msgpack.packb({"v": v, "k": "spawned", "actor_id": 3})],
        [msgpack.packb({"v": v, "k": "exited", "actor_id": {"a": 1}})],
        [msgpack.packb({"v": v, "k": "status", "id": {"nested": [1]}})],
        [msgpack.packb({"v": v, "k": "status", "id": 1}), b"extra"],
        [msgpack.packb({"v": v, "k": "stop"}), b"extra"],
        [msgpack.packb({"v": v, "k": "bye", "peer_id": 1.5})],
        [msgpack.packb({"v": v, "k": "result", "id": 1})],  # not a master's kind
        [msgpack.packb({"v": v, "k": "call", "id": 1, "m": "x"}), b"\x80\x05junk"],
        [msgpack.packb({"v": v, "k": "welcome", "peer_id": "w1", "heartbeat_s": 1})],
        [msgpack.packb({"v": v, "k": "actor_died", "actor_id": "a1"})],
    ]
    return rng.choice(options)


def _fire(endpoint: str, messages: list[list[bytes]], keys: Any = None) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 5000
    sock.sndhwm = 0
    Guard(context, keys).client(sock)  # with keys: a peer the cluster lets in
    try:
        sock.connect(endpoint)
        for frames in messages:
            sock.send_multipart(frames)
    finally:
        sock.close()
        context.term()


def _raw_tcp_garbage(address: str, rng: random.Random, connections: int = 20) -> None:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    for _ in range(connections):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(rng.randbytes(rng.randrange(1, 2000)))
        except OSError:
            pass


def test_malformed_frames_do_not_crash_master_or_actor(cluster: Cluster) -> None:
    rng = random.Random(1234)
    to_master = [_garbage(rng) if i % 2 else _wrong_fields(rng) for i in range(10_000)]
    with harness.connect(cluster.address):
        sim = Sim(seed=3)
        assert sim.step(1) == 2
        endpoint = handle_of(sim).endpoint  # type: ignore[attr-defined]
        t0 = time.monotonic()
        keys = load_keys(cluster.keys)  # a peer with the keys: what may it still send?
        _fire(cluster.address, to_master, keys)
        status = wait_for(
            lambda: (s := cluster.status())["master"]["malformed"] >= len(to_master) and s,
            20,
            "the master to count 10,000 malformed messages",
        )
        measure("10,000 malformed messages handled by the master", time.monotonic() - t0)
        assert status["master"]["malformed"] == len(to_master)
        assert status["master"]["refused"] == 0
        # bytes that are not even ZeroMQ (ZMTP 1.0 parses some of them into messages: counted)
        _raw_tcp_garbage(cluster.address, rng)
        status = cluster.status()
        assert status["master"]["malformed"] >= len(to_master)
        assert [w["alive"] for w in status["workers"]] == [True]
        assert len(status["jobs"]) == 1 and len(status["clients"]) == 1

        to_actor = [_garbage(rng) for _ in range(10_000)]
        _raw_tcp_garbage(endpoint, rng)
        _fire(endpoint, to_actor, keys)
        # the actor counts them; ask it on another connection (PING answers any key holder)
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        Guard(context, keys).client(sock)
        try:
            sock.connect(endpoint)

            def counted() -> bool:
                sock.send_multipart(wire.pack(Kind.PING, {"id": 1}))
                if not sock.poll(2000):
                    return False
                pong = wire.unpack(sock.recv_multipart())
                return bool(pong.header["malformed"] >= len(to_actor))

            wait_for(counted, 20, "the actor to count 10,000 malformed messages")
        finally:
            sock.close()
            context.term()
        assert sim.step(21) == 42  # both still serve their real peers
    assert not pid_gone(cluster.pid("master")) and not pid_gone(cluster.pid("worker"))


def test_version_mismatch_is_refused_naming_both_versions(cluster: Cluster) -> None:
    other = wire.PROTOCOL + 1
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    Guard(context, load_keys(cluster.keys)).client(sock)
    try:
        sock.connect(cluster.address)
        head = {"v": other, "k": "hello", "role": "client", "name": "future", "pid": 1}
        sock.send_multipart([msgpack.packb(head)])
        assert sock.poll(5000), "no answer to a hello of another version"
        reply = wire.unpack(sock.recv_multipart())
    finally:
        sock.close()
        context.term()
    assert reply.kind is Kind.REFUSED
    reason = reply.header["reason"]
    assert f"protocol {other}" in reason and f"protocol {wire.PROTOCOL}" in reason
    assert cluster.status()["master"]["refused"] == 1
    assert cluster.status()["clients"] == []

    # the real CLI of another protocol version: exit code 2, both versions named
    code = (
        f"import sys; import harness_zmq.wire as w; w.PROTOCOL = {other}; "
        f"from harness.cli import main; sys.exit(main(['cluster', 'status', {cluster.address!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cluster.env, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert f"protocol {other}" in proc.stderr and f"protocol {wire.PROTOCOL}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wrong_address_fails_fast_and_clearly(env: dict[str, str]) -> None:
    nobody = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    proc = cli("status", nobody, env=env)
    assert proc.returncode == 2 and "nothing is listening at " + nobody in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    proc = cli("join", nobody, "--cpus", "1", "--connect-timeout", "2", env=env)
    # nothing recorded for that address: no keys to join it with, said at once
    assert proc.returncode == 2 and "no CURVE keys are recorded" in proc.stderr
    assert "--keys" in proc.stderr and "Traceback" not in proc.stderr
    keys = Path(env["HARNESS_STATE_DIR"]) / "some-keys"
    assert cli("keys", str(keys), env=env).returncode == 0
    argv = ("join", nobody, "--cpus", "1", "--connect-timeout", "2", "--keys", str(keys))
    proc = cli(*argv, env=env)
    assert proc.returncode == 2 and "no cluster master answered at " + nobody in proc.stderr
    assert time.monotonic() - t0 < 15
    proc = cli("stop", nobody, env=env)
    assert proc.returncode == 2 and "nothing is listening" in proc.stderr
    proc = cli("status", "localhost:7450", env=env)
    assert proc.returncode == 2 and "tcp://HOST:PORT" in proc.stderr
    t0 = time.monotonic()
    with pytest.raises(HarnessError, match="no answer from a harness master"):
        harness.connect(nobody, connect_timeout_s=2, keys=ephemeral_keys())
    assert time.monotonic() - t0 < 5
    no_state = cli("status", env=env)
    assert no_state.returncode == 2 and "no running cluster is recorded" in no_state.stderr


def test_port_in_use_and_insecure_host_are_clear_errors(cluster: Cluster) -> None:
    port = cluster.address.rpartition(":")[2]
    proc = cli("start", "--port", port, "--cpus", "1", env=cluster.env)
    assert proc.returncode == 2 and "already in use" in proc.stderr, proc.stderr
    # the master process itself says so too (harness cluster start --foreground, or by hand)
    proc = subprocess.run(
        [sys.executable, "-m", "harness_zmq.master", "--port", port],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "already in use" in proc.stderr
    proc = cli("start", "--host", "0.0.0.0", "--port", "0", env=cluster.env)
    assert proc.returncode == 2 and "without CURVE keys" in proc.stderr
    proc = cli(
        "join", "tcp://10.213.9.9:7450", "--cpus", "1", "--host", "10.213.9.8", env=cluster.env
    )
    assert proc.returncode == 2 and "needs CURVE keys" in proc.stderr
    proc = cli("start", "--port", "0", "--keys", "/nonexistent/keys", env=cluster.env)
    assert proc.returncode == 2 and "cannot load CURVE keys" in proc.stderr
    assert [w["alive"] for w in cluster.status()["workers"]] == [True]  # untouched


def test_curve_cluster_admits_only_clients_with_the_keys(
    env: dict[str, str], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    made = cli("keys", str(keys), env=env)
    assert made.returncode == 0 and (keys / "server.key_secret").exists()
    again = cli("keys", str(keys), env=env)
    assert again.returncode == 2 and "already holds cluster keys" in again.stderr
    c = start_cluster(env, "--cpus", "1", "--keys", str(keys))
    status = c.status()
    assert status["master"]["curve"] is True and status["workers"][0]["alive"]

    with harness.connect(c.address, keys=str(keys)):
        sim = Sim(seed=2)
        assert sim.step(4) == 8

    t0 = time.monotonic()
    with pytest.raises(HarnessError, match="no answer from a harness master"):
        harness.connect(c.address, connect_timeout_s=2, keys=ephemeral_keys())  # a stranger
    assert time.monotonic() - t0 < 5
    # a plain request without keys is not answered either
    with pytest.raises(HarnessError, match="not a master that lets this client in"):
        request_status(c.address, None, timeout=1)
    t0 = time.monotonic()
    _fire(c.address, [_garbage(random.Random(5)) for _ in range(100)])
    status = c.status()
    assert status["master"]["malformed"] == 0 and status["master"]["refused"] == 0
    assert status["clients"] == []
    master_log = Path(json.loads(Path(c.state_path).read_text())["logs"][0]).read_text()
    # one worker and the one client with the keys joined; nothing else was even decoded
    assert master_log.count(" joined: ") == 2, master_log
    assert "malformed" not in master_log and "refused" not in master_log
    proc = cli("status", c.address, "--keys", str(keys), env=env)
    assert proc.returncode == 0 and "curve on" in proc.stdout


def test_tune_runs_its_trials_as_jobs_on_a_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """`harness tune --jobs 2 --cluster ADDRESS`: both trial workers are placed by the master
    on the cluster's worker, trials overlap and the study completes."""
    optuna = pytest.importorskip("optuna")
    from harness.cli import main as harness_main
    from harness.config import find_pack_file

    pack = find_pack_file(Path(__file__).resolve().parents[2] / "competitions" / "cartpole")
    config = tmp_path / "tune.toml"
    config.write_text(
        '[tune]\npruner = "none"\n[tune.space]\n'
        '"algo.learning_rate" = { type = "float", low = 1e-4, high = 3e-3, log = true }\n'
    )
    args = ["tune", str(pack), "--config", str(config), "--out", str(tmp_path / "studies")]
    args += ["--trials", "2", "--jobs", "2", "--study", "cl", "--cluster", cluster.address]
    for text in ("run.total_steps=4096", "run.eval_every=2048", "run.eval_episodes=3"):
        args += ["--set", text]
    args += ["--set", "run.checkpoint_every=0", "--set", "run.trackers=['csv']"]
    job_pids: set[int] = set()  # what the master shows as its jobs while the study runs
    running = threading.Event()
    running.set()

    def watch_jobs() -> None:
        while running.is_set():
            with contextlib.suppress(Exception):
                job_pids.update(int(j["pid"]) for j in cluster.status()["jobs"] if j.get("pid"))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch_jobs, daemon=True)
    watcher.start()
    try:
        assert harness_main(args) == 0
    finally:
        running.clear()
        watcher.join(timeout=10)
    storage = f"sqlite:///{tmp_path / 'studies' / 'cl' / 'study.db'}"
    trials = optuna.load_study(study_name="cl", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    workers = [t.user_attrs["worker"] for t in trials]
    pids = {w["pid"] for w in workers}
    assert len(pids) == 2 and pids <= job_pids, (pids, job_pids)  # the cluster's jobs ran them
    a, b = workers
    assert a["start"] < b["end"] and b["start"] < a["end"], "the two trials did not overlap"
