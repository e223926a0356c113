"""Suite-wide setup. With pytest-xdist (``tools/dev.sh test`` runs ``-n 2``), each worker is
pinned to its own share of this machine's cores before any test imports a framework: the
backends size their thread pools from the CPU affinity (harness.cpus.cpu_share), so two
workers on a 2-core runner each run torch and paddle on one thread instead of four threads
fighting over two cores, and the processes a test starts (farm actors, CLI runs) inherit the
worker's cores."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest


def worker_cores(index: int, workers: int, cores: list[int]) -> list[int]:
    """The cores of worker ``index`` of ``workers``: every ``workers``-th core from its own
    offset, or all of them when there are fewer cores than workers.

    xdist names the replacement of a crashed worker with the next free number (``gw2`` of 2
    workers), so ``index`` may be ``workers`` or more: it takes the slot ``index % workers``
    (an empty core list would make ``sched_setaffinity`` fail with EINVAL and end the run)."""
    if workers <= 1 or len(cores) < workers:
        return cores
    return cores[index % workers :: workers]


def pin_threads(cores: Iterable[int], tasks: Iterable[int] | None = None) -> None:
    """Pin this process and its threads (``tasks``: thread ids, default every thread in
    /proc/self/task, as execnet has started some already) to ``cores``."""
    cores = list(cores)
    os.sched_setaffinity(0, cores)  # the process itself, whatever happens to the others
    if tasks is None:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    for task in tasks:
        with contextlib.suppress(ProcessLookupError):  # a thread that exited since listed
            os.sched_setaffinity(task, cores)


def pin_worker(workerinput: Mapping[str, Any]) -> list[int]:
    """Pin an xdist worker (its ``workerinput``) to its cores; returns them."""
    index = int(str(workerinput["workerid"]).removeprefix("gw"))
    cores = worker_cores(index, int(workerinput["workercount"]), sorted(os.sched_getaffinity(0)))
    pin_threads(cores)
    return cores


def pytest_configure(config: pytest.Config) -> None:
    # Mesa (MuJoCo's EGL rendering in the video tests) starts a shader disk-cache thread that
    # sets its own affinity to every core, so a worker pinned to one core would spill onto the
    # other worker's (seen in CI: thread "disk$0" on {0, 1}); rendering without the on-disk
    # cache starts no such thread
    os.environ.setdefault("MESA_SHADER_CACHE_DISABLE", "true")
    worker = getattr(config, "workerinput", None)  # set on xdist's workers only
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    pin_worker(worker)


def spread_heavy(items: list[Any], workers: int) -> list[Any]:
    """``items`` reordered so that xdist's worksteal scheduler starts each worker on its share
    of the ``heavy`` tests (minutes each on one pinned core).

    worksteal hands worker ``i`` the next ``len(rest) // (workers - i)`` items of the collection
    in order and later lets an idle worker steal the tail of a busy worker's queue, never the
    test it is running: heavy tests that sit together in one worker's share run one after the
    other on its core while the other worker idles (CI, 2026-12-05: the three MyoChallenge
    learning checks, 1,040 s, in one share). Here they are dealt longest first to the least
    loaded worker (their ``seconds``) and put at the head of that worker's share; the other
    tests keep their order. Returns ``items`` unchanged when a share would not hold its heavy
    tests."""
    seconds = {
        id(item): float(mark.kwargs.get("seconds", 0))
        for item in items
        if (mark := item.get_closest_marker("heavy")) is not None
    }
    heavy = sorted((item for item in items if id(item) in seconds), key=lambda i: -seconds[id(i)])
    if workers <= 1 or not heavy:
        return items
    loads = [0.0] * workers
    shares: list[list[Any]] = [[] for _ in range(workers)]
    for item in heavy:
        k = loads.index(min(loads))
        shares[k].append(item)
        loads[k] += seconds[id(item)]
    rest = [item for item in items if id(item) not in seconds]
    ordered: list[Any] = []
    left = len(items)
    for i, share in enumerate(shares):
        size = left // (workers - i)
        if size < len(share):
            return items
        fill = size - len(share)
        ordered += share + rest[:fill]
        rest = rest[fill:]
        left -= size
    return ordered


@pytest.hookimpl(trylast=True)  # after `-m` deselected: the shares are of what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # on the xdist workers only (each collects, and each orders the same way); the order is
    # meant for worksteal, the scheduler tools/dev.sh asks for, and harmless under the others
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        items[:] = spread_heavy(items, int(worker["workercount"]))


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cluster authenticates its peers, and a master started without keys writes its
    own into the state directory: each test gets a private one (never the user's
    ~/.harness), inherited by the CLI processes it starts."""
    monkeypatch.setenv("HARNESS_STATE_DIR", str(tmp_path / "state"))
