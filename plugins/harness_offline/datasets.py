"""Minari datasets on local disk: finding, opening and checking them, and turning their episodes
into transitions for the offline algorithms.

A dataset is a directory named by its Minari id (``NAME-vN``) holding ``data/metadata.json``
and ``data/main_data.hdf5`` (Minari's HDF5 storage): what ``harness collect --out`` writes and
``minari.load_dataset`` reads under ``MINARI_DATASETS_PATH``. Minari is imported only inside
functions, so importing this module costs nothing.

Bad input is refused before training, naming the file: a dataset that is not there, one whose
files are missing or unreadable, one that holds no transitions, and one whose spaces do not
fit the env (both spaces printed).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from harness.api import EnvInfo, SpaceInfo
from harness.errors import ConfigError, IncompatibleError, PluginError

HOW_TO_MAKE = (
    "record one with `harness collect RUN_DIR --episodes N --out PATH` (a trained run's "
    "policy) or `harness collect PACK --policy random --episodes N --out PATH`"
)
METADATA = "metadata.json"
MAIN_FILE = "main_data.hdf5"
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AssertionError)
"""What Minari and h5py raise on a damaged dataset."""


class Transitions(NamedTuple):
    """Every transition of one or more datasets, one row each (episodes concatenated)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    episode_returns: np.ndarray
    """The return of each episode (the behaviour policy's)."""


def import_minari() -> Any:
    try:
        import minari
    except ImportError as exc:
        raise PluginError(
            f"Minari datasets need the minari package ({exc}). Install it with "
            f"pip install 'harness[offline]'."
        ) from None
    return minari


def default_root() -> Path:
    """Minari's local dataset directory: MINARI_DATASETS_PATH, else ~/.minari/datasets."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path.home() / ".minari" / "datasets"


@contextlib.contextmanager
def minari_root(root: Path) -> Iterator[None]:
    """Minari's dataset directory set to ``root`` for the calls inside (Minari reads
    MINARI_DATASETS_PATH at every call); the previous value is restored after."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if before is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def find_dataset(ref: str, root: str = "") -> Path:
    """The dataset directory (the one holding ``data/``) that ``ref`` names: a path, or a
    dataset id under ``root`` (default :func:`default_root`)."""
    path = Path(ref).expanduser()
    if path.exists():
        if path.name == "data" and (path / METADATA).exists():
            return path.parent  # (the data directory itself)
        return path
    base = Path(root).expanduser() if root else default_root()
    if (base / ref).exists():
        return base / ref
    where = "algo.dataset_root" if root else "MINARI_DATASETS_PATH, else ~/.minari/datasets"
    raise ConfigError(
        f"Dataset {ref!r} not found: there is no directory {path.absolute()} and no Minari "
        f"dataset {ref!r} under {base} ({where}). Check algo.dataset, or {HOW_TO_MAKE}."
    )


def open_dataset(directory: Path) -> Any:
    """``minari.MinariDataset`` of a dataset directory; a clear error naming the missing or
    damaged file otherwise."""
    data = directory / "data"
    meta = data / METADATA
    if not meta.is_file():
        raise ConfigError(
            f"{directory} is not a Minari dataset: {meta} is missing. Point algo.dataset at a "
            f"directory written by `harness collect`, or {HOW_TO_MAKE}."
        )
    try:
        raw = json.loads(meta.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"it holds {type(raw).__name__}, not a table")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Dataset file {meta} is corrupt ({exc}). Delete {directory} and {HOW_TO_MAKE}."
        ) from None
    missing = [k for k in ("observation_space", "action_space") if not isinstance(raw.get(k), str)]
    if missing:
        # Minari would rebuild the env from the file's env_spec (gym.make imports and calls
        # its entry point: code named by the dataset would run here); harness never does
        raise ConfigError(
            f"Dataset file {meta} has no {' and no '.join(missing)}. harness reads a dataset's "
            f"spaces from its metadata and never builds the env its env_spec names (that "
            f"would run code the file chooses). Delete {directory} and {HOW_TO_MAKE}."
        )
    if raw.get("data_format", "hdf5") == "hdf5" and not (data / MAIN_FILE).is_file():
        raise ConfigError(
            f"Dataset file {data / MAIN_FILE} is missing. Delete {directory} and {HOW_TO_MAKE}."
        )
    minari = import_minari()
    try:
        return minari.MinariDataset(data)
    except READ_ERRORS as exc:
        raise ConfigError(
            f"Dataset {directory} cannot be read ({type(exc).__name__}: {exc}); {meta} may be "
            f"damaged. Delete {directory} and {HOW_TO_MAKE}."
        ) from None


