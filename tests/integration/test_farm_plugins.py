"""The learner's plugin selection reaches farm actors: ``-p NAME``, ``-p module.path``,
``-p no:NAME`` and ``HARNESS_DISABLE_PLUGIN_AUTOLOAD=1`` apply to every actor exactly as to the
learner, and a ``-p`` module an actor's host cannot import is an exit-2 error naming it.

Real runs through the CLI with one actor of the embedded farm (its actors are forked by a
fresh fork server, a process of their own like a cluster worker's). The probe plugins are
written into ``tmp_path``; an entry point is made visible to ``importlib.metadata`` by a
hand-written ``dist-info`` directory beside them on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plugins import AUTOLOAD_ENV, make_plugin_manager

pytest.importorskip("zmq")
pytest.importorskip("torch")
pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "competitions" / "cartpole"

# appends its process id to $FARM_PROBE_LOG when a registry is built with it: which processes
# loaded it as a plugin (a process may have imported it without: a fork server, a worker)
SPY = """
import os

from harness import hookimpl

if "FARM_PROBE_IMPORTS" in os.environ:  # (imported at all: a blocked plugin must not be)
    with open(os.environ["FARM_PROBE_IMPORTS"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()}\\n")


@hookimpl
def harness_register_trackers():
    with open(os.environ["FARM_PROBE_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()}\\n")
    return []
"""

# an env family of its own: a run of ProbeCartPole-v1 needs this module in every process
PROBE_ENV = """
from harness import hookimpl
from harness.registry import EnvSpec


def make_env(env_id, **kwargs):
    from harness_gymnasium.plugin import make_env as gym_make_env

    return gym_make_env("CartPole-v1", **kwargs)


@hookimpl
def harness_register_envs():
    return [EnvSpec("farm_probe", make_env=make_env, accepts=lambda i: i == "ProbeCartPole-v1")]
"""


def write_plugins(root: Path, *, spy: bool = True) -> Path:
    """The module ``farm_probe_env`` (no entry point) in ``root``, and with ``spy``
    ``farm_spy`` (entry point ``farm_spy`` of distribution ``farm-spy``)."""
    root.mkdir()
    (root / "farm_probe_env.py").write_text(PROBE_ENV, encoding="utf-8")
    if not spy:
        return root
    (root / "farm_spy.py").write_text(SPY, encoding="utf-8")
    info = root / "farm_spy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: farm-spy\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text("[harness]\nfarm_spy = farm_spy\n", encoding="utf-8")
    return root


def harness(
    tmp_path: Path, *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m harness.cli run ...`` with one actor and a short budget."""
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in {AUTOLOAD_ENV, "HARNESS_BACKEND", "HARNESS_TRACE"}
    }
    full.update(env)
    command = [sys.executable, "-m", "harness.cli", "run", *args]
    command += ["--actors", "1", "--steps", "512", "--no-progress", "--out", str(tmp_path / "runs")]
    command += ["--set", "run.eval_episodes=2", "--set", 'run.trackers=["csv"]']
    return subprocess.run(
        command, capture_output=True, text=True, env=full, cwd=cwd, timeout=300, check=False
    )


def test_docs_example_with_autoloading_off_runs_a_farm(tmp_path: Path) -> None:
    """docs/plugins.md section 7's command, with one farm actor: the actor loads the learner's
    -p plugins although autoloading is off in its environment too."""
    proc = harness(
        tmp_path,
        str(CARTPOLE),
        *("-p", "torch", "-p", "gymnasium", "-p", "algos", "-p", "competitions", "-p", "zmq"),
        env={AUTOLOAD_ENV: "1"},
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "summary.json").is_file()


def test_module_plugin_and_blocked_entry_point_reach_the_actor(tmp_path: Path) -> None:
    """``-p farm_probe_env`` (a module path) builds the actor's env; ``-p no:farm_spy`` keeps
    the autoloaded entry point out of the actor as out of the learner."""
    site = write_plugins(tmp_path / "site")
    spy_log, imports = tmp_path / "spy.log", tmp_path / "imports.log"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.update(FARM_PROBE_LOG=str(spy_log), FARM_PROBE_IMPORTS=str(imports))
    proc = harness(
        tmp_path,
        str(CARTPOLE),
        *("-p", "farm_probe_env", "-p", "no:farm_spy", "--set", "run.env=ProbeCartPole-v1"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert not spy_log.exists(), f"a blocked plugin was loaded by pids {spy_log.read_text()}"
    # not even imported: by the fork server that preloads the run's plugins, for one
    assert not imports.exists(), f"a blocked plugin was imported by pids {imports.read_text()}"


def test_module_plugin_loaded_by_every_process_of_the_run(tmp_path: Path) -> None:
    """``-p farm_spy`` with autoloading off: imported by the learner and by the actor."""
    site = write_plugins(tmp_path / "site")
    spy_log = tmp_path / "spy.log"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.update(FARM_PROBE_LOG=str(spy_log), **{AUTOLOAD_ENV: "1"})
    proc = harness(
        tmp_path,
        str(CARTPOLE),
        *("-p", "torch", "-p", "gymnasium", "-p", "algos", "-p", "zmq", "-p", "farm_spy"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    pids = set(spy_log.read_text(encoding="utf-8").split())
    assert len(pids) == 2, pids  # the learner and its one actor


def test_module_an_actor_cannot_import_is_named(tmp_path: Path) -> None:
    """A ``-p`` module the learner imports from its working directory (``python -m`` puts it
    on sys.path) while the actor's process does not see it, as a remote host without it:
    exit 2, one paragraph naming the module and the actor, no run directory left."""
    site = write_plugins(tmp_path / "site", spy=False)
    proc = harness(
        tmp_path,
        str(CARTPOLE),
        *("-p", "farm_probe_env", "--set", "run.env=ProbeCartPole-v1"),
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        cwd=site,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = proc.stderr[proc.stderr.index("harness: error:") :]
    assert "'farm_probe_env'" in error and "farm actor 0" in error, error
    assert "\n\n" not in error.strip()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_selection_is_what_the_manager_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record a manager carries: its blocks, its autoload switch (the environment's,
    resolved), and the -p plugins that loaded (a broken one is left out: it is warned about
    once, here, not failed on in every actor)."""
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    pm = make_plugin_manager(blocked=["tensorboard"], load=["json", "no_such_module_x"])
    monkeypatch.delenv(AUTOLOAD_ENV)
    assert pm.selection.blocked == ("tensorboard",)
    assert pm.selection.load == ("json",)
    assert pm.selection.autoload is False
    assert pm.selection.manager().selection == pm.selection


@pytest.mark.slow
def test_ray_actors_load_the_learners_selection(tmp_path: Path) -> None:
    """The same through the Ray transport: the module plugin builds the Ray actor's env, and
    the blocked entry point stays out of it."""
    pytest.importorskip("ray")
    site = write_plugins(tmp_path / "site")
    spy_log = tmp_path / "spy.log"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env["FARM_PROBE_LOG"] = str(spy_log)
    proc = harness(
        tmp_path,
        str(CARTPOLE),
        *("-p", "farm_probe_env", "-p", "no:farm_spy", "--set", "run.env=ProbeCartPole-v1"),
        *("--set", "run.transport=ray"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert not spy_log.exists(), f"a blocked plugin was imported by pids {spy_log.read_text()}"


@pytest.mark.slow
@pytest.mark.distributed
def test_cluster_workers_actors_load_the_learners_selection(tmp_path: Path) -> None:
    """A real ``harness cluster`` on loopback whose worker sees the probe plugins: its actor
    builds the env of the learner's ``-p`` module and leaves out the blocked entry point; a
    ``-p`` module only the learner can import (another directory on its PYTHONPATH) stops
    the run with one paragraph naming it and the actor's host."""
    import json
    import re

    site = write_plugins(tmp_path / "site")
    learner_only = tmp_path / "learner_only"
    learner_only.mkdir()
    (learner_only / "learner_only_plugin.py").write_text(PROBE_ENV, encoding="utf-8")
    spy_log = tmp_path / "spy.log"
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, HARNESS_STATE_DIR=str(tmp_path / "state"), FARM_PROBE_LOG=str(spy_log))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop(AUTOLOAD_ENV, None)
    cluster = [sys.executable, "-m", "harness.cli", "cluster"]
    started = subprocess.run(
        [*cluster, "start", "--port", "0", "--cpus", "2"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    found = re.search(r"cluster started at (\S+)", started.stdout)
    assert found, started.stdout
    address = found.group(1)
    spy_log.unlink(missing_ok=True)  # (the cluster's own processes load every plugin)
    try:
        ok = harness(
            tmp_path,
            str(CARTPOLE),
            *("-p", "farm_probe_env", "-p", "no:farm_spy", "--set", "run.env=ProbeCartPole-v1"),
            *("--set", f"run.cluster={address}"),
            env={k: env[k] for k in ("HARNESS_STATE_DIR", "FARM_PROBE_LOG", "PYTHONPATH")},
        )
        assert ok.returncode == 0, ok.stderr
        assert not spy_log.exists(), f"a blocked plugin was imported by {spy_log.read_text()}"
        learner_path = os.pathsep.join([str(learner_only), *paths])
        bad = harness(
            tmp_path,
            str(CARTPOLE),
            *("-p", "learner_only_plugin", "--set", "run.env=ProbeCartPole-v1"),
            *("--set", f"run.cluster={address}"),
            env={"HARNESS_STATE_DIR": env["HARNESS_STATE_DIR"], "PYTHONPATH": learner_path},
        )
        assert bad.returncode == 2, bad.stderr
        error = bad.stderr[bad.stderr.index("harness: error:") :].strip()
        assert "'learner_only_plugin'" in error and "farm actor 0 (host " in error, error
        assert "Traceback" not in bad.stderr and "\n\n" not in error
    finally:
        subprocess.run(
            [*cluster, "stop", address], capture_output=True, env=env, timeout=60, check=False
        )
        for path in (tmp_path / "state").glob("*.json"):  # what is left, by recorded pid
            for record in json.loads(path.read_text()).get("processes", []):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(record["pid"]), signal.SIGKILL)
