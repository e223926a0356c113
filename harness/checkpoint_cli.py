"""``harness checkpoint convert RUN --trust``: the one-time conversion of checkpoints written by
an earlier harness version (``torch.save``/``paddle.save`` pickles) into the current format
(:mod:`harness.safestate`: arrays + JSON, which cannot carry code).

It is the only harness command that unpickles, and only with ``--trust``: a pickle runs
whatever code its writer put in it. Every other command refuses such a checkpoint with a
message naming this one. The framework work is the backend's (its ``load_legacy(path)`` reads
the old file, its ``save`` writes the new one); this module finds the files and replaces each
atomically (a temp file beside it, fsync, rename), so a crash leaves every file either old or
new, never half-written.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from harness.checkpoint import META_FILE, read_meta
from harness.errors import CheckpointError, HarnessError
from harness.rundir import locked_for_writing, run_dir_of
from harness.safestate import is_state_file

__all__ = ["DESCRIPTION", "add_arguments", "checkpoints_of", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = """\
Convert the checkpoints of a run directory (every checkpoints/step_* and best/checkpoints/
step_*), or one checkpoint directory, written by an earlier harness version into the current
format, in place: agent.<backend> becomes arrays + JSON, which cannot carry code.

RISK: the old files are pickles (torch.save / paddle.save). Loading a pickle runs whatever
code its writer put in it, as you, on this machine. This is the one harness command that
unpickles, and it does so only with --trust: pass it only for runs that you, or someone you
trust, wrote. Every other command (eval, run --resume, export, report, collect) refuses an
old checkpoint instead of loading it. Files already in the current format are left alone."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["convert"], help="what to do (convert)")
    parser.add_argument("source", type=Path, help="a run directory or a checkpoint directory")
    parser.add_argument(
        "--trust",
        action="store_true",
        help="unpickle the old files (runs any code in them): only for runs you trust",
    )


def checkpoints_of(source: Path) -> list[Path]:
    """The complete checkpoint directories of a run directory (incl. ``best/``), or
    ``[source]`` for a checkpoint directory."""
    if not source.exists():
        raise CheckpointError(f"{source} does not exist. Pass a run directory or checkpoint.")
    if (source / META_FILE).is_file():
        return [source]
    found = [
        p
        for root in (source / "checkpoints", source / "best" / "checkpoints")
        for p in sorted(root.glob("step_*"))
        if ".tmp-" not in p.name and (p / META_FILE).is_file()
    ]
    if not found:
        raise CheckpointError(
            f"{source} holds no complete checkpoint (no checkpoints/step_*/meta.json). Pass a "
            f"run directory written by `harness run`, or a checkpoint directory inside it."
        )
    return found


def _legacy_files(checkpoints: list[Path]) -> list[tuple[Path, str]]:
    """(agent file, backend name) of each checkpoint whose agent file is not yet converted."""
    todo = []
    for ckpt in checkpoints:
        backend = read_meta(ckpt).get("backend")
        if not isinstance(backend, str):
            raise CheckpointError(f"{ckpt}/{META_FILE} names no backend; it cannot be converted.")
        path = ckpt / f"agent.{backend}"
        if not path.is_file():
            raise CheckpointError(f"{ckpt} has no {path.name}; it cannot be converted.")
        if not is_state_file(path):
            todo.append((path, backend))
    return todo


def _backend(name: str, registry: Any) -> Any:
    spec = registry.backends.get(name)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    # on the CPU: conversion needs no accelerator, and the file records each tensor's device
    backend = spec.load(spec.config_cls(device="cpu") if "device" in fields else None)
    if not callable(getattr(backend, "load_legacy", None)):
        raise CheckpointError(
            f"Backend {name!r} cannot read checkpoints of earlier versions (it has no "
            f"load_legacy); these checkpoints cannot be converted."
        )
    return backend


def convert_file(path: Path, backend: Any) -> None:
    """Replace the legacy ``path`` by the same payload in the current format, atomically."""
    try:
        payload = backend.load_legacy(path)
    except Exception as exc:  # any unpickling failure: a corrupt or foreign file
        raise CheckpointError(
            f"{path} cannot be read as an earlier harness checkpoint ({type(exc).__name__}: "
            f"{exc}); it was not converted."
        ) from None
    tmp = path.with_name(f".{path.name}.convert-{os.getpid()}")
    try:
        backend.save(payload, tmp)
        backend.load(tmp)  # it reads back before it replaces the original
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from harness.commands import plugins_for  # deferred: the plugin registry only here

    source = Path(args.source)
    todo = _legacy_files(checkpoints_of(source))
    if not todo:
        print(f"{source}: every checkpoint is already in the current format; nothing to do.")
        return 0
    if not args.trust:
        raise HarnessError(
            f"{source} has {len(todo)} checkpoint file(s) of an earlier harness version (e.g. "
            f"{todo[0][0]}). They are pickles: converting them runs any code their writer put "
            f"in them, as you, on this machine. If you wrote this run or trust whoever did, "
            f"run `harness checkpoint convert {source} --trust`; otherwise retrain, or ask its "
            f"author for a run written by this harness version. Nothing was changed."
        )
    _, registry = plugins_for(args)
    backends: dict[str, Any] = {}
    # the run's lock: no other harness process reads or writes these files meanwhile
    with locked_for_writing(run_dir_of(source), "harness checkpoint convert"):
        for path, name in todo:
            if name not in backends:
                backends[name] = _backend(name, registry)
            convert_file(path, backends[name])
            log.info("converted %s", path)
            print(f"converted {path}")
    print(f"{len(todo)} checkpoint file(s) converted; they load without unpickling now.")
    return 0
