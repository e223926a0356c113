"""Run directories: the lock a process holds while it writes into one, and the checks of where
runs and their files are written (a directory that exists or can be made, is writable, and
has room for a checkpoint).

The lock is an OS file lock (``flock``) on ``RUN/.lock``, held for the whole life of
``harness run`` (new and resumed) and by the commands that write into a run directory
(``harness eval``, ``report``, ``export``). The kernel drops it with the process that held it,
so the file a killed run leaves behind never blocks the next one; the holder's pid is written
inside only for the message a second process gets.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import CheckpointError, HarnessError

log = logging.getLogger(__name__)

__all__ = [
    "LOCK_FILE",
    "DiskSpaceError",
    "RunDirError",
    "RunLock",
    "RunLockedError",
    "check_checkpoint_files",
    "check_free_space",
    "check_writable_dir",
    "estimate_checkpoint_bytes",
    "is_out_of_space",
    "lock_run_dir",
    "locked_for_writing",
    "out_of_space_error",
    "run_dir_of",
]

LOCK_FILE = ".lock"
"""The lock file of a run directory (``RUN/.lock``)."""

CHECKPOINT_MARGIN = 1.25
"""Checkpoint size estimates are multiplied by this: file headers, JSON beside the arrays and
a replay's bookkeeping arrays (:func:`estimate_checkpoint_bytes`)."""

CHECKPOINT_OVERHEAD = 1 << 20
"""Bytes added to every checkpoint estimate: meta.json, runner.json, the ``latest`` pointer
and file-system blocks."""


class RunDirError(HarnessError):
    """Where a run or a command would write cannot be written: not a directory, read-only."""


class RunLockedError(HarnessError):
    """Another process holds the run directory's lock."""


class DiskSpaceError(HarnessError):
    """Too little free disk space for a checkpoint (before training, or an ENOSPC while one
    was written)."""


# ------------------------------------------------------------------------------------------
# The lock

