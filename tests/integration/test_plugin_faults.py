"""Env-side faults of a plugin end a run with one paragraph naming the plugin, the env id, the
step and what was expected, keep the last good checkpoint and write the summary (exit 2); an
env family whose ``accepts()`` raises is skipped with one warning while other envs still run.

The faulty env plugin is a module written into ``tmp_path`` and loaded with ``-p MODULE``
(PYTHONPATH), the real path a plugin that is not installed as a distribution takes; every run
is the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.testing import check_env

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "competitions" / "cartpole"
FAULT_AT = 200
"""Env steps (per env) after which a faulty env misbehaves."""

PLUGIN = f'''
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from harness import hookimpl
from harness.registry import EnvSpec

FAULT_AT = {FAULT_AT}


class Faulty(gym.Env):
    """A short walk; from step FAULT_AT of its life it breaks the way its id says."""

    def __init__(self, env_id):
        self.env_id = env_id
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.lived = self.t = 0

    def _obs(self):
        width = 5 if self.env_id == "ShapeShift-v0" and self.lived >= FAULT_AT else 4
        return np.zeros(width, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {{}}

    def step(self, action):
        self.lived += 1
        self.t += 1
        if self.env_id == "Raises-v0" and self.lived >= FAULT_AT:
            raise RuntimeError("sensor cable unplugged")
        return self._obs(), float(action), False, self.t >= 10, {{}}


def make_env(env_id, *, num_envs=1, seed=None, vector="sync", options=None):
    if env_id == "NoneEnv-v0":
        return None
    envs = SyncVectorEnv(
        [lambda: Faulty(env_id) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    return envs


@hookimpl
def harness_register_envs():
    ids = ("ShapeShift-v0", "Raises-v0", "NoneEnv-v0")
    return [EnvSpec("faulty", make_env=make_env, accepts=lambda i: i in ids)]
'''

BAD_ACCEPTS = """
from harness import hookimpl
from harness.registry import EnvSpec


def accepts(env_id):
    raise KeyError("registry file missing")


@hookimpl
def harness_register_envs():
    return [EnvSpec("shaky", make_env=lambda *a, **k: None, accepts=accepts)]
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "fault_envs.py").write_text(PLUGIN, encoding="utf-8")
    (root / "bad_accepts.py").write_text(BAD_ACCEPTS, encoding="utf-8")
    return root


def run(site: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "harness.cli", "run", str(CARTPOLE), "--out", str(out)]
    command += ["-p", "fault_envs", "--no-progress", "--set", "run.num_envs=2"]
    command += ["--set", "run.eval_episodes=0"]
    command += ["--set", "run.checkpoint_every=128", "--set", 'run.trackers=["csv"]', *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, check=False
    )


def error_paragraph(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = proc.stderr[proc.stderr.index("harness: error:") :].strip()
    assert "\n\n" not in error, error
    return error


SHAPE = ["shaped", "(2, 4)"]
RAISES = ["RuntimeError: sensor cable unplugged"]


@pytest.mark.parametrize(
    ("env_id", "expected", "actors"),
    [
        ("ShapeShift-v0", SHAPE, "0"),
        ("Raises-v0", RAISES, "0"),
        ("Raises-v0", RAISES, "1"),  # from a farm actor: the same paragraph
        pytest.param("ShapeShift-v0", SHAPE, "1", marks=pytest.mark.slow),
    ],
)
def test_env_fault_mid_run_keeps_the_checkpoint_and_writes_the_summary(
    site: Path, tmp_path: Path, env_id: str, expected: list[str], actors: str
) -> None:
    if actors != "0":
        pytest.importorskip("zmq")
    out = tmp_path / "runs"
    proc = run(site, out, "--set", f"run.env={env_id}", "--steps", "4096", "--actors", actors)
    error = error_paragraph(proc)
    assert f"'{env_id}'" in error and "plugin 'fault_envs'" in error, error
    assert "env step" in error, error
    for text in expected:
        assert text in error, error
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["error"] and summary["steps"] < 2 * FAULT_AT + 64
    checkpoint = Path(summary["checkpoint"])
    assert checkpoint.is_dir() and checkpoint.parent == run_dir / "checkpoints"
    assert int(checkpoint.name.split("_")[-1]) >= 128  # one written before the fault


def test_make_env_returning_none_is_named(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    error = error_paragraph(run(site, out, "--set", "run.env=NoneEnv-v0", "--steps", "256"))
    assert "'faulty'" in error and "plugin 'fault_envs'" in error and "make_env" in error
    assert "NoneType" in error and "'NoneEnv-v0'" in error, error
    assert not out.exists() or not any(out.iterdir()), "a run directory was left"


def test_a_family_whose_accepts_raises_is_skipped_with_one_warning(
    site: Path, tmp_path: Path
) -> None:
    proc = run(site, tmp_path / "runs", "-p", "bad_accepts", "--steps", "256")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "'shaky'" in line]
    assert len(warnings) == 1, proc.stderr
    assert "plugin 'bad_accepts'" in warnings[0] and "KeyError" in warnings[0]


def test_check_env_names_an_observation_shape_change(site: Path) -> None:
    sys.path.insert(0, str(site))
    try:
        import fault_envs

        with pytest.raises(AssertionError) as info:
            spec = fault_envs.harness_register_envs()[0]
            check_env(spec, "ShapeShift-v0", steps=2 * FAULT_AT)
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("fault_envs", None)
    message = str(info.value)
    assert "(4,)" in message and "(5,)" in message and "ShapeShift-v0" in message, message


def test_env_fault_in_an_evaluation_is_named_too(site: Path, tmp_path: Path) -> None:
    """Training stops short of the fault; the closing evaluation (fresh envs, 25 episodes of
    10 steps each) reaches it: the same paragraph, naming the evaluation, with the summary."""
    out = tmp_path / "runs"
    proc = run(
        site, out, "--set", "run.env=Raises-v0", "--steps", "128", "--set", "run.eval_episodes=200"
    )
    error = error_paragraph(proc)
    assert "'Raises-v0'" in error and "plugin 'fault_envs'" in error, error
    assert "in an evaluation failed in step at env step" in error, error
    (run_dir,) = out.iterdir()
    assert json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["error"]
