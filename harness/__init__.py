"""harness: a plugin-based research harness for distributed reinforcement learning.

Importing this package loads numpy and pluggy only; frameworks and environments are plugins.
"""

from __future__ import annotations

from harness.hookspecs import hookimpl, hookspec

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl", "hookspec"]