_HELD: set[int] = set()
"""File descriptors of the locks this process holds: a forked child (an async vector env's
worker) closes its copies, so a lock never outlives the process that took it."""


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunLock:
    """The held lock of one run directory; :meth:`release` (or leaving the ``with`` block)
    gives it back. The file stays: removing it would race with a process about to lock it."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.discard(fd)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __del__(self) -> None:  # a Run dropped without train() ending it (a test, a notebook)
        self.release()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_dir(run_dir: Path, purpose: str) -> RunLock:
    """Take ``run_dir``'s lock for ``purpose`` (e.g. ``"harness run"``), or refuse naming the
    process that holds it. The lock is not waited for: a second writer is a mistake to
    report, not a turn to take."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise RunDirError(
            f"Cannot lock the run directory {run_dir} for {purpose}: {path} cannot be opened "
            f"({exc.strerror}). Check that the directory exists and is writable."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirError(f"Cannot lock {path} for {purpose}: {exc.strerror}.") from None
        raise RunLockedError(
            f"The run directory {run_dir} is in use by {holder}: {purpose} would write into it "
            f"at the same time. Wait until that process ends (or stop it), or work on a copy "
            f"(cp -r {run_dir} COPY). A process that died holds no lock."
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n{purpose}\n{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
    _HELD.add(fd)
    log.debug("locked %s for %s", run_dir, purpose)
    return RunLock(Path(run_dir), fd)


def _read_holder(fd: int) -> str:
    """``process PID (PURPOSE, since TIME)`` from the lock file of the holder."""
    try:
        lines = os.pread(fd, 4096, 0).decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    if not lines or not lines[0].strip().isdigit():
        return "another process (it has not written its pid yet)"
    what = ", ".join(part for part in (lines[1:2] + [f"since {t}" for t in lines[2:3]]) if part)
    return f"process {lines[0].strip()}" + (f" ({what})" if what else "")


def run_dir_of(path: Path) -> Path | None:
    """The run directory ``path`` is in or is (``RUN``, ``RUN/checkpoints/step_N``,
    ``RUN/best/checkpoints/step_N``, ``RUN/report.html``): the nearest of it and its few
    closest ancestors that holds a ``run.json``; None outside any run."""
    here = Path(os.path.abspath(path))
    for candidate in [here, *here.parents][:5]:
        if (candidate / "run.json").is_file():
            return candidate
    return None


@contextlib.contextmanager
def locked_for_writing(run_dir: Path | None, purpose: str) -> Iterator[RunLock | None]:
    """``run_dir``'s lock while a command writes into it (``harness eval``'s
    evaluations.jsonl, ``harness report``'s page); None (nothing locked) for no directory or
    one this process cannot write (a read-only copy: the command writes nothing there)."""
    if run_dir is None or not os.access(run_dir, os.W_OK) or not Path(run_dir).is_dir():
        yield None
        return
    try:
        lock = lock_run_dir(Path(run_dir), purpose)
    except RunDirError as exc:  # (not a RunLockedError): e.g. a read-only mount
        log.debug("%s is not locked: %s", run_dir, exc)
        yield None
        return
    with lock:
        yield lock


# ------------------------------------------------------------------------------------------
# Where files go


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what ``mkdir -p`` would create in)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: Path, what: str) -> None:
    """Refuse ``path`` as a directory to write into unless it is one (or can be made: its
    nearest existing ancestor is a writable directory) and files can be created in it. The
    test is a real temporary file, so read-only mounts and root's permissions count too."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(
            f"{what} {path} is a file, not a directory. Give a directory (it is created if "
            f"missing), or move the file away."
        )
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise RunDirError(
            f"{what} {path} cannot be created: {base} is a file, not a directory. Give a path "
            f"under a directory."
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".harness-write-test-", dir=base)
    except OSError as exc:
        raise RunDirError(
            f"{what} {path} is not writable: {base} refuses new files ({exc.strerror}). Give "
            f"a directory you can write to, or change its permissions."
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_free_space(path: Path, needed: int, what: str) -> None:
    """Refuse to start when the file system of ``path`` has less than ``needed`` bytes free
    (a run that would train for hours and then fail to write its checkpoint)."""
    free = shutil.disk_usage(_existing_ancestor(Path(path))).free
    if free < needed:
        raise DiskSpaceError(
            f"{what} {path} has {_size(free)} free, but a checkpoint of this run needs about "
            f"{_size(needed)}: the run would train and then fail to write it. Free some "
            f"space, or give another directory (--out DIR)."
        )


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # (unreachable)


# ------------------------------------------------------------------------------------------
# How big a checkpoint is


def _nbytes(tree: Any, seen: set[int] | None = None) -> int:
    """Bytes of the arrays in a nest of dicts, lists and tuples: numpy arrays and framework
    tensors alike (``nbytes``, else ``numel() * element_size()``)."""
    seen = set() if seen is None else seen
    if id(tree) in seen:
        return 0
    seen.add(id(tree))
    if isinstance(tree, Mapping):
        return sum(_nbytes(v, seen) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_nbytes(v, seen) for v in tree)
    size = getattr(tree, "nbytes", None)
    if isinstance(size, int | np.integer):
        return int(size)
    try:
        return int(tree.numel()) * int(tree.element_size())
    except Exception:  # a plain value (a counter, a string): bytes of JSON, in the overhead
        return 0


def _preallocated_nbytes(obj: Any) -> int:
    """The storage a replay memory holds (``capacity`` rows of each array): what its
    checkpoint holds once it is full, though it holds only the rows written so far now."""
    capacity = getattr(obj, "capacity", None)
    if not isinstance(capacity, int) or capacity <= 0:
        return 0
    arrays = [v for v in vars(obj).values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays if a.ndim and a.shape[0] == capacity)


def estimate_checkpoint_bytes(agent: Any) -> int:
    """About how many bytes one checkpoint of ``agent`` takes on disk, at its largest: the
    models' state three times (Adam keeps two moments per weight, made at the first update),
    the data state or, where the agent keeps a replay memory, that memory full; times
    :data:`CHECKPOINT_MARGIN`, plus :data:`CHECKPOINT_OVERHEAD`. An agent may answer itself
    with a ``checkpoint_nbytes()`` method."""
    own = getattr(agent, "checkpoint_nbytes", None)
    if callable(own):
        return int(own())
    models = _nbytes(agent.algorithm.state())
    # a replay memory's data_state() copies what it holds (gigabytes, once resumed): its
    # preallocated storage says the same without a copy
    full = sum(_preallocated_nbytes(v) for v in getattr(agent, "__dict__", {}).values())
    data = full or _nbytes(agent.data_state())
    return int((3 * models + data) * CHECKPOINT_MARGIN) + CHECKPOINT_OVERHEAD


# ------------------------------------------------------------------------------------------
# Checkpoints a command is about to load


def check_checkpoint_files(ckpt: Path) -> None:
    """Refuse a checkpoint directory whose files cannot all be whole: no agent file
    (``agent.*``), or an empty file (a copy cut short, a disk that filled). Cheap, and made
    before anything is loaded or written; a damaged file of the right size is found by its
    loader."""
    ckpt = Path(ckpt)
    agents = sorted(ckpt.glob("agent*"))
    if not agents:
        raise CheckpointError(
            f"Checkpoint {ckpt} has no agent file (agent.*): it is incomplete. Use another "
            f"checkpoint of the run (its checkpoints/step_* directories)."
        )
    empty = sorted(
        str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.stat().st_size == 0
    )
    if empty:
        raise CheckpointError(
            f"Checkpoint {ckpt} is damaged: {', '.join(empty)} "
            f"{'is' if len(empty) == 1 else 'are'} empty (a copy cut short, or a full disk). "
            f"Use another checkpoint of the run (its checkpoints/step_* directories)."
        )


# ------------------------------------------------------------------------------------------
# A checkpoint the disk had no room for


def is_out_of_space(exc: BaseException, directory: Path, needed: int) -> bool:
    """Whether ``exc`` (raised while a checkpoint was written into ``directory``) is a full
    disk: an ENOSPC/EDQUOT anywhere in its chain, or any write error while less than
    ``needed`` bytes are free (torch reports a full disk as "basic_ios::clear: iostream
    error", naming no errno)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    if not isinstance(exc, OSError | RuntimeError):
        return False
    try:
        return shutil.disk_usage(_existing_ancestor(directory)).free < needed
    except OSError:
        return False


def out_of_space_error(
    run_dir: Path, directory: Path, needed: int, step: int, kept: Path | None
) -> DiskSpaceError:
    """The error of run ``run_dir``'s checkpoint at ``step`` that did not fit into
    ``directory``; ``kept``: the newest checkpoint still there."""
    try:
        free = _size(shutil.disk_usage(_existing_ancestor(directory)).free)
    except OSError:
        free = "unknown"
    last = (
        f"The last good checkpoint, {kept}, is kept"
        if kept is not None
        else "No earlier checkpoint was written"
    )
    return DiskSpaceError(
        f"The disk is full: the checkpoint at step {step} could not be written to {directory} "
        f"({free} free, a checkpoint needs about {_size(needed)}); its partial copy was "
        f"removed. {last}. Free some space, then continue with "
        f"`harness run --resume {run_dir}`."
    )
