"""Conformance checks for plugin authors: call them from your own tests.

Each check exercises one registered component the way harness's runner uses it and raises
:class:`AssertionError` naming the component, its plugin and what is wrong; it returns ``None``
when the component conforms. No pytest needed (the fixtures in :mod:`harness.pytest_plugin`
are a convenience)::

    from harness.plugins import collect_registry, make_plugin_manager
    from harness.testing import check_algorithm, check_backend, check_env

    registry = collect_registry(make_plugin_manager(autoload=False, load=["my_plugin"]))
    check_env(registry.envs.get("my_family"), "MyEnv-v0")
    backend = registry.backends.get("torch").load(None)
    check_backend(backend)
    check_algorithm(registry.algorithms.get("my_algo"), backend, env_info)

The checks use only numpy and the component under test: they import no framework and no
environment library themselves.
"""

from __future__ import annotations

from harness.testing.algorithm import check_algorithm
from harness.testing.backend import check_backend
from harness.testing.common import random_actions as random_actions
from harness.testing.common import random_observations as random_observations
from harness.testing.env import check_env, check_renderer
from harness.testing.transport import ConformanceActor as ConformanceActor
from harness.testing.transport import check_transport

__all__ = [
    "check_algorithm",
    "check_backend",
    "check_env",
    "check_renderer",
    "check_transport",
]
