"""Remote objects over the zmq transport: ``harness_zmq.client`` (local farm and cluster
client) and ``harness_zmq.actor`` (the launcher, its zygote and the actor loop).

Everything runs on 127.0.0.1 with ports the OS picks; every wait is bounded; processes a test
starts are ended by pid.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
import zmq
from test_cluster import wait_for  # same directory: pytest puts it on sys.path

import harness
from harness.errors import HarnessError
from harness.remote import (
    ActorLost,
    ActorOptions,
    Completions,
    RemoteClass,
    RemoteError,
    completions,
    handle_of,
    release,
)
from harness_zmq import wire
from harness_zmq.actor import ActorLauncher
from harness_zmq.client import LOCAL_ACTOR_NICE, ZmqActor, ZmqClient, connect, shipped_sources
from harness_zmq.security import Guard, ephemeral_keys

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------
# helpers and remote classes


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


class BoomError(Exception):
    pass


class Counter:
    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.value = start
        self.step = step
        self.log: list[Any] = []

    def add(self, n: int = 1, *, times: int = 1) -> int:
        self.value += n * times * self.step
        return self.value

    def append(self, item: Any) -> int:
        self.log.append(item)
        return len(self.log)

    def echo(self, x: Any) -> Any:
        return x

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def fail(self, message: str) -> None:
        raise BoomError(message)

    def fail_builtin(self) -> None:
        {}["missing"]

    def exit(self) -> None:
        sys.exit(3)

    def unpicklable(self) -> Any:
        return threading.Lock()

    def allocate(self, megabytes: int) -> int:
        return int(np.ones(megabytes * 2**20, dtype=np.uint8).sum())

    def environment(self) -> dict[str, Any]:
        import resource

        return {
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "openblas": os.environ.get("OPENBLAS_NUM_THREADS"),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "cwd": os.getcwd(),
            "random": float(np.random.random()),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
        }

    def fork_sleeper(self) -> int:
        pid = os.fork()
        if pid == 0:  # a child that holds every descriptor the actor had
            time.sleep(30)
            os._exit(0)
        return pid

    def array_info(self, a: np.ndarray) -> tuple[str, tuple[int, ...], bool, float]:
        return str(a.dtype), a.shape, bool(a.flags.writeable), float(a.sum())


RemoteCounter = RemoteClass(Counter, ActorOptions(cpus=0.1))


@pytest.fixture(scope="module")
def client() -> Iterator[ZmqClient]:
    c = connect(cpus=64)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def counter(client: ZmqClient) -> Iterator[Any]:
    proxy = RemoteCounter(5, step=2, _client=client)
    try:
        yield proxy
    finally:
        release(proxy)


# ------------------------------------------------------------------------------------------
# calls


def test_method_call_kwargs_and_attribute(counter: Any) -> None:
    assert counter.add(3) == 11
    assert counter.add(1, times=2) == 15
    assert counter.value == 15
    assert counter.step == 2
    with pytest.raises(RemoteError) as info:
        _ = counter.no_such_attribute
    assert info.value.remote_type == "AttributeError"


def test_public_api_with_connect_and_decorator() -> None:
    @harness.remote(cpus=0.1)
    class Local:
        def __init__(self, x: int) -> None:
            self.x = x

        def twice(self) -> int:
            return 2 * self.x

    with harness.connect() as c:
        assert isinstance(c, ZmqClient)
        obj = Local(21)
        assert obj.twice() == 42
        assert obj.x == 21
        assert obj.twice.future().result(timeout=10) == 42
        pid = handle_of(obj).pid
        assert pid is not None
    assert wait_for(lambda: gone(pid), 5, "the actor to end with its connection")


def test_futures_wait_and_callbacks(counter: Any) -> None:
    futures = [counter.echo.future(i) for i in range(200)]
    done, not_done = concurrent.futures.wait(futures, timeout=10)
    assert not not_done and len(done) == 200
    assert [f.result() for f in futures] == list(range(200))
    # a callback fires without anyone calling result()
    fired = threading.Event()
    seen: list[Any] = []

    def callback(f: concurrent.futures.Future[Any]) -> None:
        seen.append(f.result())
        fired.set()

    counter.sleep.future(0.05).add_done_callback(callback)
    assert fired.wait(5) and seen == [0.05]
    assert not counter.echo.future(1).cancel()  # sent already: not cancellable
    # nobody waits at all: they still complete (the receiver thread sweeps every 0.1 s)
    for n in (1, 3, 40):
        unwatched = [counter.echo.future(i) for i in range(n)]
        wait_for(lambda u=unwatched: all(f.done() for f in u), 3, "futures nobody waits on")
    for f in concurrent.futures.as_completed([counter.echo.future(i) for i in range(20)], 10):
        assert f.exception() is None


def test_calls_run_in_the_order_sent(counter: Any) -> None:
    futures = []
    for i in range(300):
        if i % 50 == 49:
            assert counter.append(i) == i + 1  # blocking calls interleaved with futures
        else:
            futures.append(counter.append.future(i))
    assert [f.result(timeout=10) for f in futures] == [i + 1 for i in range(300) if i % 50 != 49]
    assert counter.log == list(range(300))


def test_calls_from_many_threads(counter: Any) -> None:
    def work(k: int) -> list[Any]:
        out = []
        for i in range(50):
            out.append(counter.echo((k, i)))
            out.append(counter.echo.future((k, -i)).result(timeout=10))
        return out

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    for k, out in enumerate(results):
        assert out[0::2] == [(k, i) for i in range(50)]
        assert out[1::2] == [(k, -i) for i in range(50)]


def test_mixed_calls_futures_and_callbacks_under_load(client: ZmqClient) -> None:
    """Threads mixing blocking calls, futures waited on, futures left to the receiver
    thread and callbacks, on shared actors: everything completes, in order per sender."""
    actors = [RemoteCounter(_client=client) for _ in range(3)]
    done = threading.Semaphore(0)
    callbacks = [0]
    lock = threading.Lock()

    def on_done(f: concurrent.futures.Future[Any]) -> None:
        assert f.exception() is None
        with lock:
            callbacks[0] += 1
        done.release()

    def work(k: int) -> int:
        rng = random.Random(k)
        loose: list[concurrent.futures.Future[Any]] = []
        sent = 0
        for seq in range(400):
            actor = actors[rng.randrange(3)]
            choice = rng.random()
            if choice < 0.2:
                actor.append((k, seq))
            elif choice < 0.4:
                actor.append.future((k, seq)).result(timeout=10)
            elif choice < 0.7:
                actor.append.future((k, seq)).add_done_callback(on_done)
                sent += 1
            else:
                loose.append(actor.append.future((k, seq)))
        _, late = concurrent.futures.wait(loose, timeout=20)
        assert not late
        return sent

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sent = sum(pool.map(work, range(4)))
    for _ in range(sent):
        assert done.acquire(timeout=10)
    assert callbacks[0] == sent
    entries = [e for a in actors for e in a.log]
    assert len(entries) == 4 * 400
    for a in actors:
        log = a.log
        for k in range(4):
            mine = [seq for (t, seq) in log if t == k]
            assert mine == sorted(mine)
    for a in actors:
        release(a)


def test_remote_errors_carry_type_message_traceback(counter: Any) -> None:
    with pytest.raises(RemoteError) as info:
        counter.fail("it broke")
    err = info.value
    assert not isinstance(err, ActorLost)
    assert err.remote_type.endswith("BoomError")
    assert err.remote_message == "it broke"
    assert "def fail" in err.remote_traceback or "in fail" in err.remote_traceback
    assert "BoomError" in str(err) and "Remote traceback" in str(err)
    with pytest.raises(RemoteError) as info:
        counter.fail_builtin()
    assert info.value.remote_type == "KeyError"
    future = counter.fail.future("later")
    assert isinstance(future.exception(timeout=10), RemoteError)
    with pytest.raises(RemoteError) as info:
        counter.exit()  # SystemExit in user code does not end the actor
    assert info.value.remote_type == "SystemExit"
    with pytest.raises(RemoteError) as info:
        counter.unpicklable()
    assert "cannot be sent back" in info.value.remote_message
    with pytest.raises(RemoteError):
        counter.no_such_method_really()
    assert counter.add(0) == 5  # still serving


def test_constructor_error_is_raised_and_actor_released(client: ZmqClient) -> None:
    before = len(client.actors)
    with pytest.raises(RemoteError) as info:
        RemoteCounter(1, step="x", nonsense=1, _client=client)
    assert info.value.remote_type == "TypeError"
    assert len(client.actors) == before


def test_numpy_arrays_round_trip(counter: Any) -> None:
    rng = np.random.default_rng(1)
    arrays = [
        rng.random(262144, dtype=np.float32),  # 1 MB: out of band
        np.arange(24, dtype=np.int64).reshape(2, 3, 4),
        np.zeros((0, 3), dtype=np.uint8),
        np.array(3.5),
        rng.random((300, 300))[::3, ::2],  # not contiguous
        np.array([True, False] * 5000),
    ]
    for array in arrays:
        back = counter.echo(array)
        assert back.dtype == array.dtype and back.shape == array.shape
        np.testing.assert_array_equal(back, array)
        assert back.flags.writeable
        dtype, shape, writable, total = counter.array_info(array)
        assert (dtype, shape, writable) == (str(array.dtype), array.shape, True)
        assert total == pytest.approx(float(array.sum()))
    nested = counter.echo({"obs": arrays[0], "list": [arrays[1], arrays[3]]})
    np.testing.assert_array_equal(nested["obs"], arrays[0])
    np.testing.assert_array_equal(nested["list"][0], arrays[1])


def test_future_arguments_are_snapshots(counter: Any) -> None:
    array = np.zeros(100_000, dtype=np.float64)
    future = counter.array_info.future(array)
    array[:] = 1.0  # changed right after the call was made: the actor sees the old one
    assert future.result(timeout=10)[3] == 0.0


def test_actor_lost_when_killed_with_pending_calls(client: ZmqClient) -> None:
    proxy = RemoteCounter(_client=client)
    handle = handle_of(proxy)
    assert isinstance(handle, ZmqActor) and handle.pid
    futures = [proxy.sleep.future(30) for _ in range(3)]
    blocked: list[BaseException] = []

    def blocking() -> None:
        try:
            proxy.sleep(30)
        except BaseException as exc:
            blocked.append(exc)

    thread = threading.Thread(target=blocking)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    os.kill(handle.pid, signal.SIGKILL)
    for f in futures:
        assert isinstance(f.exception(timeout=5), ActorLost)
    thread.join(timeout=5)
    assert not thread.is_alive() and isinstance(blocked[0], ActorLost)
    assert time.monotonic() - started < 2.5  # typically ~0.2 s
    assert "exit code -9" in str(blocked[0])
    with pytest.raises(ActorLost):
        proxy.echo(1)
    assert isinstance(proxy.echo.future(1).exception(timeout=1), ActorLost)
    release(proxy)


def test_death_is_seen_even_when_a_child_of_the_actor_lives_on(client: ZmqClient) -> None:
    proxy = RemoteCounter(_client=client)
    grandchild = proxy.fork_sleeper()
    try:
        pending = proxy.sleep.future(30)
        started = time.monotonic()
        os.kill(handle_of(proxy).pid, signal.SIGKILL)
        assert isinstance(pending.exception(timeout=5), ActorLost)
        assert time.monotonic() - started < 2.5  # typically ~0.2 s
        assert not gone(grandchild)
    finally:
        kill_pid(grandchild)
        release(proxy)


def test_release_ends_the_actor(client: ZmqClient) -> None:
    proxy = RemoteCounter(_client=client)
    pid = handle_of(proxy).pid
    assert pid is not None and not gone(pid)
    pending = proxy.sleep.future(10)
    release(proxy)
    release(proxy)  # idempotent
    assert isinstance(pending.exception(timeout=2), ActorLost)
    assert wait_for(lambda: gone(pid), 5, "the released actor to exit")
    with pytest.raises(ActorLost):
        proxy.echo(1)


def test_close_releases_everything_and_is_idempotent() -> None:
    c = connect(cpus=4)
    proxies = [RemoteCounter(_client=c) for _ in range(3)]
    pids = [handle_of(p).pid for p in proxies]
    zygote = c._farm.launcher.zygote_pid if c._farm else None
    c.close()
    c.close()
    for pid in [*pids, zygote]:
        assert pid is not None
        assert wait_for(lambda pid=pid: gone(pid), 5, f"process {pid} to exit")
    with pytest.raises(HarnessError):
        RemoteCounter(_client=c)


def test_scalars_keep_their_exact_types(counter: Any) -> None:
    """Plain scalar arguments and results travel as msgpack fields (protocol 3): every type
    and edge value comes back as it went, and what msgpack cannot hold falls back to pickle."""
    values = [
        0, -1, 2**63 - 1, -(2**63), 2**64 - 1,  # msgpack's int range
        2**64, -(2**63) - 1, 10**40,  # beyond it: pickled
        1.5, -0.0, float("inf"), 1e-310, True, False,
        "", "snow \u2603", b"", b"\x00\xff" * 100, None,
    ]  # fmt: skip
    for value in values:
        for back in (counter.echo(value), counter.echo.future(value).result(timeout=10)):
            assert type(back) is type(value) and back == value, (value, back)
    nan = counter.echo(float("nan"))
    assert type(nan) is float and nan != nan
    assert str(counter.echo(-0.0)) == "-0.0"
    assert counter.echo((1, 2)) == (1, 2) and type(counter.echo((1, 2))) is tuple
    assert counter.echo(x=b"kw") == b"kw"  # keyword arguments: the pickle path
    start, step = counter.value, counter.step  # GETATTR results
    assert counter.add(2**70) == start + step * 2**70
    assert counter.value == start + step * 2**70 and counter.add(-(2**70)) == start


def test_scalar_arguments_field_must_be_a_list(counter: Any) -> None:
    handle = handle_of(counter)
    before = handle.stats()["malformed"]
    for bad in (5, "x", {"k": 1}, None):
        rid = next(handle._ids)
        head = {"v": wire.PROTOCOL, "k": "call", "m": "add", "id": rid, "a": bad}
        if bad is None:  # "a": nil and no payload at all
            head.pop("a")
        with pytest.raises(RemoteError) as info:
            handle._roundtrip(rid, [msgpack.packb(head)])
        assert info.value.remote_type in {"MalformedFrame", "harness_zmq.wire.MalformedFrame"}
    assert handle.stats()["malformed"] == before + 4
    assert counter.add(1) == counter.value  # still served


def test_payloads_inline_and_in_frames_round_trip(counter: Any) -> None:
    """Payloads below, at and above the inline limit (one frame vs header + pickle frame) and
    with out-of-band arrays, through blocking calls and futures, both directions."""
    limit = wire.INLINE_MAX
    for size in (0, 10, limit - 64, limit + 64, 200_000):
        data = os.urandom(size)
        assert counter.echo(data) == data
        assert counter.echo.future(data).result(timeout=10) == data
    big = np.arange(100_000, dtype=np.float32)
    np.testing.assert_array_equal(counter.echo(big), big)


def test_completions_hand_back_futures_in_finishing_order(client: ZmqClient) -> None:
    """The zmq Completions (epoll, read in this thread) and the generic one (callbacks) give
    the same answers: finishing order across actors, adding order within one actor, tags,
    and ActorLost for the calls of an actor that was killed."""
    actors = [RemoteCounter(_client=client) for _ in range(4)]
    try:
        for done in (completions(client), Completions()):
            assert isinstance(done, Completions)
            # actor i sleeps (4 - i) * 0.15 s: they finish in reverse order
            for i, proxy in enumerate(actors):
                done.add(proxy.sleep.future((4 - i) * 0.15), ("slow", i))
            for i in (0, 1):  # two quick calls queued behind the slow ones of actors 0, 1
                done.add(actors[i].echo.future(i), ("echo", i))
            order = [done.next(timeout=10) for _ in range(6)]
            tags = [tag for _, tag in order]
            slow = [t for t in tags if t[0] == "slow"]
            assert slow == [("slow", 3), ("slow", 2), ("slow", 1), ("slow", 0)], tags
            for i in (0, 1):  # an actor's calls come back in the order they were added
                assert tags.index(("slow", i)) < tags.index(("echo", i))
            assert [f.result() for f, tag in order if tag == ("echo", 1)] == [1]
            with pytest.raises(TimeoutError):
                done.next(timeout=0.05)
            done.close()
        victim = RemoteCounter(_client=client)
        done = completions(client)
        for k in range(3):
            done.add(victim.sleep.future(30), k)
        os.kill(handle_of(victim).pid, signal.SIGKILL)  # type: ignore[attr-defined]
        started = time.monotonic()
        lost = [done.next(timeout=10) for _ in range(3)]
        assert sorted(tag for _, tag in lost) == [0, 1, 2]
        assert all(isinstance(f.exception(timeout=0), ActorLost) for f, _ in lost)
        assert time.monotonic() - started < 5
        done.close()
        release(victim)
    finally:
        for proxy in actors:
            release(proxy)


def test_completions_keep_up_with_many_actors(client: ZmqClient) -> None:
    """64 actors, 20 rounds of one call each re-added as soon as it comes back: every call
    is handed back exactly once."""
    actors = [RemoteCounter(_client=client) for _ in range(64)]
    try:
        done = completions(client)
        for i, proxy in enumerate(actors):
            done.add(proxy.add.future(1), i)
        seen = [0] * len(actors)
        for _ in range(20 * len(actors)):
            future, i = done.next(timeout=30)
            seen[i] += 1
            assert future.result() == seen[i]  # add() returns the running count
            if seen[i] < 20:
                done.add(actors[i].add.future(1), i)
        assert seen == [20] * len(actors)
        with pytest.raises(TimeoutError):
            done.next(timeout=0.05)
        done.close()
    finally:
        for proxy in actors:
            release(proxy)


def test_a_local_farm_can_lower_its_actors_priority() -> None:
    with connect(cpus=4, actor_nice=7) as niced:
        proxy = RemoteCounter(_client=niced)
        assert proxy.environment()["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)


def test_actor_options_reach_the_process(client: ZmqClient) -> None:
    two = RemoteCounter.options(cpus=2, memory_mb=4096)(_client=client)
    one = RemoteCounter(_client=client)
    try:
        env2, env1 = two.environment(), one.environment()
        assert env2["omp"] == env2["openblas"] == "2"
        assert env1["omp"] == "1"
        assert env2["cuda"] == env1["cuda"] == ""
        assert env2["rlimit_as"] == 4096 * 2**20
        assert env1["random"] != env2["random"]  # forks are reseeded
        assert env1["pid"] != env2["pid"] and env1["ppid"] == env2["ppid"]  # one zygote
        assert env1["nice"] == os.getpriority(os.PRIO_PROCESS, 0) + LOCAL_ACTOR_NICE
    finally:
        release(two)
        release(one)


def test_gpus_are_assigned_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # what this farm may hand out
    with connect(cpus=4) as c:
        a = RemoteCounter.options(gpus=1)(_client=c)
        b = RemoteCounter.options(gpus=1)(_client=c)
        assert {a.environment()["cuda"], b.environment()["cuda"]} == {"3", "5"}
        with pytest.raises(HarnessError, match="GPU"):
            RemoteCounter.options(gpus=1)(_client=c)
        release(a)
        assert RemoteCounter.options(gpus=1)(_client=c).environment()["cuda"] in {"3", "5"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with connect(cpus=4) as c, pytest.raises(HarnessError, match="0 free"):
        RemoteCounter.options(gpus=1)(_client=c)


def test_memory_limit_raises_memory_error(client: ZmqClient) -> None:
    proxy = RemoteCounter.options(memory_mb=700)(_client=client)
    try:
        with pytest.raises(RemoteError) as info:
            proxy.allocate(1500)
        if not isinstance(info.value, ActorLost):
            assert info.value.remote_type.endswith("MemoryError")  # numpy: _ArrayMemoryError
            assert proxy.allocate(10) == 10 * 2**20  # and it still serves
    finally:
        release(proxy)


def test_oversubscription_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="harness_zmq.client"), connect(cpus=1) as c:
        a = RemoteCounter.options(cpus=1)(_client=c)
        b = RemoteCounter.options(cpus=1)(_client=c)
        assert a.echo(1) == b.echo(1) == 1
    assert "oversubscribed" in caplog.text


# ------------------------------------------------------------------------------------------
# the actor's protocol, spoken directly


@pytest.fixture
def raw(counter: Any) -> Iterator[tuple[zmq.Socket[Any], Any]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    # a peer WITH the keys (every actor authenticates its callers): what it may still send
    Guard(ctx, handle_of(counter)._client.keys).client(sock)
    sock.connect(handle_of(counter).endpoint)
    try:
        yield sock, counter
    finally:
        sock.close()
        ctx.term()


def request(sock: zmq.Socket[Any], frames: list[Any], rid: Any, timeout: float = 5.0) -> Any:
    sock.send_multipart(frames)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.poll(100):
            msg = wire.unpack(sock.recv_multipart())
            if msg.header.get("id") == rid:
                return msg
    raise AssertionError("no answer from the actor")


def test_malformed_frames_are_counted_and_dropped(raw: tuple[zmq.Socket[Any], Any]) -> None:
    sock, counter = raw
    rng = random.Random(7)
    malformed = 0
    for i in range(2000):
        r = i % 10
        if r < 5:  # random bytes, 1-3 frames
            frames = [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
        elif r == 5:
            frames = [msgpack.packb(rng.choice([[1, 2], "s", 3, None, 2.5]))]
        elif r == 6:
            frames = [msgpack.packb({"v": wire.PROTOCOL, "k": rng.choice(["nope", "", "x" * 99])})]
        elif r == 7:
            frames = [msgpack.packb({"v": wire.PROTOCOL, "k": "call"}), b"no id"]
        elif r == 8:
            frames = [msgpack.packb({"k": "call", "id": 1}), rng.randbytes(2000)]
        else:
            frames = [msgpack.packb({"v": "1", "k": "ping", "id": i})]
        sock.send_multipart(frames)
        malformed += 1
    # the actor answers PING to anyone; its counters travel in the PONG header
    pong = request(sock, wire.pack(wire.Kind.PING, {"id": "after"}), "after", timeout=10)
    assert pong.kind is wire.Kind.PONG
    assert pong.header["malformed"] >= malformed
    assert counter.add(0) == 5  # the real client is still served
    stats = handle_of(counter).stats()
    assert stats["malformed"] >= malformed and stats["pid"] == handle_of(counter).pid


def test_other_client_and_bad_payloads_get_errors(raw: tuple[zmq.Socket[Any], Any]) -> None:
    sock, counter = raw
    call = wire.pack(wire.Kind.CALL, {"id": 1, "m": "add"}, ((1,), {}))
    msg = request(sock, call, 1)
    assert msg.kind is wire.Kind.ERROR and "another client" in msg.header["message"]
    init = wire.pack(wire.Kind.INIT, {"id": 2}, (Counter, (), {}, {}))
    msg = request(sock, init, 2)
    assert msg.kind is wire.Kind.ERROR and "another client" in msg.header["message"]
    assert handle_of(counter).stats()["refused"] >= 2
    assert counter.add(0) == 5


def test_version_mismatch_is_refused_naming_both(raw: tuple[zmq.Socket[Any], Any]) -> None:
    sock, counter = raw
    future_version = wire.PROTOCOL + 41
    msg = request(sock, [msgpack.packb({"v": future_version, "k": "call", "id": 9})], 9)
    assert msg.kind is wire.Kind.REFUSED
    reason = msg.header["reason"]
    assert f"version {future_version}" in reason and f"version {wire.PROTOCOL}" in reason
    assert counter.add(0) == 5


def test_an_actor_serves_only_after_init() -> None:
    with ActorLauncher() as launcher:
        proc = launcher.start("lonely", cpus=0.1)
        endpoint = proc.wait_ready(30)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        Guard(ctx, launcher.keys).client(sock)  # the launcher's own (in-memory) keys
        sock.connect(endpoint)
        try:
            msg = request(sock, wire.pack(wire.Kind.CALL, {"id": 3, "m": "x"}, ((), {})), 3)
            assert msg.kind is wire.Kind.ERROR and "INIT" in msg.header["message"]
            # an INIT whose class cannot be unpickled is an error, not a hang
            bad = [msgpack.packb({"v": wire.PROTOCOL, "k": "init", "id": 4}), b"\x80\x05junk"]
            msg = request(sock, bad, 4)
            assert msg.kind is wire.Kind.ERROR
            msg = request(sock, wire.pack(wire.Kind.CALL, {"id": 5, "m": "x"}, ((), {})), 5)
            assert "failed to initialise" in msg.header["message"]
        finally:
            sock.close()
            ctx.term()


def test_curve_actors_admit_only_key_holders(tmp_path: Path) -> None:
    from harness_zmq.security import generate_keys

    keys = generate_keys(tmp_path / "keys")
    with connect(keys=str(keys), cpus=2) as c:
        proxy = RemoteCounter(3, _client=c)
        assert proxy.add(1) == 4
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(handle_of(proxy).endpoint)  # no keys: the handshake never completes
        try:
            sock.send_multipart(wire.pack(wire.Kind.PING, {"id": 1}))
            assert sock.poll(1000) == 0
        finally:
            sock.close()
            ctx.term()
        assert proxy.add(1) == 5


# ------------------------------------------------------------------------------------------
# the launcher


def test_launcher_contract() -> None:
    launcher = ActorLauncher(host="127.0.0.1")
    try:
        started = time.monotonic()
        procs = [launcher.start(f"a{i}", cpus=0.1) for i in range(16)]
        endpoints = [p.wait_ready(30) for p in procs]
        elapsed = time.monotonic() - started
        assert all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
        assert len(set(endpoints)) == 16
        assert elapsed < 8, f"16 actors took {elapsed:.1f}s"
        first = procs[0]
        assert first.exitcode is None and first.is_alive()
        from multiprocessing.connection import wait

        assert wait([first.sentinel], timeout=0) == []
        first.kill()
        assert wait([first.sentinel], timeout=5) == [first.sentinel]
        wait_for(lambda: first.exitcode is not None, 5, "an exit code")
        assert first.exitcode == -9
        first.kill()  # idempotent
        pids = [p.pid for p in procs[1:]]
    finally:
        launcher.close()
    launcher.close()
    for pid in pids:
        assert wait_for(lambda pid=pid: gone(pid), 5, f"actor {pid} to exit")
    assert procs[1].exitcode == -9


def test_an_actor_killed_before_its_pid_is_known_is_killed_without_waiting() -> None:
    """A cluster worker's heartbeat loop takes an actor's sentinel right after ``start`` and
    may kill it before the zygote has reported its pid (a client that went away). Neither may
    wait for that report (the master declares a worker dead after 3 s of silence): with the
    zygote stopped, both return at once, and the actor the zygote forks when it resumes is
    killed, not left running. (Before: kill() waited 10 s for the pid, gave up, and the actor
    then ran.)"""
    with ActorLauncher() as launcher:
        launcher.warm()
        zygote = launcher.zygote_pid
        assert zygote is not None
        os.kill(zygote, signal.SIGSTOP)
        try:
            proc = launcher.start("orphan", cpus=0.1)
            started = time.monotonic()
            sentinel = proc.sentinel
            proc.kill()
            waited = time.monotonic() - started
        finally:
            os.kill(zygote, signal.SIGCONT)
        assert waited < 2.0, f"sentinel and kill waited {waited:.1f} s for the zygote"
        assert sentinel >= 0
        with pytest.raises(HarnessError, match=r"could not start|exited before it was ready"):
            proc.wait_ready(30)
        wait_for(lambda: proc.exitcode is not None, 10, "the actor's exit code")
        assert proc.exitcode == -signal.SIGKILL
        assert wait_for(lambda: gone(proc.pid), 5, f"actor {proc.pid} to exit")
        # the zygote serves on: the next actor starts and answers
        assert launcher.start("next", cpus=0.1).wait_ready(30).startswith("tcp://")


def test_local_farm_over_unix_sockets() -> None:
    """connect(local_ipc=True): actors listen on a Unix-domain socket in their own 0700
    directory, which goes away with them."""
    import stat

    with connect(cpus=2, local_ipc=True) as c:
        proxy = RemoteCounter(3, _client=c)
        endpoint = handle_of(proxy).endpoint
        assert endpoint.startswith("ipc://")
        path = Path(endpoint.removeprefix("ipc://"))
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.parent.stat().st_uid == os.getuid()
        assert proxy.add(1) == 4 and proxy.echo(np.arange(300_000)).sum() == 44999850000
        pid = handle_of(proxy).pid
        release(proxy)
        wait_for(lambda: gone(pid), 10, "the actor to exit")
        wait_for(lambda: not path.parent.exists(), 10, "its directory to be removed")
    with connect(cpus=2) as c:  # the default: loopback TCP
        assert handle_of(RemoteCounter(1, _client=c)).endpoint.startswith("tcp://127.0.0.1:")


def test_launcher_works_with_descriptors_above_1024() -> None:
    """A learner with hundreds of actors holds more than 1024 descriptors: waiting on them
    must not use select() (whose limit that is); this crashed closing a 256-actor farm."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit ({hard}) is too low to open 1100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    fillers: list[int] = []
    launcher = None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        fillers.append(null)
        while len(fillers) < 1100:
            fillers.append(os.dup(null))
        launcher = ActorLauncher(host="127.0.0.1")
        proc = launcher.start("high-fd", cpus=0.1)
        assert proc.wait_ready(30).startswith("tcp://127.0.0.1:")
        assert proc.sentinel > 1024
        assert proc.is_alive()
        proc.kill()
        wait_for(lambda: proc.exitcode is not None, 5, "an exit code")
        assert proc.exitcode == -9
    finally:
        if launcher is not None:
            launcher.close()
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_launcher_survives_many_deaths_it_does_not_read_about() -> None:
    """The zygote's reports queue up while nobody reads them (a Unix socket holds only a few
    datagrams): spawning must go on and every exit code must arrive later."""
    with ActorLauncher() as launcher:
        procs = [launcher.start(f"d{i}", cpus=0.1) for i in range(60)]
        for p in procs:
            p.wait_ready(30)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.5)
        started = time.monotonic()
        assert [p.exitcode for p in procs] == [-9] * 60
        assert time.monotonic() - started < 10  # ~0.1 s; generous for a loaded machine
        more = [launcher.start(f"e{i}", cpus=0.1) for i in range(5)]
        for p in more:
            assert p.wait_ready(10).startswith("tcp://")


