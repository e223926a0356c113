"""What a sweep of bad `harness run` input found, through the real CLI: out-of-range [run]
numbers and an actor count the machine cannot hold exit 2 with one paragraph and leave no run
directory; an orphaned actor zygote stops quietly; and progress without a terminal.

The CLI runs as a child process, so its stderr is a pipe (not a terminal): the plain progress
lines, not the rich bar.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import RunConfig
from harness.errors import ConfigError
from harness.runtime.build import ACTOR_MEMORY_MB, check_actor_capacity

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_refused(proc: subprocess.CompletedProcess[str], out: Path, *needles: str) -> None:
    """Exit 2, one paragraph naming ``needles``, no traceback, no run directory."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("harness: error:")]
    assert len(error) == 1, proc.stderr
    for needle in needles:
        assert needle in error[0], error[0]
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


# ------------------------------------------------------------------------------------------
# [run] numbers out of range


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--steps", "-5"], ["run.total_steps = -5", "1 or more", "--steps 100000"]),
        (["--steps", "0"], ["run.total_steps = 0", "1 or more"]),
        (["--set", "run.num_envs=0"], ["--set run.num_envs=0", "run.num_envs = 0"]),
        (["--seed", "-3"], ["run.seed = -3", "0 or more"]),
        (["--set", "eval_episodes=-1"], ["run.eval_episodes = -1", "0 turns evaluation off"]),
        (["--set", "run.log_every=-10"], ["run.log_every = -10"]),
        (["--set", "run.progress_every_s=-1.0"], ["run.progress_every_s = -1.0"]),
        (["--set", "run.max_seconds=nan"], ["run.max_seconds = nan"]),
        (["--actors", "-2"], ["run.actors = -2", "-1 starts one actor per core"]),
        (["--set", "algo.noise_correlation=1.0"], ["noise_correlation = 1.0", "[0, 1)"]),
        # every algorithm's learning rates and layer widths (harness.config.check_algo_options)
        (
            ["--set", "algo.learning_rate=nan"],
            ["algo.learning_rate = nan", "finite number 0 or more"],
        ),
        (["--set", "algo.learning_rate=-1"], ["algo.learning_rate = -1.0", "0 or more"]),
        (["--set", "algo.hidden=[-5]"], ["algo.hidden = [-5]", "width of 1 or more"]),
        (["--set", "algo.hidden=[64,0]"], ["algo.hidden = [64, 0]", "width of 1 or more"]),
        (
            ["--set", "run.algo=maddpg", "--set", "algo.lr_critic=inf"],
            ["algo.lr_critic = inf", "learning rate"],
        ),
        # a replay memory no machine holds: refused from an estimate, before numpy tries
        (
            ["--set", "run.algo=dqn", "--set", "algo.buffer_size=1e10"],
            ["algo.buffer_size = 10_000_000_000", "MiB of replay memory", "MiB available"],
        ),
        # CartPole's actions are discrete: correlated Gaussian noise has nothing to act on
        (
            ["--set", "algo.noise_correlation=0.5"],
            ["algo.noise_correlation = 0.5", "discrete actions", "algo.noise_correlation = 0"],
        ),
    ],
)
def test_out_of_range_numbers_are_refused(
    args: list[str], needles: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    assert_refused(harness("run", str(PACK), *args, "--out", str(out)), out, *needles)


def test_a_pack_file_number_is_refused_naming_the_file(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        (PACK / "pack.toml").read_text().replace("total_steps = 100_000", "total_steps = -1")
    )
    out = tmp_path / "runs"
    assert_refused(harness("run", str(pack), "--out", str(out)), out, str(pack), "run.total_steps")


# ------------------------------------------------------------------------------------------
# actors the machine cannot hold


def test_more_actors_than_memory_holds_are_refused_before_any_starts(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = harness("run", str(PACK), "--actors", "100000", "--steps", "1000", "--out", str(out))
    assert_refused(
        proc, out, "run.actors = 100000", f"about {ACTOR_MEMORY_MB} MiB", "run.max_actors"
    )
    assert "MiB are available" in proc.stderr


def test_the_actor_limit_follows_memory_unless_overridden() -> None:
    room = 25 * ACTOR_MEMORY_MB  # MiB: room for 25 actors
    check_actor_capacity(RunConfig(actors=25, num_envs=25), available_mb=room)
    with pytest.raises(ConfigError, match=r"the limit is 25 actors.*run\.max_actors=26"):
        check_actor_capacity(RunConfig(actors=26, num_envs=26), available_mb=room)
    # the override replaces the estimate, both ways
    check_actor_capacity(RunConfig(actors=26, num_envs=26, max_actors=30), available_mb=room)
    with pytest.raises(ConfigError, match=r"run\.max_actors = 10"):
        check_actor_capacity(RunConfig(actors=11, num_envs=11, max_actors=10), available_mb=1e9)
    # a cluster's workers hold its actors, and serial runs start none
    check_actor_capacity(RunConfig(actors=26, num_envs=26, cluster="tcp://h:1"), available_mb=room)
    check_actor_capacity(RunConfig(actors=0), available_mb=0.0)


# the launcher side: queue actors, then wait to be killed
LAUNCHER = """
import sys
from harness_zmq.actor import ActorLauncher

launcher = ActorLauncher("127.0.0.1")
launcher.warm()
for i in range(int(sys.argv[1])):
    launcher.start(f"a{i}", cpus=2.0)  # (2: each also imports threadpoolctl, a slower start)
print(launcher.zygote_pid, flush=True)
sys.stdin.readline()
"""


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # (exited, not yet reaped)
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux-only")
def test_an_orphaned_zygote_stops_at_once_and_quietly(tmp_path: Path) -> None:
    """The launcher (an OOM-killed learner) dies with actors still starting. The zygote and
    its children are frozen meanwhile, then the children go on first, as when the zygote is
    the one slowed down (memory pressure): they find the launcher gone, and the zygote then
    must neither fork the requests still queued nor let anyone print a traceback."""
    pytest.importorskip("zmq")
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, "30"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,  # the zygote and its actors inherit it
            text=True,
        )
        assert launcher.stdout is not None
        zygote = int(launcher.stdout.readline())
        children_of = Path(f"/proc/{zygote}/task/{zygote}/children")
        try:
            # freeze all while the zygote is still forking: its newest children are starting
            deadline = time.monotonic() + 30.0
            while len(children_of.read_text().split()) < 3 and time.monotonic() < deadline:
                time.sleep(0.001)
            os.killpg(zygote, signal.SIGSTOP)  # the zygote leads its own session
            children = children_of.read_text().split()
            launcher.kill()
            launcher.wait(timeout=30)
            for child in children:  # the actors first
                os.kill(int(child), signal.SIGCONT)
            time.sleep(0.5)
            os.kill(zygote, signal.SIGCONT)
            deadline = time.monotonic() + 5.0  # (a few ms on the dev VM)
            while not _exited(zygote) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _exited(zygote), "the zygote outlived its launcher by 5 s"
        finally:
            if not _exited(zygote):
                os.killpg(zygote, signal.SIGKILL)
    time.sleep(0.2)  # (its SIGKILLed actors write nothing more)
    assert "Traceback" not in stderr.read_text(), (children, stderr.read_text())


# ------------------------------------------------------------------------------------------
# progress without a terminal

LINE = re.compile(r"^harness: step (\d+)/(\d+) \(\d+%\) \| \d+ steps/s \| \d+ episodes")


def test_progress_lines_without_a_terminal(tmp_path: Path) -> None:
    proc = harness(
        "run", str(PACK), "--steps", "4096", "--out", str(tmp_path), "--set", "run.eval_every=2048",
        "--set", "run.eval_episodes=2", "--set", "run.progress_every_s=0.001",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if LINE.match(line)]
    assert len(lines) >= 3, proc.stderr  # two during the run, and the last one
    steps = [int(LINE.match(line).group(1)) for line in lines[:-1]]  # type: ignore[union-attr]
    assert steps == sorted(steps) and steps[0] < steps[-1], lines
    assert all(LINE.match(line).group(2) == "4096" for line in lines)  # type: ignore[union-attr]
    assert "ETA" in lines[0] and "eval " in lines[-2]
    assert lines[-1].startswith("harness: step 4096/4096 (100%)") and lines[-1].endswith("| done")


@pytest.mark.parametrize("off", [["--no-progress"], ["--set", "run.progress_every_s=0"]])
def test_no_progress_lines_when_turned_off(off: list[str], tmp_path: Path) -> None:
    proc = harness(
        "run", str(PACK), "--steps", "1024", "--out", str(tmp_path), "--set", "run.eval_episodes=0",
        "--set", "run.progress_every_s=0.001", *off,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "harness: step" not in proc.stderr, proc.stderr


def test_progress_lines_are_time_gated_and_keep_the_last_score_and_eval() -> None:
    import io
    from types import SimpleNamespace

    from harness.progress import LineProgressReporter

    now = [100.0]
    out = io.StringIO()
    reporter = LineProgressReporter(1000, 30.0, stream=out, clock=lambda: now[0])
    run = SimpleNamespace(step=0, episodes=0, recent_return=float("nan"))
    reporter.harness_run_start(run=run)
    for i in range(1, 11):  # ten iterations of 100 steps, 10 s apart
        now[0] += 10.0
        run.step, run.episodes, run.recent_return = 100 * i, 2 * i, float(i)
        metrics = {"charts/score": 7.0} if i == 2 else {"eval/mean_return": 9.5} if i == 5 else {}
        reporter.harness_iteration_end(run=run, metrics=metrics)
    reporter.harness_run_end(run=run, summary={"stopped_early": False})
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "harness: step 300/1000 (30%)",  # 30 s after the start
        "harness: step 600/1000 (60%)",
        "harness: step 900/1000 (90%)",
        "harness: step 1000/1000 (100%)",  # the last line, whenever the run ends
    ]
    assert lines[0].split(" | ")[1:] == [
        "10 steps/s",
        "6 episodes",
        "return 3.0",
        "score 7.0",
        "elapsed 0:00:30",
        "ETA 0:01:10",
    ]
    assert "score 7.0 | eval 9.5" in lines[1] and lines[-1].endswith("elapsed 0:01:40 | done")
