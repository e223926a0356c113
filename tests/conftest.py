"""Suite-wide setup. With pytest-xdist (``tools/dev.sh test`` runs ``-n 2``), each worker is
pinned to its own share of this machine's cores before any test imports a framework: the
backends size their thread pools from the CPU affinity (harness.cpus.cpu_share), so two
workers on a 2-core runner each run torch and paddle on one thread instead of four threads
fighting over two cores, and the processes a test starts (farm actors, CLI runs) inherit the
worker's cores."""

from __future__ import annotations

import os

import pytest


def worker_cores(index: int, workers: int, cores: list[int]) -> list[int]:
    """The cores of worker ``index`` of ``workers``: every ``workers``-th core from its own
    offset, or all of them when there are fewer cores than workers."""
    if workers <= 1 or len(cores) < workers:
        return cores
    return cores[index::workers]


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", None)  # set on xdist's workers only
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    index = int(str(worker["workerid"]).removeprefix("gw"))
    cores = worker_cores(index, int(worker["workercount"]), sorted(os.sched_getaffinity(0)))
    for task in os.listdir("/proc/self/task"):  # every thread: execnet's already run
        os.sched_setaffinity(int(task), cores)
