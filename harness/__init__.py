"""harness: a plugin-based research harness for distributed reinforcement learning.

Importing this package loads numpy and pluggy only; frameworks and environments are plugins.
"""

from __future__ import annotations

from harness.hookspecs import hookimpl, hookspec
from harness.remote import ActorLost, RemoteError, connect, release, remote
from harness.version import __version__

__all__ = [
    "ActorLost",
    "RemoteError",
    "__version__",
    "connect",
    "hookimpl",
    "hookspec",
    "release",
    "remote",
]
