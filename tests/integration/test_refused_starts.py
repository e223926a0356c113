"""Refused starts: every optional extra, missing, and an unreachable cluster. The command exits 2
with one paragraph (naming the extra to install), prints no traceback and leaves no run
directory behind.

Each case runs the real CLI in a child process in which the extra's modules cannot be imported
(``sys.modules[name] = None``: what Python does for a module that is absent, so both
``import name`` and ``importlib.util.find_spec(name)`` behave as on a machine without it).
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import EXTRAS

ROOT = Path(__file__).resolve().parents[2]

BLOCKING_MAIN = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from harness.cli import main
sys.exit(main(sys.argv[2:]))
"""

CASES = [
    # (extra, modules made unimportable, harness arguments)
    ("zmq", "zmq,msgpack", ["run", "competitions/cartpole", "--actors", "1"]),
    ("ray", "ray", ["run", "competitions/cartpole", "--actors", "1", "--set", "transport=ray"]),
    ("paddle", "paddle", ["run", "competitions/cartpole", "--set", "backend=paddle"]),
    ("torch", "torch", ["run", "competitions/cartpole"]),
    ("osim", "opensim", ["run", "competitions/prosthetics"]),
    ("wandb", "wandb", ["run", "competitions/cartpole", "--set", "trackers=['csv', 'wandb']"]),
    (
        "tensorboard",
        "tensorboard",
        ["run", "competitions/cartpole", "--set", "trackers=['csv', 'tensorboard']"],
    ),
    ("tune", "optuna", ["tune", "competitions/cartpole", "--trials", "1"]),
    (
        "offline",
        "minari",
        ["collect", "competitions/pendulum", "--policy", "random", "--episodes", "1"],
    ),
    ("multiagent", "pettingzoo,mpe2", ["run", "competitions/mpe_spread"]),
    ("atari", "ale_py", ["run", "competitions/cartpole", "--set", "env=ALE/Pong-v5"]),
    ("mujoco", "mujoco", ["run", "competitions/mujoco"]),
]


def _harness_without(modules: str, args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    budget = ["--steps", "64"] if args[0] == "run" else []
    return subprocess.run(
        [sys.executable, "-c", BLOCKING_MAIN, modules, *args, *budget, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize(("extra", "modules", "args"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_is_named_with_exit_2_and_no_run_directory(
    tmp_path: Path, extra: str, modules: str, args: list[str]
) -> None:
    out = tmp_path / "runs-v0"  # (harness collect's --out is a dataset id: NAME-vN)
    proc = _harness_without(modules, args, out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("harness: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert f"harness[{extra}]" in errors[0], errors[0]
    left = list(out.iterdir()) if out.exists() else []
    assert left == [], f"a refused start left {left}"


def test_a_default_tracker_that_is_not_installed_is_skipped_without_a_word(
    tmp_path: Path,
) -> None:
    """tensorboard is in the default tracker list; a user who never asked for it gets no
    warning when it is missing, and the run completes."""
    out = tmp_path / "runs"
    proc = _harness_without(
        "tensorboard",
        ["run", "competitions/cartpole", "--no-progress", "--set", "eval_every=0"],
        out,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tensorboard" not in proc.stderr.lower(), proc.stderr[-3000:]
    (run_dir,) = out.iterdir()
    assert (run_dir / "metrics.csv").is_file() and not (run_dir / "tensorboard").exists()


def test_every_extra_named_for_a_module_exists_in_setup_cfg() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    assert set(EXTRAS.values()) <= extras, set(EXTRAS.values()) - extras


def test_an_unreachable_cluster_is_refused_without_a_run_directory(tmp_path: Path) -> None:
    """The run directory exists by the time the farm dials its cluster; a refused dial must
    remove it (port 9, discard: nothing listens on loopback there)."""
    out, keys = tmp_path / "runs", tmp_path / "keys"
    env = {**os.environ, "HARNESS_STATE_DIR": str(tmp_path / "state")}
    # every cluster has keys (loopback included): with none, the run stops before it dials
    cli = [sys.executable, "-m", "harness.cli"]
    subprocess.run([*cli, "cluster", "keys", str(keys)], check=True, env=env, timeout=60)
    proc = subprocess.run(
        [
            *cli,
            "run",
            "competitions/cartpole",
            "--actors",
            "1",
            "--steps",
            "64",
            "--set",
            "run.cluster=tcp://127.0.0.1:9",
            "--set",
            f"run.cluster_keys={keys}",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "no answer from a harness master" in proc.stderr
    assert not out.exists() or list(out.iterdir()) == []