def render(space: SpaceInfo) -> str:
    """A space as gymnasium prints one: ``Box(low, high, shape, dtype)``, ``Discrete(n)``."""
    if space.kind == "discrete":
        return f"Discrete({space.n})"
    low = np.asarray(space.low, np.float64).reshape(space.shape).astype(space.dtype)
    high = np.asarray(space.high, np.float64).reshape(space.shape).astype(space.dtype)
    return f"Box({low}, {high}, {space.shape}, {space.dtype})"


def same_space(a: SpaceInfo, b: SpaceInfo) -> bool:
    """Same kind, shape, size and bounds (dtypes may differ: values are converted)."""
    if (a.kind, tuple(a.shape), a.n) != (b.kind, tuple(b.shape), b.n):
        return False
    if a.kind == "discrete":
        return True
    return bool(
        np.allclose(a.low, b.low, rtol=1e-6, atol=0.0, equal_nan=True)
        and np.allclose(a.high, b.high, rtol=1e-6, atol=0.0, equal_nan=True)
    )


def check_spaces(dataset: Any, directory: Path, info: EnvInfo, algo: str) -> None:
    """Refuse a dataset whose observation or action space differs from the env's, printing
    both (the dataset's as Minari stores it, the env's as harness sees it)."""
    from harness.runtime import space_info

    rows, bad = [], []
    for what, theirs, ours in (
        ("observation", dataset.observation_space, info.observation),
        ("action", dataset.action_space, info.action),
    ):
        try:
            fits = same_space(space_info(theirs), ours)
        except IncompatibleError:
            fits = False
        rows.append(f"  dataset {what} space: {theirs}\n  env {what} space:     {render(ours)}")
        if not fits:
            bad.append(what)
    if bad:
        recorded = getattr(dataset, "env_spec", None)
        hint = f" ({recorded.id!r}: set run.env)" if recorded is not None else " (run.env)"
        raise IncompatibleError(
            f"Dataset {directory} does not fit env {info.env_id!r} of this run: its "
            f"{' and '.join(bad)} space{'s differ' if len(bad) > 1 else ' differs'}.\n"
            + "\n".join(rows)
            + f"\nTrain {algo} in the env the dataset was recorded in{hint}, or "
            f"{HOW_TO_MAKE} in {info.env_id!r}."
        )


def read_episodes(dataset: Any, directory: Path) -> list[Any]:
    """Every episode of ``dataset`` (a damaged data file is named)."""
    try:
        return list(dataset.iterate_episodes())
    except READ_ERRORS as exc:
        raise ConfigError(
            f"Dataset file {directory / 'data' / MAIN_FILE} is corrupt ({type(exc).__name__}: "
            f"{exc}). Delete {directory} and {HOW_TO_MAKE}."
        ) from None


def load_transitions(refs: Sequence[str], *, root: str, info: EnvInfo, algo: str) -> Transitions:
    """The transitions of every dataset in ``refs`` (paths or ids under ``root``), checked
    against the env ``info`` describes."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in Transitions._fields}
    for ref in refs:
        directory = find_dataset(ref, root)
        dataset = open_dataset(directory)
        check_spaces(dataset, directory, info, algo)
        for episode in read_episodes(dataset, directory):
            observations = np.asarray(episode.observations, np.float32)
            steps = len(episode.rewards)
            parts["obs"].append(observations[:steps])
            parts["next_obs"].append(observations[1 : steps + 1])
            parts["actions"].append(np.asarray(episode.actions))
            parts["rewards"].append(np.asarray(episode.rewards, np.float32))
            parts["terminated"].append(np.asarray(episode.terminations, np.float32))
            parts["episode_returns"].append(np.array([np.sum(episode.rewards)]))
    if not parts["rewards"] or sum(len(r) for r in parts["rewards"]) == 0:
        raise ConfigError(
            f"Dataset {', '.join(map(str, refs))} holds no transitions. {HOW_TO_MAKE[0].upper()}"
            f"{HOW_TO_MAKE[1:]} with --episodes N > 0."
        )
    return Transitions(**{k: np.concatenate(v) for k, v in parts.items()})
