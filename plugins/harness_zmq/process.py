"""Process plumbing shared by the actor launcher, its zygote and the actors: a readiness poll
on a descriptor, Linux ``prctl`` (death signal, process name) and the thread-pool variables.

A ground-floor module (no import of this package), so that the launcher (the caller's side),
the zygote and the actor process can share it without importing one another.
"""

from __future__ import annotations

import contextlib
import ctypes
import select
import signal
import sys
from typing import Any

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
"""What sets the size of the BLAS/OpenMP thread pools: 1 in the zygote, ``cpus`` in an actor."""

PARENT_CHECK_S = 1.0
"""How often the zygote and each actor check that their parent still lives (a fallback for
``PR_SET_PDEATHSIG``)."""

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def ready(fd: Any, timeout: float | None, events: int = select.POLLIN) -> bool:
    """Whether ``fd`` (a descriptor or an object with ``fileno()``) is readable (or has
    ``events``) within ``timeout`` seconds (None: wait). ``poll``, not ``select``: a client
    with hundreds of actors holds descriptors beyond ``select``'s limit of 1024."""
    poller = select.poll()
    poller.register(fd, events | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000.0))


def _prctl(option: int, value: Any) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(option, value, 0, 0, 0)


def set_pdeathsig() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere nothing happens)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def set_name(name: str) -> None:
    """The process name ps/top show in their COMM column (15 bytes)."""
    _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))
