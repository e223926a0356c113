"""What a newcomer reads at the end of a run: the summary carries the official score
(``eval/score``) where the env reports one, a tracker named in ``run.trackers`` that cannot
start refuses the run (exit 2, naming it, no run directory left), and a tracker whose
``close()`` raises is named in a warning.

The plugins (an env reporting ``score``, two broken trackers) are a module written into
``tmp_path`` and loaded with ``-p``; every run is the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "competitions" / "cartpole"

PLUGIN = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from harness import hookimpl
from harness.registry import EnvSpec, TrackerSpec


class Scored(gym.Env):
    \"\"\"Five steps an episode; the official score is the number of 1-actions taken.\"\"\"

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = self.ones = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = self.ones = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        self.ones += int(action)
        info = {}
        if self.t >= 5:
            info["episode_metrics"] = {"score": float(self.ones)}
        return np.zeros(2, np.float32), 0.0, self.t >= 5, False, info


def make_env(env_id, *, num_envs=1, seed=None, vector="sync", options=None):
    return SyncVectorEnv(
        [Scored for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )


class ClosesBadly:
    def __init__(self, run_dir, config=None, start_step=0):
        pass

    def record(self, step, metrics):
        pass

    def close(self):
        raise OSError("upload queue lost")


def cannot_start(run_dir, config=None, start_step=0):
    raise ConnectionError("dashboard at 127.0.0.1:1 refused the connection")


@hookimpl
def harness_register_envs():
    return [EnvSpec("scored", make_env=make_env, accepts=lambda i: i == "Scored-v0")]


@hookimpl
def harness_register_trackers():
    return [
        TrackerSpec("closes_badly", make=ClosesBadly),
        TrackerSpec("no_start", make=cannot_start),
    ]
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "summary_plugins.py").write_text(PLUGIN, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "harness.cli", "run", str(CARTPOLE), "-p", "summary_plugins"]
    command += ["--out", str(tmp_path / "runs"), "--no-progress", "--steps", "256"]
    command += ["--set", "run.num_envs=2", "--set", "run.eval_episodes=4", *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_summary_has_the_official_score(tmp_path: Path) -> None:
    proc = run(tmp_path, "--set", "run.env=Scored-v0", "--set", 'run.trackers=["csv"]')
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert 0.0 <= summary["eval/score"] <= 5.0
    assert summary["final_eval_metrics"]["eval/score"] == summary["eval/score"]
    assert any(line.split("│")[1].strip() == "eval/score" for line in proc.stdout.splitlines()
               if line.count("│") >= 2), proc.stdout  # fmt: skip


def test_a_named_tracker_that_cannot_start_refuses_the_run(tmp_path: Path) -> None:
    proc = run(tmp_path, "--set", 'run.trackers=["csv", "no_start"]')
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = proc.stderr[proc.stderr.index("harness: error:") :].strip()
    assert "'no_start'" in error and "'summary_plugins'" in error, error
    assert "ConnectionError" in error and "run.trackers" in error, error
    assert "\n\n" not in error
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run directory was left"


def test_a_trackers_close_error_is_named(tmp_path: Path) -> None:
    proc = run(tmp_path, "--set", 'run.trackers=["csv", "closes_badly"]')
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "'closes_badly'" in line]
    assert len(lines) == 1 and "upload queue lost" in lines[0], proc.stderr
