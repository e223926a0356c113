"""Per-actor output: captured on the worker in a bounded ring, pushed to the master with the
heartbeats (only from the worker that runs the actor, only over authenticated connections),
and the last lines of an actor that died in its ``ActorLost`` and so in the run's log.

A real cluster on 127.0.0.1: a master and a worker in threads of this process (their actors
are real processes forked by the worker's zygote), clients through ``harness.connect``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import zmq

import harness
from harness import hookimpl
from harness.remote import ActorLost
from harness_zmq import wire
from harness_zmq.capture import RING_BYTES, LogRing
from harness_zmq.live import LOG_CHARS
from harness_zmq.master import Master
from harness_zmq.security import Guard, generate_keys, load_keys
from harness_zmq.wire import Kind
from harness_zmq.worker import Worker

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]


@harness.remote(cpus=1)
class Talker:
    """An actor that writes to its stdout and stderr every way a simulator does."""

    def say(self, text: str, times: int = 1) -> int:
        for i in range(times):
            print(f"{text} {i}")
        return os.getpid()

    def c_level(self, text: str) -> None:
        os.write(2, text.encode() + b"\n")  # what a C library writes, below Python

    def warn(self, text: str) -> None:
        warnings.warn(text, RuntimeWarning, stacklevel=1)

    def crash(self, marker: str) -> None:
        print(marker)
        os._exit(3)

    def fail_hard(self, marker: str) -> None:
        import sys

        print(marker, file=sys.stderr)
        os.kill(os.getpid(), signal.SIGSEGV)


class InProcessCluster:
    def __init__(self, master: Master, worker: Worker) -> None:
        self.master = master
        self.worker = worker

    @property
    def address(self) -> str:
        return self.master.address

    def worker_logs(self) -> Any:
        assert self.worker.launcher is not None
        return self.worker.launcher.logs


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def in_process_cluster(keys: Any = None, cpus: float = 4) -> Iterator[InProcessCluster]:
    """A master (with its monitor) and one worker, heartbeats every 0.25 s."""
    master = Master(port=0, keys=keys, heartbeat_s=0.25, monitor_port=0)
    threads = [threading.Thread(target=master.run, daemon=True)]
    threads[0].start()
    worker = Worker(master.address, cpus=cpus, keys=keys)
    threads.append(threading.Thread(target=worker.run, daemon=True))
    threads[1].start()
    try:
        wait_for(lambda: any(w["alive"] for w in master.status()["workers"]), 30, "the worker")
        yield InProcessCluster(master, worker)
    finally:
        worker.request_stop()
        threads[1].join(timeout=20)
        master.request_stop()
        threads[0].join(timeout=20)


@pytest.fixture
def cluster() -> Iterator[InProcessCluster]:
    with in_process_cluster() as c:
        yield c


# ------------------------------------------------------------------------------------------
# the ring


def test_ring_keeps_the_newest_bytes_within_its_capacity() -> None:
    ring = LogRing(1000)
    written = b"".join(b"line %06d\n" % i for i in range(10_000))
    for i in range(0, len(written), 37):
        ring.append(written[i : i + 37])
        assert len(ring.buf) <= ring.capacity == 1250
    assert ring.end == len(written)
    assert written.endswith(bytes(ring.buf))
    tail = ring.tail(100)
    assert tail.endswith(b"line 009999\n") and tail.startswith(b"line ")  # cut at a line
    start, new = ring.since(ring.end - 12, 4096)
    assert (start, new) == (ring.end - 12, b"line 009999\n")


# ------------------------------------------------------------------------------------------
# capture on the worker, the copy on the master


def test_output_is_captured_per_actor_and_bounded(cluster: InProcessCluster) -> None:
    with harness.connect(cluster.address) as client:
        quiet, chatty = Talker(), Talker()
        quiet.say("quiet <b>one</b>")
        quiet.c_level("c-level write")
        quiet.warn("a python warning")
        # 3 MB through the pipe: the actor is never blocked for good, the rings stay bounded
        chatty.say("x" * 100, 30_000)
        ids = {handle_id(quiet), handle_id(chatty)}
        logs = cluster.worker_logs()
        # (the worker's reader thread copies the pipe a moment after the actor wrote it)
        wait_for(
            lambda: logs.tail(handle_id(chatty), 200).endswith("x 29999\n"),
            10,
            "the chatty actor's last line in its ring",
        )
        sizes = logs.ring_sizes()
        assert set(sizes) >= ids
        assert sizes[handle_id(chatty)] <= LogRing(RING_BYTES).capacity  # 3 MB went through
        live = cluster.master.live

        def quiet_seen() -> Any:
            out = live.output(handle_id(quiet))
            return out if out and "a python warning" in out["text"] else None

        out = wait_for(quiet_seen, 10, "the quiet actor's output on the master")
        assert "quiet <b>one</b> 0" in out["text"] and "c-level write" in out["text"]
        assert "RuntimeWarning: a python warning" in out["text"]
        chatty_out = wait_for(
            lambda: (o := live.output(handle_id(chatty))) and "x 29999" in o["text"] and o,
            10,
            "the chatty actor's last line on the master",
        )
        assert len(chatty_out["text"]) <= LOG_CHARS + 100  # (+ a gap marker)
        assert "bytes not shown" in chatty_out["text"]  # the worker sent the newest only
        assert live.sizes()["chars"] <= 2 * (LOG_CHARS + 100)
        # following: only what came after the offset the page has
        end = chatty_out["end"]
        chatty.say("after", 2)
        more = wait_for(
            lambda: (o := live.output(handle_id(chatty), end)) and "after 1" in o["text"] and o,
            10,
            "the followed actor's new lines",
        )
        assert more["text"] == "after 0\nafter 1\n"
        assert client is not None


def handle_id(proxy: Any) -> str:
    from harness.remote import handle_of

    return str(handle_of(proxy).actor_id)


def test_a_lost_actor_reports_its_last_lines(cluster: InProcessCluster) -> None:
    with harness.connect(cluster.address):
        talker = Talker()
        talker.say("before the end")
        with pytest.raises(ActorLost) as info:
            talker.crash("MARKER-exit-3")
        message = str(info.value)
        assert "exited with code 3" in message
        assert "its last output:" in message and "  | MARKER-exit-3" in message
        assert "  | before the end 0" in message
        segv = Talker()
        with pytest.raises(ActorLost) as info:
            segv.fail_hard("MARKER-segv")
        assert "signal 11" in str(info.value) and "MARKER-segv" in str(info.value)


def test_a_lost_actor_of_the_local_farm_reports_its_last_lines() -> None:
    with harness.connect():
        talker = Talker()
        with pytest.raises(ActorLost) as info:
            talker.crash("MARKER-local")
    assert "exit code 3" in str(info.value) and "  | MARKER-local" in str(info.value)


class MarkAndKill:
    """Writes a marker into actor 0's stdout (the captured pipe, as a simulator would) and
    SIGKILLs it, once, at the third iteration."""

    def __init__(self) -> None:
        self.iterations = 0
        self.killed = False

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        self.iterations += 1
        if self.iterations != 3:
            return
        pid = run.collector.slots[0].proxy.pid()
        with open(f"/proc/{pid}/fd/1", "w") as out:
            out.write("MARKER-from-the-simulator: about to die\n")
        os.kill(pid, signal.SIGKILL)
        self.killed = True


def test_the_runs_log_shows_a_lost_actors_last_lines(
    cluster: InProcessCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    pm = make_plugin_manager()
    killer = MarkAndKill()
    pm.register(killer, name="mark-and-kill")
    registry = collect_registry(pm)
    overrides = [
        f"out='{tmp_path}'",
        "trackers=['csv']",
        "progress=false",
        "actors=2",
        "num_envs=2",
        "total_steps=4096",
        "eval_every=0",
        "checkpoint_every=0",
        f"cluster='{cluster.address}'",
    ]
    pack = find_pack_file(ROOT / "competitions" / "cartpole")
    config = resolve(layer(pack, [], overrides, environ={}), registry)
    with caplog.at_level(logging.WARNING, logger="harness.runtime.farm"):
        train(config, registry, pm)
    assert killer.killed
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost, caplog.text
    assert "killed by signal 9" in lost[0]
    assert "  | MARKER-from-the-simulator: about to die" in lost[0], lost[0]
    # the live view got the run's points
    runs = cluster.master.live.runs()
    assert runs and runs[0]["points"] and runs[0]["points"][-1]["steps_per_s"] is not None


# ------------------------------------------------------------------------------------------
# only the worker running an actor writes its output, only over authenticated connections


def _heartbeat_with_output(actor_id: str, text: str) -> list[Any]:
    return wire.pack_data(
        Kind.HEARTBEAT,
        {"peer_id": "w999-0000"},
        {"cpu_percent": 1.0, "logs": [[actor_id, 0, len(text), text]]},
    )


def _say_hello(sock: Any, role: str) -> str:
    sock.send_multipart(
        wire.pack(
            Kind.HELLO,
            {"role": role, "name": "intruder", "host": "127.0.0.1", "pid": 1, "cpus": 1},
        )
    )
    assert sock.poll(5000), "no welcome"
    msg = wire.unpack(sock.recv_multipart())
    assert msg.kind is Kind.WELCOME
    return str(msg.header["peer_id"])


def test_output_from_other_peers_is_refused(cluster: InProcessCluster) -> None:
    with harness.connect(cluster.address):
        talker = Talker()
        talker.say("genuine")
        actor_id = handle_id(talker)
        live = cluster.master.live
        wait_for(lambda: "genuine 0" in (live.output(actor_id) or {}).get("text", ""), 10, "it")
        context = zmq.Context()
        try:
            for role in (None, "client", "worker"):  # unregistered, a client, another worker
                sock = context.socket(zmq.DEALER)
                sock.linger = 0
                # peers WITH the keys (nobody else gets through the handshake): still no
                # writing into another worker's actor output
                Guard(context, cluster.master.keys).client(sock)
                sock.connect(cluster.address)
                peer_id = _say_hello(sock, role) if role else "w999-0000"
                frames = _heartbeat_with_output(actor_id, f"FORGED by {role}\n")
                header = wire.unpack(frames).header
                frames = wire.pack_data(
                    Kind.HEARTBEAT,
                    {
                        **{k: v for k, v in header.items() if k not in ("v", "k")},
                        "peer_id": peer_id,
                    },
                    wire.load_data(wire.unpack(frames).payload),
                )
                sock.send_multipart(frames)
                if role:
                    assert sock.poll(5000)  # the master answered that heartbeat: it was read
                    sock.recv_multipart()
                sock.close()
            talker.say("still genuine")
            wait_for(
                lambda: "still genuine 0" in (live.output(actor_id) or {}).get("text", ""),
                10,
                "the genuine output after the forged heartbeats",
            )
        finally:
            context.destroy(linger=0)
        text = live.output(actor_id)["text"]  # type: ignore[index]
        assert "FORGED" not in text
        assert cluster.master.foreign_output >= 1  # the other worker's was counted


def test_a_curve_cluster_takes_no_output_from_a_peer_without_its_keys(tmp_path: Path) -> None:
    keys_dir = generate_keys(tmp_path / "keys")
    with (
        in_process_cluster(keys=load_keys(keys_dir), cpus=1) as c,
        harness.connect(c.address, keys=str(keys_dir)),
    ):
        talker = Talker()
        talker.say("with keys")
        actor_id = handle_id(talker)
        live = c.master.live
        wait_for(lambda: live.output(actor_id), 10, "the actor's output")
        context = zmq.Context()
        try:
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(c.address)  # plain, no CURVE: dropped in the handshake
            sock.send_multipart(wire.pack(Kind.HELLO, {"role": "worker", "name": "x"}))
            sock.send_multipart(_heartbeat_with_output(actor_id, "FORGED\n"))
            assert not sock.poll(1500), "the master answered a peer without the keys"
        finally:
            context.destroy(linger=0)
        status = c.master.status()["master"]
        assert status["malformed"] == 0 and status["refused"] == 0
        assert "FORGED" not in live.output(actor_id)["text"]  # type: ignore[index]
