"""Bad input through the real CLI: one paragraph naming the thing and the fix, exit code 2,
no traceback unless --debug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"
PENDULUM = PACK.parent / "pendulum"


def harness(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "no/such/pack"], ["'no/such/pack' does not exist", "competitions/cartpole"]),
        (["run", "cartpoel"], ["'cartpoel'", "Did you mean 'cartpole'"]),
        (["run", str(PACK), "--set", "algo=dqnn"], ["Unknown algorithm 'dqnn'", "'dqn'"]),
        (["run", str(PACK), "--set", "env=CartPol-v1"], ["'CartPol-v1'", "CartPole-v1"]),
        (["run", str(PACK), "--set", "backend=torhc"], ["Unknown backend 'torhc'", "'torch'"]),
        (["run", str(PACK), "--set", "algo.lr=1"], ["'lr' is not an option", "learning_rate"]),
        (["run", str(PACK), "--set", "run.seed=abc"], ["seed = 'abc'", "expected int"]),
        (
            ["run", str(PACK), "--set", "env=Pendulum-v1", "--set", "algo=dqn"],
            ["'dqn' does not support the box action space", "ppo", "sac", "td3"],
        ),
        (
            [
                "run",
                str(PENDULUM),
                "--config",
                str(PENDULUM / "ddpg.toml"),
                "--set",
                "env=CartPole-v1",
            ],
            ["'ddpg' does not support the discrete action space of 'CartPole-v1'", "dqn"],
        ),
        (
            ["run", str(PENDULUM), "--set", "env=MountainCarContinuous-v0", "--set", "algo.tau=2"],
            ["tau = 2", "(0, 1]"],
        ),
    ],
)
def test_run_bad_input(args: list[str], needles: list[str], tmp_path: Path) -> None:
    assert_clean_error(harness(*args, "--out", str(tmp_path)), *needles)


def test_malformed_pack_file(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text('[run]\nalgo = "ppo\n')
    assert_clean_error(harness("run", str(tmp_path)), "Malformed config file", "pack.toml")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    proc = harness("run", "no/such/pack", "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_eval_of_something_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    assert_clean_error(harness("eval", str(tmp_path)), "holds no complete checkpoint")
    assert_clean_error(harness("eval", str(tmp_path / "missing")), "does not exist")


def test_checkpoint_from_another_algorithm(tmp_path: Path) -> None:
    proc = harness(
        "run",
        str(PACK),
        "--steps",
        "512",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--set",
        "name=r",
        "--set",
        "eval_episodes=0",
        "--set",
        "trackers=['csv']",
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "r"
    assert_clean_error(
        harness("eval", str(run_dir), "--set", "algo=dqn"),
        "written by algo 'ppo'",
        "config asks for algo 'dqn'",
    )
    assert_clean_error(
        harness("run", "--resume", str(run_dir), "--set", "algo=dqn"),
        "written by algo 'ppo'",
    )


@pytest.mark.parametrize("actors", ["3", "-1"])
def test_actors_flag_sizes_the_farm_and_its_envs(tmp_path: Path, actors: str) -> None:
    """--actors N runs N farm actors and raises run.num_envs to at least N (each actor steps
    one env or more); -1 is one actor per core."""
    import os
    import tomllib

    proc = harness(
        "run", str(PACK), "--actors", actors, "--set", "run.num_envs=2", "--steps", "256",
        "--set", "run.eval_episodes=0", "--out", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = tmp_path.iterdir()
    run = tomllib.loads((run_dir / "config.toml").read_text())["run"]
    want = len(os.sched_getaffinity(0)) if actors == "-1" else int(actors)
    assert run["actors"] == want
    assert run["num_envs"] == max(2, want)
