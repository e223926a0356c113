"""Name clashes between plugins: an entry point named like a first-party plugin, and a plugin
registering a name another plugin registers. Neither may crash a command; `harness plugins`
lists everything and marks the clash; the fix offered is a targeted one.

The third-party side is a real distribution (dist-info with entry points) on a temporary path,
found by importlib.metadata exactly as a pip-installed package is.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import hookimpl
from harness.errors import PluginError
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import TrackerSpec

PLUGIN_MODULE = """
import dataclasses

from harness import hookimpl
from harness.registry import AlgorithmSpec, TrackerSpec


@dataclasses.dataclass
class Config:
    pass


def make_agent(*args, **kwargs):
    raise RuntimeError("the clash test never trains")


def make_tracker(run_dir, config, start_step=0):
    raise RuntimeError("the clash test never tracks")


@hookimpl
def harness_register_algorithms():
    return [AlgorithmSpec("ppo", make_agent=make_agent, config_cls=Config)]


@hookimpl
def harness_register_trackers():
    return [TrackerSpec("mytracker", make=make_tracker)]
"""


def _install(root: Path, dist: str, entry_points: str) -> None:
    """A distribution ``dist`` on ``root`` (as pip leaves it) whose module is PLUGIN_MODULE."""
    module = dist.replace("-", "_") + "_plugin"
    (root / f"{module}.py").write_text(PLUGIN_MODULE)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[harness]\n" + entry_points.format(module=module))


@pytest.fixture
def clashing_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """mypkg: its entry point is named `tensorboard` (a first-party plugin's name), and it
    registers algorithm `ppo` (a first-party algorithm's name)."""
    _install(tmp_path, "mypkg", "tensorboard = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def renamed_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The same package with its entry point renamed: only the algorithm name clashes."""
    _install(tmp_path, "mypkg", "mypkg = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_an_entry_point_named_like_a_first_party_plugin_is_skipped_not_fatal(
    clashing_dist: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="harness.plugins"):
        pm = make_plugin_manager()
    assert pm.infos["tensorboard"].distribution == "harness"  # the first-party one keeps it
    assert "tensorboard@mypkg" in pm.skipped
    registry = collect_registry(pm)
    assert {"ppo", "dqn"} <= set(registry.algorithms)


def test_harness_plugins_names_both_distributions_and_exits_0(clashing_dist: Path) -> None:
    proc = _cli(clashing_dist, "plugins")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warning = " ".join(proc.stderr.split())
    assert "'harness'" in warning and "'mypkg'" in warning, proc.stderr
    assert "-p no:tensorboard@harness" in warning  # how to choose the other one
    listing = " ".join(proc.stdout.split())
    assert "dqn" in listing and "skipped tensorboard@mypkg" in listing, listing
    claims = [line for line in proc.stderr.splitlines() if "claimed by two" in line]
    assert len(claims) == 1, proc.stderr  # one warning, once


def test_blocking_one_distribution_keeps_the_other(clashing_dist: Path) -> None:
    pm = make_plugin_manager(blocked=["tensorboard@harness"])
    assert pm.infos["tensorboard"].distribution == "mypkg"
    assert "tensorboard@mypkg" not in pm.skipped
    registry = collect_registry(pm)
    assert "mytracker" in registry.trackers and "tensorboard" not in registry.trackers


def test_a_clashing_algorithm_name_keeps_both_reachable_by_qualified_name(
    renamed_dist: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = collect_registry(make_plugin_manager())
    assert registry.algorithms.clashes["ppo"] == ["algos", "mypkg"]
    with caplog.at_level(logging.WARNING, logger="harness.registry"):
        first = registry.algorithms.get("ppo")
        registry.algorithms.get("ppo")
    assert first.plugin == "algos"  # first-party keeps the bare name
    assert registry.algorithms.get("mypkg:ppo").plugin == "mypkg"
    assert registry.algorithms.get("algos:ppo") is first
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'mypkg:ppo'" in warnings[0], warnings
    assert "dqn" in registry.algorithms  # nothing was blocked to get there
    with pytest.raises(PluginError, match=r"Unknown algorithm 'mypkg:ppq'.*'mypkg:ppo'"):
        registry.algorithms.get("mypkg:ppq")


def test_harness_plugins_lists_everything_and_marks_the_name_clash(renamed_dist: Path) -> None:
    proc = _cli(renamed_dist, "plugins")
    assert proc.returncode == 0, proc.stderr
    listing = " ".join(proc.stdout.split())
    assert "dqn" in listing and "algorithms: ppo; trackers: mytracker" in listing, listing
    assert "clash algorithm 'ppo'" in listing and "'mypkg:ppo'" in listing, listing
    assert "-p no:" not in listing  # the fix is a qualified name, not blocking a plugin


def test_a_run_chooses_the_third_party_algorithm_by_its_qualified_name(renamed_dist: Path) -> None:
    """--set algo=mypkg:ppo reaches the third-party agent (its factory raises on purpose: the
    message proves which one was built)."""
    proc = _cli(
        renamed_dist,
        "run",
        "competitions/cartpole",
        "--set",
        "algo=mypkg:ppo",
        "--out",
        str(renamed_dist / "runs"),
    )
    assert "the clash test never trains" in proc.stderr, proc.stderr[-3000:]


def test_the_same_module_registered_twice_is_skipped_with_a_reason() -> None:
    module = SimpleNamespace(__name__="twice", harness_register_trackers=None)

    @hookimpl
    def harness_register_trackers() -> list[TrackerSpec]:
        return []

    module.harness_register_trackers = harness_register_trackers
    pm = make_plugin_manager(autoload=False)
    pm.register_plugin(module, "one")
    pm.register_plugin(module, "two")  # pluggy refuses the same object twice: no crash
    assert "one" in pm.infos and "two" not in pm.infos
    assert "already registered as plugin 'one'" in pm.skipped["two"]


def test_first_party_plugins_register_no_clashing_names() -> None:
    registry = collect_registry(make_plugin_manager())
    from harness.registry import KINDS

    clashes = {kind: getattr(registry, kind).clashes for kind in KINDS}
    assert not any(clashes.values()), clashes


def test_a_qualified_name_of_the_same_algorithm_keeps_the_pack_options() -> None:
    """`--set algo=algos:ppo` (silencing a clash) must not drop the pack's [algo] options that
    were written for `ppo`; a different algorithm still does not inherit them."""
    from harness.config import layer, resolve

    registry = collect_registry(make_plugin_manager())
    pack = Path(__file__).resolve().parents[2] / "competitions" / "cartpole" / "pack.toml"
    bare = resolve(layer(pack, [], []), registry)
    qualified = resolve(layer(pack, [], ["algo=algos:ppo"]), registry)
    assert qualified.algo == bare.algo
    other = resolve(layer(pack, [], ["algo=algos:a2c"]), registry)
    assert type(other.algo).__name__ != type(bare.algo).__name__
