"""Atomic checkpoints: a checkpoint directory appears whole or not at all.

Everything is written into ``step_XXXXXXXXXX.tmp-PID`` first, flushed, then renamed to its
final name; the ``latest`` pointer file is replaced the same way. A crash at any point leaves
the previous checkpoint and pointer intact, and stray temp directories are ignored (and removed
by the next successful write).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.errors import CheckpointError

log = logging.getLogger(__name__)

META_FILE = "meta.json"
LATEST = "latest"


def write_atomic_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file + fsync + rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    meta: Mapping[str, Any],
    write: Callable[[Path], None],
    keep: int = 3,
) -> Path:
    """Create ``ckpt_root/step_{step}`` atomically; ``write(tmp_dir)`` fills it.

    Keeps the newest ``keep`` checkpoints and returns the final directory.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:010d}"
    tmp = ckpt_root / f"{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        write_atomic_text(tmp / META_FILE, json.dumps({**meta, "step": step}, indent=2))
        _fsync_tree(tmp)
        if final.exists():  # re-checkpointing the same step (e.g. after resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic_text(ckpt_root / LATEST, final.name + "\n")
    _prune(ckpt_root, keep)
    return final


def _prune(ckpt_root: Path, keep: int) -> None:
    done = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and ".tmp-" not in p.name)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stray in ckpt_root.glob("step_*.tmp-*"):
        shutil.rmtree(stray, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of a run directory (or a checkpoint directory itself)."""
    run_dir = Path(run_dir)
    if (run_dir / META_FILE).is_file():
        return run_dir
    root = run_dir / "checkpoints"
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text(encoding="utf-8").strip()
        if (candidate / META_FILE).is_file():
            return candidate
    complete = sorted(p for p in root.glob("step_*") if (p / META_FILE).is_file())
    if complete:
        return complete[-1]
    if not run_dir.exists():
        raise CheckpointError(f"{run_dir} does not exist. Pass a run directory or checkpoint.")
    raise CheckpointError(
        f"{run_dir} holds no complete checkpoint (no checkpoints/step_*/meta.json). Pass a run "
        f"directory written by `harness run`, or a checkpoint directory inside it."
    )


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads((ckpt / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Checkpoint {ckpt} has an unreadable {META_FILE}: {exc}.") from None
    return meta
