"""Registers the ``ray`` transport: ``harness.connect(address, transport="ray")`` and
``--set transport=ray`` place ``@harness.remote`` actors on a Ray cluster (or a local Ray
started on demand).

Imports nothing heavy at registration: ray loads on the first ``connect``; without it the
error names the extra to install.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from harness import hookimpl
from harness.errors import PluginError
from harness.registry import TransportSpec

INSTALL_HINT = "pip install 'harness[ray]'"


def connect(address: str | None = None, **options: Any) -> Any:
    """``None``: ``RAY_ADDRESS`` when set, else a local Ray on loopback started on demand;
    otherwise a Ray cluster's address (``HOST:PORT`` of its GCS, ``ray://HOST:PORT``, or
    ``auto``)."""
    if address is None and not os.environ.get("RAY_ADDRESS") and "ray" not in sys.modules:
        # a local Ray started here: Ray's "no cluster" mode takes the loopback address as the
        # node's, so the GCS, raylet and workers bind 127.0.0.1 only (Ray otherwise binds every
        # interface). Read by ray at import (and inherited by the daemons it starts), so it is
        # set only when this process has not imported ray and will not join a cluster.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from harness_ray.client import connect as _connect
    except ImportError as exc:
        raise PluginError(
            f"The ray transport needs Ray, which is not importable ({exc}). Install it with "
            f"`{INSTALL_HINT}`."
        ) from None
    return _connect(address, **options)


@hookimpl
def harness_register_transports() -> Iterable[TransportSpec]:
    return [
        TransportSpec(
            "ray",
            connect,
            description="Ray actors on a Ray cluster (RAY_ADDRESS) or a local Ray",
        )
    ]
