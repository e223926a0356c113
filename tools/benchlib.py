"""What the benchmark tools in this folder share (imported as a sibling module: the tools run
as scripts, `python tools/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import platform
from pathlib import Path

from harness.cpus import cpu_share


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpus_and_model() -> str:
    """``"2 CPUs (AMD EPYC ...)"``: the cores this process may use and their model."""
    return f"{cpu_share()} CPUs ({cpu_model()})"
