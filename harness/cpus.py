"""How many CPUs this process may use (shared by the runner and the backends' thread pools)."""

from __future__ import annotations

import os


def cpu_share(processes_per_host: int = 1) -> int:
    """The cores this process may run on (its CPU affinity), divided among the
    ``processes_per_host`` harness processes sharing them; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, processes_per_host))
