"""harness_zmq.wakeup.WakePipe: the self-pipe of the farm's poll loops never touches a
descriptor number after close, when that number may be another file's."""

from __future__ import annotations

import os
import select
import signal
import threading
from pathlib import Path

from harness_zmq.wakeup import WakePipe


def test_wake_and_drain() -> None:
    pipe = WakePipe()
    poller = select.poll()
    poller.register(pipe.fd, select.POLLIN)
    assert poller.poll(0) == []
    for _ in range(100_000):  # more than the pipe holds: never blocks, never raises
        pipe.wake()
    assert poller.poll(0)
    pipe.drain()
    assert poller.poll(0) == []
    pipe.close()
    assert pipe.closed


def test_nothing_touches_a_reused_descriptor_after_close(tmp_path: Path) -> None:
    pipe = WakePipe()
    numbers = {pipe.fd}
    pipe.close()
    # the lowest free numbers go to the next files: they take the pipe's two
    files = [tmp_path / f"f{i}" for i in range(2)]
    fds = [os.open(f, os.O_RDWR | os.O_CREAT) for f in files]
    for fd in fds:
        os.write(fd, b"data")
        os.lseek(fd, 0, os.SEEK_SET)
    try:
        assert numbers & set(fds), "the test needs the pipe's number reused"
        pipe.wake()  # would write into a file
        pipe.drain()  # would read a file's bytes
        pipe.close()  # would close a file
        for fd, path in zip(fds, files, strict=True):
            os.fstat(fd)  # still open
            assert os.lseek(fd, 0, os.SEEK_CUR) == 0, "read from after close"
            assert path.read_bytes() == b"data", "written to after close"
    finally:
        for fd in fds:
            os.close(fd)


def test_a_signal_handler_can_wake_the_loop_it_interrupted() -> None:
    """A worker's SIGTERM handler wakes its loop; the handler runs in the main thread,
    possibly while that thread drains the pipe (holding its lock)."""
    pipe = WakePipe()
    woke = threading.Event()

    def handler(signum: int, frame: object) -> None:
        pipe.wake()
        woke.set()

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with pipe._lock:  # as in drain()
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # the handler runs between bytecodes, here
                if woke.is_set():
                    break
        assert woke.is_set()
        poller = select.poll()
        poller.register(pipe.fd, select.POLLIN)
        assert poller.poll(0)
    finally:
        signal.signal(signal.SIGUSR1, old)
        pipe.close()
