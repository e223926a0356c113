"""What a plugin may import from harness: the public core modules.

docs/plugins.md ("What a plugin may import") says why each is here; tests/unit/test_plugin_api.py
holds the first-party plugins and competition packs to this list. The rules:

* a module not listed is private, and so is every submodule of a listed package that is not
  listed itself (``harness.runtime.run``, ``harness.data.replay``, ``harness.testing.env``);
* a listed module that declares ``__all__`` exports exactly the names in it (``harness``,
  ``harness.runtime``, ``harness.remote``, ``harness.data``, ``harness.testing``,
  ``harness.commands``);
* a name with a leading underscore is private in every module.

A private name can move or change in any release; a public one changes with a deprecation.
"""

from __future__ import annotations

PUBLIC_MODULES: tuple[str, ...] = (
    "harness",
    "harness.api",
    "harness.backend_common",
    "harness.checkpoint",
    "harness.commands",
    "harness.config",
    "harness.cpus",
    "harness.curriculum",
    "harness.data",
    "harness.errors",
    "harness.hookspecs",
    "harness.numpy_nets",
    "harness.plugins",
    "harness.policy",
    "harness.public",
    "harness.pytest_plugin",
    "harness.registry",
    "harness.remote",
    "harness.rundir",
    "harness.runtime",
    "harness.safestate",
    "harness.seeds",
    "harness.sequences",
    "harness.testing",
    "harness.tracking",
    "harness.version",
)
"""The core modules a plugin may import (dotted names, sorted)."""
