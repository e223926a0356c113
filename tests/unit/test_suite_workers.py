"""The suite's own setup (tests/conftest.py): under pytest-xdist each worker runs on its own
share of the cores, so the backends' thread pools (sized from the affinity) do not
oversubscribe the machine."""

from __future__ import annotations

import os

import pytest
from conftest import worker_cores

from harness.cpus import cpu_share


def test_worker_cores_split_the_machine() -> None:
    assert worker_cores(0, 2, [0, 1]) == [0]
    assert worker_cores(1, 2, [0, 1]) == [1]
    assert worker_cores(1, 2, [0, 1, 2, 3, 4]) == [1, 3]
    assert worker_cores(2, 3, [4, 5, 6, 7, 8, 9]) == [6, 9]
    assert worker_cores(1, 4, [0, 1]) == [0, 1]  # fewer cores than workers: all of them
    assert worker_cores(0, 1, [0, 1]) == [0, 1]


def test_an_xdist_worker_runs_on_its_own_cores(request: pytest.FixtureRequest) -> None:
    worker = getattr(request.config, "workerinput", None)
    if worker is None:
        pytest.skip("the suite runs in one process (tools/dev.sh test runs it on 2 workers)")
    index = int(str(worker["workerid"]).removeprefix("gw"))
    controller = sorted(os.sched_getaffinity(os.getppid()))  # xdist's workers are its children
    mine = set(worker_cores(index, int(worker["workercount"]), controller))
    assert os.sched_getaffinity(0) == mine
    for task in os.listdir("/proc/self/task"):  # the threads execnet started before the pin
        assert os.sched_getaffinity(int(task)) == mine, f"thread {task}"
    assert cpu_share() == len(mine)
