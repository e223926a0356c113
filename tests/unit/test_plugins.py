"""The plugin kernel: registration, duplicates, broken plugins, blocking, autoload, tracing."""

from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import hookimpl
from harness.errors import PluginError
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import AlgorithmSpec, TrackerSpec


def _algo_plugin(name: str) -> SimpleNamespace:
    @hookimpl
    def harness_register_algorithms() -> list[AlgorithmSpec]:
        return [AlgorithmSpec(name, make_agent=lambda *a, **k: None, config_cls=object)]

    return SimpleNamespace(harness_register_algorithms=harness_register_algorithms)


def test_inline_plugin_registers_with_its_name() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register_plugin(_algo_plugin("mine"), "my_plugin")
    registry = collect_registry(pm)
    assert registry.algorithms.get("mine").plugin == "my_plugin"
    assert pm.infos["my_plugin"].registers == {"algorithms": ["mine"]}


def test_duplicate_names_are_a_clash_naming_both_plugins() -> None:
    """A duplicate no longer stops everything (tests/unit/test_plugin_clashes.py has the
    rest): the clash names both plugins and both stay reachable."""
    pm = make_plugin_manager(autoload=False)
    pm.register_plugin(_algo_plugin("same"), "first")
    pm.register_plugin(_algo_plugin("same"), "second")
    registry = collect_registry(pm)
    message = registry.algorithms.clash_message("same")
    assert "'same' is registered by plugins 'first', 'second'" in message
    assert "'second:same'" in message
    assert registry.algorithms.clashes == {"same": ["first", "second"]}
    assert registry.algorithms.get("same").plugin == "first"  # (neither is first-party)
    assert registry.algorithms.get("second:same").plugin == "second"


def test_unknown_name_suggests() -> None:
    registry = collect_registry(make_plugin_manager())
    with pytest.raises(PluginError, match=r"Unknown algorithm 'ppp'.*'ppo'"):
        registry.algorithms.get("ppp")


def test_registration_hook_that_raises_is_skipped_and_named() -> None:
    @hookimpl
    def harness_register_trackers() -> list[TrackerSpec]:
        raise RuntimeError("boom")

    pm = make_plugin_manager(autoload=False)
    pm.register_plugin(_algo_plugin("fine"), "good")
    pm.register_plugin(SimpleNamespace(harness_register_trackers=harness_register_trackers), "bad")
    registry = collect_registry(pm)
    assert "fine" in registry.algorithms
    assert "boom" in pm.broken["bad"]
    assert "csv" in registry.trackers  # the built-in plugin still works


def test_wrong_record_type_is_reported() -> None:
    @hookimpl
    def harness_register_algorithms() -> list[str]:
        return ["not a record"]

    pm = make_plugin_manager(autoload=False)
    pm.register_plugin(
        SimpleNamespace(harness_register_algorithms=harness_register_algorithms), "odd"
    )
    collect_registry(pm)
    assert "expected AlgorithmSpec" in pm.broken["odd"]


@pytest.fixture
def broken_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real installed distribution whose entry point raises on import."""
    (tmp_path / "harness_broken_mod.py").write_text("raise ImportError('missing dependency xyz')\n")
    info = tmp_path / "harness_broken-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-broken\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[harness]\nbroken = harness_broken_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_plugin_that_raises_on_import_is_named_and_skipped(broken_dist: Path) -> None:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    assert "missing dependency xyz" in pm.broken["broken"]
    assert {"dqn", "ppo"} <= set(registry.algorithms)


def test_block_switch() -> None:
    registry = collect_registry(make_plugin_manager(blocked=["algos"]))
    assert "ppo" not in registry.algorithms
    assert "torch" in registry.backends


def test_autoload_disabled_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = make_plugin_manager()
    assert set(pm.infos) == {"builtin"}
    pm = make_plugin_manager(load=["algos"])
    assert set(pm.infos) == {"builtin", "algos"}
    assert pm.infos["algos"].distribution == "harness"


def test_trace_logs_hook_calls(caplog: pytest.LogCaptureFixture) -> None:
    pm = make_plugin_manager(trace=True)
    with caplog.at_level(logging.INFO, logger="harness.plugins"):
        collect_registry(pm)
        pm.hook.harness_configure(config=None)
    assert any("harness_configure" in r.getMessage() for r in caplog.records)


def test_core_imports_without_frameworks() -> None:
    code = textwrap.dedent(
        """
        import sys
        import harness, harness.plugins, harness.config, harness.api, harness.data
        import harness.runtime, harness.registry, harness.tracking, harness.checkpoint
        heavy = [m for m in ("torch", "gymnasium", "paddle", "zmq") if m in sys.modules]
        assert not heavy, heavy
        from harness.plugins import collect_registry, make_plugin_manager
        collect_registry(make_plugin_manager())
        heavy = [m for m in ("torch", "paddle") if m in sys.modules]
        assert not heavy, f"listing plugins imported {heavy}"
        """
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("where", ["before", "after"])
def test_cli_lists_plugins_and_blocks_with_p_no(where: str) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "harness.cli"]
    listing = subprocess.run([*cmd, "plugins"], capture_output=True, text=True, check=True).stdout
    for name in ("algos", "torch", "gymnasium", "tensorboard", "competitions", "builtin"):
        assert name in listing
    args = ["-p", "no:algos", "plugins"] if where == "before" else ["plugins", "-p", "no:algos"]
    blocked = subprocess.run([*cmd, *args], capture_output=True, text=True, check=True).stdout
    assert "algorithms: dqn" not in blocked and "backends: torch" in blocked
    assert "blocked algos" in blocked


def test_a_broken_plugin_is_warned_about_once(broken_dist: Path) -> None:
    """One warning, once: not a logger line and a CLI line for the same plugin, and not again
    when the process builds a second manager (harness run --help builds two)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_dist), *sys.path])}
    for args in (["plugins"], ["run", "--help"]):
        proc = subprocess.run(
            [sys.executable, "-m", "harness.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        assert proc.stderr.count("missing dependency xyz") == 1, proc.stderr