def test_launcher_refuses_insecure_host() -> None:
    with pytest.raises(HarnessError, match="CURVE"):
        ActorLauncher(host="0.0.0.0")


LAUNCHER_SCRIPT = """
import os, signal, sys, time
import harness
from harness.remote import handle_of
from harness_zmq.actor import ActorLauncher

@harness.remote(cpus=0.1)
class A:
    def pid(self):
        return os.getpid()

launcher = ActorLauncher()
procs = [launcher.start(f"l{i}", cpus=0.1) for i in range(2)]
for p in procs:
    p.wait_ready(30)
with harness.connect() as c:
    actors = [A() for _ in range(2)]
    pids = [p.pid for p in procs] + [a.pid() for a in actors]
    print("PIDS", *pids, launcher.zygote_pid, c._farm.launcher.zygote_pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_actors_die_with_the_launching_process(tmp_path: Path) -> None:
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PIDS"))
    pids = [int(x) for x in line.split()[1:]]
    assert len(pids) == 6
    try:
        for pid in pids:
            assert wait_for(lambda pid=pid: gone(pid), 5, f"process {pid} to exit")
    finally:
        for pid in pids:
            if not gone(pid):
                kill_pid(pid)


def test_actors_die_with_their_zygote(client: ZmqClient) -> None:
    launcher = ActorLauncher()
    try:
        procs = [launcher.start(f"z{i}", cpus=0.1) for i in range(2)]
        for p in procs:
            p.wait_ready(30)
        zygote = launcher.zygote_pid
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)  # PR_SET_PDEATHSIG ends its children
        for p in procs:
            assert wait_for(lambda p=p: gone(p.pid), 5, "the actor to die with its zygote")
            # its handle's exit sentinel can lag the process table by a moment (seen in CI)
            assert wait_for(lambda p=p: p.exitcode is not None, 5, "the handle to see the exit")
        again = launcher.start("again", cpus=0.1)  # a new zygote serves the next ones
        assert again.wait_ready(30).startswith("tcp://")
        assert launcher.zygote_pid != zygote
    finally:
        launcher.close()


def test_spawn_64_actors_is_cheap() -> None:
    with ActorLauncher() as launcher:
        started = time.monotonic()
        procs = [launcher.start(f"m{i}", cpus=0.1) for i in range(64)]
        for p in procs:
            p.wait_ready(30)
        elapsed = time.monotonic() - started
        uss = [psutil.Process(p.pid).memory_full_info().uss for p in procs[:8]]
    mean_mb = sum(uss) / len(uss) / 2**20
    print(f"MEASURE 64 actors: {elapsed * 1000:.0f} ms, {mean_mb:.1f} MB unique each")
    assert elapsed < 10
    assert mean_mb < 40


# ------------------------------------------------------------------------------------------
# shipping code


PACKAGE = {
    "mypkg/__init__.py": "from mypkg.util import offset\n",
    "mypkg/util.py": "def offset():\n    return 100\n",
    "mypkg/extra.py": "VALUE = 'extra'\n",
    "mypkg/sim.py": textwrap.dedent(
        """
        import os
        from mypkg.util import offset

        class Sim:
            def __init__(self, seed):
                self.seed = seed

            def step(self, x):
                return x + self.seed + offset()

            def dynamic(self):
                import mypkg.extra  # imported on the actor: needs the shipped files
                return mypkg.extra.VALUE, mypkg.extra.__file__
        """
    ),
    "helpers.py": "def double(x):\n    return 2 * x\n",
    "main.py": textwrap.dedent(
        """
        import os, sys
        import harness
        import helpers
        from mypkg.sim import Sim

        @harness.remote(cpus=0.1)
        class Main(Sim):
            def combo(self, x):
                return helpers.double(self.step(x))

            def where(self):
                return os.getcwd(), sys.path[:3]

        with harness.connect():
            m = Main(seed=3)
            direct = harness.remote(cpus=0.1)(Sim)(seed=1)
            print("COMBO", m.combo(2))
            print("STEP", direct.step(1))
            print("DYNAMIC", *m.dynamic())
            print("WHERE", m.where()[0])
        """
    ),
}


def test_classes_from_main_and_local_packages_are_shipped(tmp_path: Path) -> None:
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for rel, text in PACKAGE.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(project / "main.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,  # neither the script's directory nor its packages are on this path
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert out["COMBO"] == str(2 * (2 + 3 + 100))
    assert out["STEP"] == str(1 + 1 + 100)
    value, file = out["DYNAMIC"].split(" ", 1)
    assert value == "extra"
    assert not file.startswith(str(project))  # imported from the shipped copy
    assert out["WHERE"] == str(elsewhere)


def test_shipped_sources_of_a_local_module(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "localmod_xyz.py").write_text(
        "import json\nclass Thing:\n    def f(self):\n        return json.dumps([1])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import localmod_xyz  # type: ignore[import-not-found]

    sources, names = shipped_sources(localmod_xyz.Thing)
    assert names == ["localmod_xyz"]
    assert "class Thing" in sources["localmod_xyz"]
    # installed things (numpy, harness itself, editable or not) are never shipped
    assert shipped_sources(np.ndarray) == ({}, [])
    assert shipped_sources(ZmqClient) == ({}, [])


# ------------------------------------------------------------------------------------------
# cluster mode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connect_to_nothing_fails_fast_and_clearly() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(HarnessError, match="no answer from a harness master"):
        connect(address, connect_timeout_s=1.0, keys=ephemeral_keys())
    assert time.monotonic() - started < 4
    # no keys given and none recorded for that address: said at once, naming the fixes
    with pytest.raises(HarnessError, match=r"no CURVE keys.*--keys DIR, run.cluster_keys"):
        connect(address, connect_timeout_s=1.0)
    with pytest.raises(HarnessError, match="tcp://HOST:PORT"):
        connect("localhost:7450")


class FakeMaster:
    """Just enough of a master to test the client side: answers hello (or refuses it),
    places actors with a real launcher, records heartbeats and can report a death."""

    def __init__(self, refuse: str | None = None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.keys = ephemeral_keys()
        self.guard = Guard(self.ctx, self.keys)
        self.guard.server(self.sock, "127.0.0.1")
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.refuse = refuse
        self.launcher = ActorLauncher(keys=self.keys)
        self.procs: dict[str, Any] = {}
        self.seen: list[wire.Message] = []
        self.client: bytes | None = None
        self.outbox: list[list[Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                for frames in self.outbox:
                    self.sock.send_multipart(frames)
                self.outbox.clear()
            if not self.sock.poll(50):
                continue
            ident, *frames = self.sock.recv_multipart()
            msg = wire.unpack(frames)
            self.seen.append(msg)
            h = msg.header
            if msg.kind is wire.Kind.HELLO:
                if self.refuse:
                    reply = wire.pack(wire.Kind.REFUSED, {"reason": self.refuse})
                else:
                    self.client = ident
                    reply = wire.pack(wire.Kind.WELCOME, {"peer_id": "c1", "heartbeat_s": 0.2})
            elif msg.kind is wire.Kind.PLACE:
                actor_id = f"x{h['id']}"
                proc = self.launcher.start(actor_id, cpus=h["cpus"], memory_mb=h["memory_mb"])
                self.procs[actor_id] = proc
                endpoint = proc.wait_ready(30)
                reply = wire.pack(
                    wire.Kind.PLACED,
                    {
                        "id": h["id"],
                        "actor_id": actor_id,
                        "endpoint": endpoint,
                        "worker_id": "w1",
                        "worker_addr": "127.0.0.1",
                        "pid": proc.pid,
                    },
                )
            elif msg.kind is wire.Kind.HEARTBEAT:
                reply = wire.pack(wire.Kind.HEARTBEAT, {"peer_id": "c1"})
            elif msg.kind is wire.Kind.RELEASE:
                self.procs[h["actor_id"]].kill()
                continue
            else:
                continue
            self.sock.send_multipart([ident, *reply])

    def send(self, kind: wire.Kind, header: dict[str, Any]) -> None:
        assert self.client is not None
        with self.lock:
            self.outbox.append([self.client, *wire.pack(kind, header)])

    def kinds(self) -> list[wire.Kind]:
        return [m.kind for m in list(self.seen)]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.launcher.close()
        self.sock.close()
        self.guard.close()
        self.ctx.term()


def test_cluster_client_against_a_fake_master() -> None:
    master = FakeMaster()
    try:
        c = connect(master.address, heartbeat_s=0.2, keys=master.keys)
        try:
            assert c.peer_id == "c1"
            c.report_metrics({"steps_per_s": 12.5, "inbox": 3})
            proxy = RemoteCounter.options(memory_mb=2048)(7, _client=c)
            assert proxy.add(1) == 8
            handle = handle_of(proxy)
            assert handle.actor_id.startswith("x") and handle.pid
            pending = proxy.sleep.future(30)
            master.send(
                wire.Kind.ACTOR_DIED, {"actor_id": handle.actor_id, "reason": "worker gone"}
            )
            error = pending.exception(timeout=5)
            assert isinstance(error, ActorLost) and "worker gone" in str(error)
            other = RemoteCounter(_client=c)
            assert other.echo("ok") == "ok"
            release(other)
            wait_for(lambda: wire.Kind.RELEASE in master.kinds(), 5, "a RELEASE")
            beats = wait_for(
                lambda: [m for m in master.seen if m.kind is wire.Kind.HEARTBEAT and m.payload],
                5,
                "heartbeats with metrics",
            )
            assert wire.load_data(beats[-1].payload) == {"steps_per_s": 12.5, "inbox": 3}
            place = next(m for m in master.seen if m.kind is wire.Kind.PLACE)
            assert place.header["memory_mb"] == 2048
            hello = next(m for m in master.seen if m.kind is wire.Kind.HELLO)
            assert hello.header["role"] == "client" and hello.header["pid"] == os.getpid()
        finally:
            c.close()
        wait_for(lambda: wire.Kind.BYE in master.kinds(), 5, "a BYE")
    finally:
        master.close()


def test_cluster_refusal_is_a_clear_error() -> None:
    master = FakeMaster(refuse="protocol version mismatch: you speak 1, this master speaks 2")
    try:
        with pytest.raises(HarnessError, match="refused this client: protocol version mismatch"):
            connect(master.address, connect_timeout_s=5, keys=master.keys)
    finally:
        master.close()


def test_cluster_client_with_a_real_master_and_worker() -> None:
    from harness_zmq.master import Master
    from harness_zmq.worker import Worker

    master = Master("127.0.0.1", 0, heartbeat_s=0.5)
    master_thread = threading.Thread(target=master.run, daemon=True)
    master_thread.start()
    worker = Worker(master.address, cpus=4)
    worker_thread = threading.Thread(target=worker.run, daemon=True)
    worker_thread.start()
    try:
        with harness.connect(master.address) as c:
            wait_for(lambda: master.status()["workers"], 10, "the worker to register")
            # its zygote started with it: the first spawn does not hold up its heartbeats
            assert worker.launcher.zygote_pid is not None
            proxy = RemoteCounter(1, _client=c)
            assert proxy.add(2) == 3
            pending = proxy.sleep.future(30)
            pid = handle_of(proxy).pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            assert isinstance(pending.exception(timeout=8), ActorLost)
            survivor = RemoteCounter(_client=c)
            assert survivor.echo(5) == 5
        wait_for(lambda: not master.status()["jobs"], 10, "the master to drop the jobs")
    finally:
        worker.request_stop()
        worker_thread.join(timeout=10)
        master.request_stop()
        master_thread.join(timeout=10)
        master.close()
