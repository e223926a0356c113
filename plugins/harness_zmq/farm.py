"""The embedded local farm: actors on this machine, started by an
:class:`~harness_zmq.launcher.ActorLauncher` on 127.0.0.1, and a thread watching their
sentinels (an actor whose process exits is lost at once, with its last lines of output).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import threading
import time
from multiprocessing.connection import wait as wait_handles
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from harness_zmq.capture import with_last_output
from harness_zmq.handle import ZmqActor
from harness_zmq.launcher import ActorLauncher, ActorProcess
from harness_zmq.wakeup import WakePipe

if TYPE_CHECKING:
    from harness.remote import ActorOptions
    from harness_zmq.client import ZmqClient
    from harness_zmq.options import ZmqOptions
    from harness_zmq.security import Keys

log = logging.getLogger(__name__)

__all__ = ["LocalFarm", "local_gpus"]


class LocalFarm:
    """Actors on this machine: an ActorLauncher plus a thread watching their sentinels."""

    def __init__(self, client: ZmqClient, keys: Keys | None, options: ZmqOptions) -> None:
        self.client = client
        # actors' output is captured (a lost actor's last lines go into its ActorLost) and
        # echoed to this process's stderr, where it went before capture
        self.launcher = ActorLauncher(
            "127.0.0.1",
            keys,
            options.preload,
            nice=options.actor_nice,
            ipc=options.local_ipc,
            capture_logs=True,
            echo_logs=True,
        )
        cpus = options.cpus
        self.cpus_total = float(cpus if cpus else (os.cpu_count() or 1))
        self.cpus_used = 0.0
        self.gpus_free: list[int] | None = None
        self._warned = False
        self._lock = threading.Lock()
        self._watch: dict[int, ZmqActor] = {}
        self._wakeup = WakePipe()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self, options: ActorOptions) -> ZmqActor:
        gpus = self._reserve(options)
        actor_id = f"a{next(self.client._ids)}"
        try:
            proc = self.launcher.start(
                actor_id, cpus=options.cpus, gpus=gpus, memory_mb=options.memory_mb
            )
        except BaseException:
            self._unreserve(options, gpus)
            raise
        try:
            endpoint = proc.wait_ready(self.client.start_timeout_s)
            actor = ZmqActor(
                self.client,
                actor_id,
                endpoint,
                proc.pid,
                functools.partial(self._release, proc, options, gpus),
            )
        except BaseException:
            proc.close()
            self._unreserve(options, gpus)
            raise
        actor.process = proc
        with self._lock:
            self._watch[proc.sentinel] = actor
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._monitor, name="harness-zmq-farm-monitor", daemon=True
                )
                self._thread.start()
        self._wakeup.wake()
        return actor

    def _reserve(self, options: ActorOptions) -> list[int]:
        gpus: list[int] = []
        with self._lock:
            if options.gpus:
                if self.gpus_free is None:
                    self.gpus_free = local_gpus()
                if len(self.gpus_free) < options.gpus:
                    raise HarnessError(
                        f"an actor asks for {options.gpus} GPU(s) but the local farm has "
                        f"{len(self.gpus_free)} free; release actors or ask for fewer"
                    )
                gpus = self.gpus_free[: options.gpus]
                del self.gpus_free[: options.gpus]
            self.cpus_used += options.cpus
            if self.cpus_used > self.cpus_total + 1e-9 and not self._warned:
                self._warned = True
                log.warning(
                    "the local farm is oversubscribed: actors ask for %.1f CPUs, this farm has "
                    "%.1f (fine for actors that mostly wait; pass connect(cpus=N) to size it)",
                    self.cpus_used,
                    self.cpus_total,
                )
        return gpus

    def _unreserve(self, options: ActorOptions, gpus: list[int]) -> None:
        with self._lock:
            self.cpus_used -= options.cpus
            if gpus and self.gpus_free is not None:
                self.gpus_free.extend(gpus)

    def _release(self, proc: ActorProcess, options: ActorOptions, gpus: list[int]) -> None:
        with self._lock:
            self._watch.pop(proc.sentinel, None)
        self._wakeup.wake()
        proc.kill()
        proc.close()
        self._unreserve(options, gpus)

    def _monitor(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                fds = list(self._watch)
            try:
                ready = wait_handles([*fds, self._wakeup.fd], timeout=1.0)
            except OSError:  # a sentinel closed meanwhile: look again
                time.sleep(0.01)
                continue
            for handle in ready:
                fd = int(handle)  # type: ignore[arg-type]
                if fd == self._wakeup.fd:
                    self._wakeup.drain()
                    continue
                with self._lock:
                    actor = self._watch.get(fd)
                    proc = actor.process if actor is not None else None
                    if actor is None or proc is None or proc.is_alive():
                        continue  # a descriptor closed and reused meanwhile
                    del self._watch[fd]
                reason = f"its process exited (exit code {proc.exitcode})"
                actor._lost(with_last_output(reason, self.launcher.last_output(actor.actor_id)))

    def close(self) -> None:
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wakeup.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.launcher.close()
        self._wakeup.close()


def local_gpus() -> list[int]:
    """Indices usable as CUDA_VISIBLE_DEVICES entries on this machine."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(v) for v in visible.split(",") if v.strip().isdigit()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(int(pynvml.nvmlDeviceGetCount())))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(range(sum(1 for line in out.splitlines() if line.startswith("GPU "))))
