"""The suite's own setup (tests/conftest.py): under pytest-xdist each worker runs on its own
share of the cores, so the backends' thread pools (sized from the affinity) do not
oversubscribe the machine, and a crashed worker's replacement starts like the others."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import pin_threads, worker_cores

from harness.cpus import cpu_share


def test_worker_cores_split_the_machine() -> None:
    assert worker_cores(0, 2, [0, 1]) == [0]
    assert worker_cores(1, 2, [0, 1]) == [1]
    assert worker_cores(1, 2, [0, 1, 2, 3, 4]) == [1, 3]
    assert worker_cores(2, 3, [4, 5, 6, 7, 8, 9]) == [6, 9]
    assert worker_cores(1, 4, [0, 1]) == [0, 1]  # fewer cores than workers: all of them
    assert worker_cores(0, 1, [0, 1]) == [0, 1]


def test_a_replacement_worker_gets_cores() -> None:
    # xdist names the replacement of a crashed gw1 of 2 workers 'gw2', then 'gw3'...
    assert worker_cores(2, 2, [0, 1]) == [0]
    assert worker_cores(3, 2, [0, 1]) == [1]
    assert worker_cores(5, 3, [0, 1, 2, 3, 4, 5]) == [2, 5]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pinning_skips_a_thread_that_has_exited() -> None:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    gone = thread.native_id
    thread.join()
    assert gone is not None
    mine = sorted(os.sched_getaffinity(0))  # pinning to the cores it has changes nothing
    pin_threads(mine, [gone, threading.get_native_id()])
    assert sorted(os.sched_getaffinity(0)) == mine


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_crashed_worker_does_not_end_the_run(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    # the suite's conftest in a directory of its own, with a test that kills its worker
    shutil.copy(Path(__file__).resolve().parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_crash.py").write_text(
        "import os\n\n"
        "def test_crash():\n    os._exit(1)\n\n"
        "def test_after_the_crash():\n    pass\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert "INTERNALERROR" not in out, out
    assert "1 failed, 1 passed" in out, out


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
