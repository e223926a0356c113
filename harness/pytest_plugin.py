"""harness's pytest plugin (entry point ``pytest11: harness``): fixtures for plugin authors.

Installed with harness, so every test session can use them:

* ``harness_pm`` - a fresh plugin manager with no entry-point plugin loaded (only the built-in
  plugin), for registering plugins inline.
* ``harness_registry_factory`` - ``factory(*plugins, **named) -> (pm, registry)``: a fresh
  manager with exactly those plugins registered, and the registry collected from it.
* ``torch_backend`` - the first-party torch backend on the CPU, seeded with 0; skips the test
  when torch is not installed.
* ``harness_backend`` - every installed backend plugin in turn (the test is parametrized over
  them: ``[torch]``, ``[paddle]``, ...), on the CPU with one thread, seeded with 0; a backend
  whose framework is not installed is skipped with its install hint. ``harness_backend_name``
  is the same parametrization as a name only (for tests that set ``backend = NAME`` in a run
  config).

Pair them with the conformance checks in :mod:`harness.testing`::

    from harness.testing import check_algorithm

    def test_my_algo(harness_registry_factory, torch_backend):
        _, registry = harness_registry_factory(my_plugin)
        check_algorithm(registry.algorithms.get("my_algo"), torch_backend, MY_ENV_INFO)

    def test_my_algo_on_every_backend(harness_registry_factory, harness_backend):
        ...

Importing this module imports neither torch nor any environment: pytest loads it in every
session, and listing tests must stay fast.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from harness.plugins import HarnessPluginManager, collect_registry, make_plugin_manager
from harness.registry import Registry

RegistryFactory = Callable[..., tuple[HarnessPluginManager, Registry]]

TORCH_MISSING = (
    "torch is not installed, so the torch_backend fixture cannot run this test "
    "(pip install 'harness[torch]')"
)


@pytest.fixture
def harness_pm() -> HarnessPluginManager:
    """A fresh plugin manager: hookspecs and the built-in plugin, no entry points loaded."""
    return make_plugin_manager(autoload=False)


@pytest.fixture
def harness_registry_factory() -> RegistryFactory:
    """Build ``(pm, registry)`` from plugin objects or modules registered inline.

    Positional plugins are named after their module (``__name__``) or class; keyword ones take
    the keyword as their name, e.g. ``factory(my_plugin, broken=BrokenPlugin())``. Each call
    returns a new manager, so one test can compare several plugin sets.
    """

    def factory(*plugins: Any, **named: Any) -> tuple[HarnessPluginManager, Registry]:
        pm = make_plugin_manager(autoload=False)
        for plugin in plugins:
            base = getattr(plugin, "__name__", None) or type(plugin).__name__
            name, suffix = base, 1
            while pm.has_plugin(name):
                suffix += 1
                name = f"{base}-{suffix}"
            pm.register_plugin(plugin, name)
        for name, plugin in named.items():
            pm.register_plugin(plugin, name)
        return pm, collect_registry(pm)

    return factory


@pytest.fixture
def torch_backend() -> Any:
    """The first-party torch backend on the CPU (seeded with 0), loaded through its plugin."""
    pytest.importorskip("torch", reason=TORCH_MISSING)
    module = "harness_torch.plugin"  # by module: a module named "torch" is pytorch itself
    pm = make_plugin_manager(autoload=False, load=[module])
    if module in pm.broken:
        pytest.fail(f"the torch backend plugin is broken: {pm.broken[module]}")
    return cpu_backend(collect_registry(pm), "torch")


def cpu_backend(registry: Registry, name: str) -> Any:
    """Backend ``name`` of ``registry`` on the CPU with one intra-op thread (a tiny MLP on two
    threads of a shared 2-core runner is ~15x slower), seeded with 0."""
    spec = registry.backends.get(name)
    config = spec.config_cls(device="cpu", threads=1) if spec.config_cls is not None else None
    backend = spec.load(config)
    backend.seed(0)
    return backend


@cache
def _installed_registry() -> Registry:
    return collect_registry(make_plugin_manager())


def _missing_framework(name: str) -> str | None:
    """Why backend ``name`` cannot load here (its framework's module is not installed), or
    None. Checked without importing the framework: listing tests must stay fast."""
    spec = _installed_registry().backends.get(name)
    for module in spec.preload[:1]:
        if importlib.util.find_spec(module) is None:
            return f"backend {name!r} needs {module}, which is not installed ({spec.install_hint})"
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_backend_name" not in metafunc.fixturenames:
        return
    params = []
    for name in _installed_registry().backends:
        reason = _missing_framework(name)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(name, id=name, marks=marks))
    metafunc.parametrize("harness_backend_name", params)


@pytest.fixture
def harness_backend(harness_backend_name: str) -> Any:
    """Each installed backend in turn, on the CPU with one thread, seeded with 0."""
    return cpu_backend(_installed_registry(), harness_backend_name)
