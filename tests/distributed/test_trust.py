"""The network trust boundary, attacked for real (issue 48, items 1 and 2).

Every socket that carries a pickle is CURVE-authenticated, loopback included, and the client
connects to an actor endpoint only on the address its worker joined from. Each attack sends a
pickle whose ``__reduce__`` would create a marker file; the proof is that the marker is never
created (and a control shows the same payload does create it where it is let in).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from test_actor_logs import in_process_cluster, wait_for  # same directory: on sys.path

import harness
from harness.errors import HarnessError
from harness.remote import handle_of
from harness_zmq import wire
from harness_zmq.actor import ActorLauncher
from harness_zmq.clusters import key_dir
from harness_zmq.master import Master
from harness_zmq.security import Guard, Keys, ephemeral_keys, load_keys
from harness_zmq.worker import Worker

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]


class Marker:
    """Unpickling this creates the file ``path`` (what an attacker's code would do)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


class Echo:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


RemoteEcho = harness.remote(cpus=0.1)(Echo)


def poisoned(kind: str, marker: Path) -> list[list[bytes]]:
    """The messages of one kind an attacker sends: the pickle as a payload frame and inline."""
    bomb = pickle.dumps(Marker(marker), protocol=5)
    head = {"v": wire.PROTOCOL, "k": kind, "id": 1, "m": "get", "name": "value"}
    return [
        [msgpack.packb(head), bomb],
        [msgpack.packb({**head, "p": bomb})],
        [msgpack.packb({**head, "v": wire.PROTOCOL - 1}), bomb],  # an "old" peer
    ]


def attack(targets: list[tuple[str, Keys | None]], marker: Path) -> int:
    """Send a poisoned message of every kind to each ``(endpoint, keys)``: plain when keys
    is None, else CURVE with keys that are not the cluster's. Returns how many answers came
    back, from all of them together."""
    ctx = zmq.Context()
    socks = []
    try:
        for endpoint, keys in targets:
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            socks.append(sock)
            if keys is not None:
                Guard(ctx, keys).client(sock)
            # bounded: once a server drops the handshake the DEALER has no peer left and a
            # send would block for ever (what it could not send reached nobody either)
            sock.sndtimeo = 500
            sock.connect(endpoint)
            with contextlib.suppress(zmq.Again):
                for kind in wire.Kind:
                    for frames in poisoned(kind.value, marker):
                        sock.send_multipart(frames)
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        answers = 0
        deadline = time.monotonic() + 1.0
        while (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                sock.recv_multipart()
                answers += 1
        return answers
    finally:
        for sock in socks:
            sock.close()
        ctx.term()


def stranger_keys(server_public: bytes) -> Keys:
    """Keys of a local user who read the cluster's PUBLIC server key (server.key is not
    secret) and made a client key pair of its own."""
    mine = ephemeral_keys()
    return Keys(None, server_public, b"", mine.client_public, mine.client_secret)


# ------------------------------------------------------------------------------------------
# (a) a local process without the keys


def test_a_local_peer_without_the_keys_gets_nothing_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with (
        in_process_cluster(cpus=1) as cluster,
        harness.connect(cluster.address) as client,
        harness.connect(cpus=2) as farm,
        harness.connect(cpus=2, local_ipc=True) as ipc_farm,
    ):
        cluster_actor = RemoteEcho(1, _client=client)
        farm_actor = RemoteEcho(2, _client=farm)
        ipc_actor = RemoteEcho(3, _client=ipc_farm)
        endpoints = {
            "master": cluster.address,
            "cluster actor": handle_of(cluster_actor).endpoint,
            "farm actor": handle_of(farm_actor).endpoint,
            "farm actor over ipc": handle_of(ipc_actor).endpoint,
        }
        assert endpoints["farm actor over ipc"].startswith("ipc://")
        # a peer without keys, and one with the (public) server key and a key pair of its
        # own: both are dropped in the handshake
        servers = {
            "master": load_keys(key_dir(cluster.address)).server_public,
            "cluster actor": load_keys(key_dir(cluster.address)).server_public,
            "farm actor": farm.keys.server_public,
            "farm actor over ipc": ipc_farm.keys.server_public,
        }
        targets = [(endpoints[name], None) for name in endpoints]
        targets += [(endpoints[name], stranger_keys(servers[name])) for name in endpoints]
        assert attack(targets, marker) == 0, "an endpoint answered a peer without the keys"
        time.sleep(0.5)
        assert not marker.exists(), "an unauthenticated pickle was unpickled"
        # everyone with the keys is still served
        assert (cluster_actor.get(), farm_actor.get(), ipc_actor.get()) == (1, 2, 3)
        assert cluster.master.guard.denied >= 1  # the stranger reached the ZAP handler
        # the zygote (the fork server) listens on nothing: its only channel is a socket
        # pair inherited from its launcher
        zygote = psutil.Process(cluster.worker.launcher.zygote_pid)
        assert not [c for c in zygote.net_connections(kind="all") if c.status == "LISTEN"]
    assert not marker.exists()


def test_the_same_pickle_from_a_key_holder_runs(tmp_path: Path) -> None:
    """Control: the payload is live, so the test above can fail. An actor does unpickle the
    INIT of a peer holding its launcher's keys (that peer IS trusted)."""
    marker = tmp_path / "control"
    with ActorLauncher() as launcher:
        endpoint = launcher.start("victim", cpus=0.1).wait_ready(30)
        assert attack([(endpoint, None)], marker) == 0  # without keys: nothing
        assert not marker.exists()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        Guard(ctx, launcher.keys).client(sock)
        try:
            sock.connect(endpoint)
            sock.send_multipart(poisoned("init", marker)[0])
            assert sock.poll(10_000), "the actor did not answer its key holder"
        finally:
            sock.close()
            ctx.term()
    assert marker.exists()


def test_a_worker_talks_to_no_master_without_the_keys(tmp_path: Path) -> None:
    """A plaintext process posing as the master a worker joins never even hears its hello,
    so it cannot send it a spawn (and the worker unpickles nothing from a master anyway)."""
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.linger = 0
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    try:
        worker = Worker(
            f"tcp://127.0.0.1:{port}", cpus=1, keys=ephemeral_keys(), connect_timeout=1.5
        )
        with pytest.raises(HarnessError, match="no cluster master answered"):
            worker.run()
        assert not fake.poll(100), "the worker's hello reached a master without the keys"
    finally:
        fake.close()
        ctx.term()


def test_a_cluster_without_recorded_keys_is_a_clear_error() -> None:
    with in_process_cluster(cpus=1) as cluster:
        shutil.rmtree(key_dir(cluster.address))
        with pytest.raises(HarnessError, match=r"no CURVE keys are recorded.*--keys"):
            harness.connect(cluster.address)


# ------------------------------------------------------------------------------------------
# (b) a rogue worker: it holds the keys (the cluster runs on one host) and lies about where
# its actor listens


class RogueWorker:
    """Joins as a worker with the cluster's keys and answers every ``spawn`` with
    ``endpoint``; heartbeats keep it alive."""

    def __init__(self, address: str, keys: Keys, endpoint: str) -> None:
        self.endpoint = endpoint
        self.spawns = 0
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        Guard(self.ctx, keys).client(self.sock)
        self.sock.connect(address)
        hello = {"role": "worker", "name": "rogue", "host": "127.0.0.1", "pid": os.getpid()}
        self.sock.send_multipart(wire.pack_data(wire.Kind.HELLO, {**hello, "cpus": 4}, {}))
        self.peer_id: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.peer_id is not None:
                beat = wire.pack_data(wire.Kind.HEARTBEAT, {"peer_id": self.peer_id}, {})
                self.sock.send_multipart(beat)
            if not self.sock.poll(100):
                continue
            msg = wire.unpack(self.sock.recv_multipart())
            if msg.kind is wire.Kind.WELCOME:
                self.peer_id = msg.header["peer_id"]
            elif msg.kind is wire.Kind.SPAWN:
                self.spawns += 1
                answer = {"id": msg.header["id"], "actor_id": msg.header["actor_id"]}
                answer.update(endpoint=self.endpoint, pid=4242)
                self.sock.send_multipart(wire.pack(wire.Kind.SPAWNED, answer))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        self.ctx.term()


class FakeActor:
    """A plaintext actor: answers whatever reaches it with a RESULT whose pickle would
    create the marker in the client."""

    def __init__(self, endpoint: str, marker: Path) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.bind(endpoint)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.marker = marker
        self.received = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            ident, *frames = self.sock.recv_multipart()
            self.received += 1
            rid = wire.unpack(frames).header.get("id")
            self.sock.send_multipart(
                [ident, *wire.pack(wire.Kind.RESULT, {"id": rid}, Marker(self.marker))]
            )

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        self.ctx.term()


@contextlib.contextmanager
def lone_master() -> Iterator[Master]:
    master = Master(port=0, heartbeat_s=0.5)
    thread = threading.Thread(target=master.run, daemon=True)
    thread.start()
    try:
        yield master
    finally:
        master.request_stop()
        thread.join(timeout=20)


def test_a_rogue_workers_plaintext_actor_on_loopback_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "pwned"
    fake = FakeActor("tcp://127.0.0.1:*", marker)
    with lone_master() as master:
        rogue = RogueWorker(master.address, master.keys, fake.endpoint)
        try:
            wait_for(lambda: master.status()["workers"], 10, "the rogue worker to join")
            with (
                caplog.at_level(logging.ERROR, logger="harness_zmq.handle"),
                harness.connect(master.address, start_timeout_s=20) as client,
            ):
                started = time.monotonic()
                with pytest.raises(HarnessError, match="failed the CURVE handshake"):
                    RemoteEcho(_client=client)
                assert time.monotonic() - started < 10, "refused by a timeout, not at once"
            assert rogue.spawns == 1
        finally:
            rogue.close()
            fake.close()
    assert fake.received == 0, "the client sent the fake actor a message"
    assert not marker.exists()
    assert any("CURVE handshake failed" in r.getMessage() for r in caplog.records)


NAMESPACE_SCRIPT = """
import logging, sys, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import harness
from harness.errors import HarnessError
from test_trust import FakeActor, Marker, RemoteEcho, RogueWorker, lone_master, wait_for
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
marker = Path(sys.argv[2])
fake = FakeActor("tcp://10.99.0.1:7499", marker)
with lone_master() as master:
    rogue = RogueWorker(master.address, master.keys, fake.endpoint)
    wait_for(lambda: master.status()["workers"], 10, "the rogue worker to join")
    with harness.connect(master.address, start_timeout_s=20) as client:
        try:
            RemoteEcho(_client=client)
            print("PLACED")
        except HarnessError as exc:
            print("REFUSED", exc)
    print("WORKER", rogue.peer_id)
    print("REFUSED_ENDPOINTS", master.status()["master"]["refused_endpoints"])
    rogue.close()
fake.close()
print("RECEIVED", fake.received)
"""


def test_a_rogue_worker_cannot_send_the_client_off_its_host(tmp_path: Path) -> None:
    """The attack of issue 48 item 1: a worker that joined over loopback reports an actor
    endpoint on a non-loopback address (10.99.0.1, in a network namespace this test makes),
    where a plaintext fake actor waits with a poisoned reply. The master refuses it, logging
    the worker; the client's placement fails at once; the marker is never created."""
    marker = tmp_path / "pwned"
    done = in_namespace(tmp_path, NAMESPACE_SCRIPT, str(Path(__file__).parent), str(marker))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    worker = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("WORKER"))
    assert "REFUSED" in done.stdout and "refused endpoint" in done.stdout, out
    assert "PLACED" not in done.stdout, out
    assert f"refused actor endpoint 'tcp://10.99.0.1:7499' of worker {worker}" in out, out
    assert "REFUSED_ENDPOINTS 1" in done.stdout and "RECEIVED 0" in done.stdout, out
    assert not marker.exists()


def test_the_client_checks_the_endpoint_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A master that failed to check (or an older one): the client refuses an endpoint that
    is not on the address the master says the worker joined from, and logs the worker."""
    keys = ephemeral_keys()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    guard = Guard(ctx, keys)
    guard.server(sock, "127.0.0.1")
    port = sock.bind_to_random_port("tcp://127.0.0.1")

    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not sock.poll(100):
                continue
            ident, *frames = sock.recv_multipart()
            msg = wire.unpack(frames)
            if msg.kind is wire.Kind.HELLO:
                reply = wire.pack(wire.Kind.WELCOME, {"peer_id": "c1", "heartbeat_s": 0.5})
            elif msg.kind is wire.Kind.PLACE:
                reply = wire.pack(
                    wire.Kind.PLACED,
                    {
                        "id": msg.header["id"],
                        "actor_id": "a1",
                        "endpoint": "tcp://10.99.0.1:7499",
                        "worker_id": "w-rogue",
                        "worker_addr": "127.0.0.1",
                        "pid": 4242,
                    },
                )
            else:
                continue
            sock.send_multipart([ident, *reply])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            caplog.at_level(logging.ERROR, logger="harness_zmq.masterlink"),
            harness.connect(f"tcp://127.0.0.1:{port}", keys=keys) as client,
            pytest.raises(HarnessError, match="which this client refuses"),
        ):
            RemoteEcho(_client=client)
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()
        guard.close()
        ctx.term()
    assert any("worker w-rogue" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------
# keys a cluster makes for itself, and the monitor's token


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "harness.cli", "cluster", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_cluster_start_without_keys_makes_private_keys_its_clients_find() -> None:
    started = cli("start", "--port", "0", "--cpus", "1")
    assert started.returncode == 0, started.stderr
    address = started.stdout.split("cluster started at ")[1].split()[0]
    try:
        keys = key_dir(address)
        assert str(keys) in started.stdout
        assert keys.parent.stat().st_mode & 0o777 == 0o700  # the state directory
        assert keys.stat().st_mode & 0o777 == 0o700
        for secret in keys.glob("*.key_secret"):
            assert secret.stat().st_mode & 0o777 == 0o600
        # status, a client and stop find them through the recorded state
        status = cli("status", address)
        assert status.returncode == 0 and "curve on" in status.stdout, status.stderr
        with harness.connect(address) as client:
            assert RemoteEcho(9, _client=client).get() == 9
    finally:
        stopped = cli("stop", address)
    assert stopped.returncode == 0, stopped.stderr


MONITOR_SCRIPT = """
import json, re, subprocess, sys, urllib.error, urllib.request
from pathlib import Path

def cluster(*args):
    argv = [sys.executable, "-m", "harness.cli", "cluster", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)

class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None

def get(url, headers=None):
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()

out = {}
refused = cluster("start", "--port", "0", "--cpus", "0", "--host", "10.99.0.1",
                  "--monitor-port", "0", "--monitor-host", "10.99.0.1")
out["no_keys"] = [refused.returncode, refused.stderr]
started = cluster("start", "--port", "0", "--cpus", "0",
                  "--monitor-port", "0", "--monitor-host", "10.99.0.1")
out["start"] = [started.returncode, started.stdout, started.stderr]
address = re.search(r"cluster started at (\\S+)", started.stdout).group(1)
url = re.search(r"monitor at (\\S+)", started.stdout).group(1)
token = re.search(r"monitor token \\(also in (\\S+)/monitor.token\\): (\\S+)", started.stdout)
keys, token = Path(token.group(1)), token.group(2)
out["token_file"] = [(keys / "monitor.token").read_text().strip() == token,
                     oct((keys / "monitor.token").stat().st_mode & 0o777)]
out["url"] = url
for path in ("", "api/status", "api/logs", "api/runs"):
    out["plain " + path] = get(url + path)[0]
    out["wrong " + path] = get(url + path, {"Authorization": "Bearer x" + token})[0]
    out["bearer " + path] = get(url + path, {"Authorization": "Bearer " + token})[0]
code, headers, _ = get(url + "?token=" + token)
cookie = headers.get("Set-Cookie", "")
out["visit"] = [code, headers.get("Location"), "HttpOnly" in cookie, "SameSite=Strict" in cookie]
jar = cookie.split(";")[0]
out["cookie api/status"] = get(url + "api/status", {"Cookie": jar})[0]
out["cookie /"] = get(url, {"Cookie": jar})[0]
out["bad visit"] = get(url + "?token=nope")[0]
body = get(url + "api/status", {"Authorization": "Bearer " + token})[2]
out["status_ok"] = json.loads(body)["master"]["address"] == address
out["browser"] = None
if len(sys.argv) > 1:  # headless Chromium: the first visit's cookie, then the live page
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--user-data-dir=" + sys.argv[2], "--virtual-time-budget=5000", "--dump-dom"]
    seen = {}
    for name, where in (("with", url + "?token=" + token), ("without", url)):
        dom = subprocess.run([sys.argv[1], *flags, where], capture_output=True, text=True,
                             timeout=60).stdout
        seen[name] = address in dom
    out["browser"] = seen
out["stop"] = cluster("stop", address).returncode
print(json.dumps(out))
"""


def in_namespace(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh network (and user) namespace whose non-loopback address is
    10.99.0.1 (a veth end; an address on lo where veth is missing); skip where there are no
    namespaces."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a network namespace")
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.strip()}")
    path = tmp_path / "in_namespace.py"
    path.write_text(textwrap.dedent(script))
    setup = (
        "ip link set lo up && { ip link add hv0 type veth peer name hv1 && "
        "ip addr add 10.99.0.1/24 dev hv0 && ip link set hv0 up && ip link set hv1 up "
        '|| ip addr add 10.99.0.1/32 dev lo; } && exec "$@"'
    )
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    argv = ["unshare", "-rn", "sh", "-c", setup, "sh", sys.executable, str(path), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_an_off_loopback_monitor_asks_for_its_token(tmp_path: Path) -> None:
    """The monitor bound on a real interface (10.99.0.1, in a namespace this test makes)
    through the real CLI: nothing without the token, everything with it (header or the
    cookie a first visit to /?token= sets)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    extra = (browser, str(tmp_path / "profile")) if browser else ()
    done = in_namespace(tmp_path, MONITOR_SCRIPT, *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if browser:  # the page a browser shows: the cluster's status with the token, none without
        assert out["browser"] == {"with": True, "without": False}, out["browser"]
    code, stderr = out["no_keys"]
    assert code == 2 and stderr.startswith("harness: error:") and "--keys" in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert out["start"][0] == 0 and out["url"].startswith("http://10.99.0.1:")
    assert out["token_file"] == [True, "0o600"]
    for path in ("", "api/status", "api/logs", "api/runs"):
        assert out["plain " + path] == 401 and out["wrong " + path] == 401, path
        assert out["bearer " + path] == 200, path
    assert out["visit"] == [303, "/", True, True]
    assert out["cookie api/status"] == 200 and out["cookie /"] == 200
    assert out["bad visit"] == 401 and out["status_ok"] is True and out["stop"] == 0
