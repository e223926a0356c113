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
from typing import Any

import pytest
from conftest import pin_threads, spread_heavy, worker_cores

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


def test_heavy_tests_start_each_worker_spread_longest_first(tmp_path: Path) -> None:
    """Three heavy tests that sit together in the first worker's share of the collection are
    dealt out (longest first, to the least loaded worker) and each worker starts on its own;
    the shares are of the tests left after ``-m`` deselected some (as the suite's ``slow``)."""
    pytest.importorskip("xdist")
    shutil.copy(Path(__file__).resolve().parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    heavy(seconds): minutes on one core\n    slow: deselected\n",
        encoding="utf-8",
    )
    slow = "".join(
        f"@pytest.mark.slow\ndef test_slow_{i}():\n    log('slow')\n\n" for i in range(4)
    )
    light = "".join(f"def test_light_{i}():\n    log('light_{i}')\n\n" for i in range(9))
    heavy = "".join(
        f"@pytest.mark.heavy(seconds={s})\ndef test_heavy_{s}():\n    log('heavy_{s}')\n\n"
        for s in (20, 30, 10)
    )
    (tmp_path / "test_order.py").write_text(
        "import os\nimport pytest\n\n"
        "def log(name):\n"
        "    with open(os.environ['PYTEST_XDIST_WORKER'] + '.log', 'a') as f:\n"
        "        f.write(name + '\\n')\n\n"
        + slow
        + light[: len(light) // 3]
        + heavy
        + light[len(light) // 3 :],
        encoding="utf-8",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "worksteal",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "-q",
            ".",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = {p.stem: p.read_text(encoding="utf-8").split() for p in tmp_path.glob("gw*.log")}
    assert sorted(t for names in ran.values() for t in names) == sorted(
        [f"light_{i}" for i in range(9)] + ["heavy_10", "heavy_20", "heavy_30"]
    )
    firsts = sorted(names[0] for names in ran.values())
    assert firsts == ["heavy_20", "heavy_30"], ran  # each worker starts on its longest
    (second,) = [names for names in ran.values() if names[0] == "heavy_20"]
    assert second[1] == "heavy_10", ran  # the least loaded worker takes the third


def test_spreading_heavy_tests_leaves_an_order_it_cannot_fill() -> None:
    class Item:
        def __init__(self, seconds: float | None) -> None:
            self.mark = None if seconds is None else pytest.mark.heavy(seconds=seconds).mark

        def get_closest_marker(self, name: str) -> Any:
            return self.mark if name == "heavy" else None

    items = [Item(None), Item(5), Item(3), Item(None)]
    assert spread_heavy(items, 2) == [items[1], items[0], items[2], items[3]]
    assert spread_heavy(items, 1) == items
    three = [Item(1), Item(1), Item(1)]  # shares of 1 and 2 items: the first holds 2 heavies
    assert spread_heavy(three, 2) == three
