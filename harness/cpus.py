"""How many CPUs this process may use (shared by the runner and the backends' thread pools)."""

from __future__ import annotations

import functools
import os


def cpu_share(processes_per_host: int = 1) -> int:
    """The cores this process may run on (its CPU affinity), divided among the
    ``processes_per_host`` harness processes sharing them; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, processes_per_host))


@functools.cache
def cpu_features() -> tuple[str, frozenset[str]]:
    """This machine's CPU vendor (``GenuineIntel``, ``AuthenticAMD``; '' when unknown) and its
    feature flags (``avx2``, ``avx512_vnni``...), as the first processor of /proc/cpuinfo
    lists them; empty off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return "", frozenset()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields.get("vendor_id", ""), frozenset(fields.get("flags", "").split())
