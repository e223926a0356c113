"""Dataclass configs: the source of truth. Pack files (TOML/YAML) are a serialized view.

Layering, lowest first: dataclass defaults < ``HARNESS_BACKEND`` < pack file < user file
(``--config``) < ``--set section.key=value``. A pack file has sections: ``[run]`` (this module's
:class:`RunConfig`), ``[algo]`` (the selected algorithm's config dataclass), ``[env]`` and
``[backend]`` (the selected plugins' option dataclasses), and ``[tune]`` (kept raw for the
``harness tune`` plugin, never passed to training). Unknown keys, wrong types and unknown
plugins fail at start-up naming the file, the key and a suggestion.

Each field's documentation is the string literal under it (CleanRL style); :func:`field_docs`
reads it so ``--help`` and the docs show the same words.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import logging
import math
import os
import re
import textwrap
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, PluginError, did_you_mean
from harness.registry import Registry

log = logging.getLogger(__name__)

SECTIONS = ("run", "algo", "env", "backend")
RAW_SECTIONS = ("tune",)
"""Sections the core reads but keeps raw for a plugin (``[tune]``: the search space of
``harness tune``): never validated here and never passed to training."""
PACK_FILE_NAMES = ("pack.toml", "pack.yaml", "pack.yml")


@dataclass
class RunConfig:
    """What to train, for how long, and where results go."""

    algo: str = "ppo"
    """Algorithm plugin name (see `harness plugins`)."""
    env: str = "CartPole-v1"
    """Environment id; the first env plugin that accepts it builds it."""
    backend: str = "torch"
    """NN backend plugin name; the HARNESS_BACKEND environment variable overrides the default."""
    seed: int = 1
    """Seed for the envs, the agent and the backend (0 or more); runs with the same seed
    repeat. Each draws from its own stream of it (harness.seeds)."""
    total_steps: int = 100_000
    """Environment steps to train for (summed over vectorized envs); at least 1."""
    num_envs: int = 8
    """Number of vectorized environments stepped together; at least 1."""
    vector: str = "sync"
    """Vector env mode: 'sync' (one process) or 'async' (one subprocess per env)."""
    eval_every: int = 10_000
    """Env steps between greedy evaluations; 0 disables periodic evaluation."""
    eval_episodes: int = 20
    """Episodes per evaluation; 0 turns evaluation off (also the final one)."""
    stop_at_return: float | None = None
    """Stop early once an evaluation's mean return reaches this value and a confirming one
    on other episodes (other env seeds, ``eval/confirm_mean_return``) does too."""
    keep_best: bool = False
    """Also keep the checkpoint of the best periodic evaluation so far in ``RUN_DIR/best``
    (``harness eval RUN_DIR/best`` evaluates it): the policy the run's own evaluations
    selected, where the last one may have degraded since (DQN-family runs often do)."""
    checkpoint_every: int = 25_000
    """Env steps between checkpoints (one is always written at the end); 0: only that one."""
    trackers: list[str] = field(default_factory=lambda: ["csv", "tensorboard"])
    """Tracker plugins receiving metrics. Of the default list, ones not installed are skipped
    silently; a tracker you name must be installed (else exit 2 naming the extra)."""
    out: str = "runs"
    """Parent directory of run directories."""
    name: str = ""
    """Run directory name; default {env}__{algo}__{seed}__{unix time}."""
    progress: bool = True
    """Show progress on stderr: a live bar on a terminal, else plain lines every
    run.progress_every_s seconds; false (--no-progress) turns both off."""
    progress_every_s: float = 30.0
    """Seconds between the plain progress lines printed when stderr is not a terminal (nohup,
    a batch scheduler, CI): step/total, steps/s, episodes, recent return, the pack's score,
    last eval, elapsed time and ETA; 0 turns them off."""
    log_every: int = 2_000
    """Env steps between metric rows written to trackers; 0: a row every iteration."""
    max_seconds: float = 0.0
    """Stop training after this many seconds of wall-clock (0: no limit); the run still ends
    with an evaluation and a checkpoint."""
    actors: int = 0
    """Remote actor processes stepping the envs (num_envs is split evenly across them); 0 runs
    the envs in this process; -1: one per core of this machine (num_envs is raised to at
    least that)."""
    max_actors: int = 0
    """The most actor processes an embedded local farm (run.cluster empty) may start; 0: as
    many as this machine's available memory holds, estimated per actor (a larger run.actors is
    refused before any actor starts). Set it to start more actors than that estimate allows
    (or to cap run.actors)."""
    cluster: str = ""
    """Cluster address for the actors (tcp://HOST:PORT of `harness cluster start`; with
    transport = 'ray' a Ray address, HOST:PORT or ray://HOST:PORT); empty starts an embedded
    local farm on this machine (with 'ray': RAY_ADDRESS, else a local Ray)."""
    cluster_keys: str = ""
    """CURVE key directory of the cluster (`harness cluster keys DIR`); empty: the keys this
    host recorded for the cluster's address when `harness cluster start` made them."""
    transport: str = "zmq"
    """Transport plugin that runs the actors: 'zmq' (the ZeroMQ farm) or 'ray' (Ray actors,
    pip install 'harness[ray]')."""
    max_policy_lag: int = 1
    """Rollouts an actor of an off-policy algorithm may run ahead of the learner's weights
    (on-policy algorithms always wait for the newest weights). Agents with independent
    transitions (DQN) stream: this many requests stay queued at each actor, and a rollout's
    weights are older by as many versions as the other actors delivered iterations in the
    meantime: usually one or two, more while an actor is starved of CPU (the learner does not
    wait for it; ``farm/policy_lag_max`` reports it)."""
    actor_memory_mb: int = 0
    """Address-space limit per actor process in MiB; 0 means no limit."""
    inference: str = "actor"
    """Where a farm's actions are computed (run.actors > 0): 'actor' (each actor runs its own
    copy of the policy on its own envs' observations), 'central' (actors only step envs; a
    policy server in the learner process runs one batched forward over the observations of
    every waiting actor, exchanged through shared memory: an embedded local farm, agents
    without per-env acting state), or 'auto' (central from 128 actors on, else per actor; the
    choice is logged). See docs/distributed.md."""
    inference_device: str = "learner"
    """Central inference: where the policy server's forward runs. 'learner' (default): on the
    learner's backend device, i.e. the GPU where the learner has one ([backend] device =
    'auto' or 'cuda'), in float32 (AMP off); 'cpu': on the CPU, as per-actor actors act.
    Networks the backend runs through the framework (CNNs) move; MLP policies act through
    numpy copies on the CPU either way (faster at these sizes). See docs/distributed.md."""
    inference_wait_ms: float = 0.0
    """Central inference: how long the policy server waits, once a request arrived, for more
    actors' requests before it runs the batch (0: it serves whoever is waiting at once).
    Bigger batches cost less CPU per row; each step waits up to this much longer. See
    docs/distributed.md for where it pays."""
    init_from: str = ""
    """A checkpoint (or a run directory: its newest) whose networks and optimisers this run
    starts from, on the same env and backend; counters, replay and schedules start fresh. It
    may come from another algorithm that shares the networks: pretrain offline with ``cql`` on
    recorded demonstrations, then fine-tune online with ``sac`` (docs/offline.md). Ignored by
    --resume, which restores everything."""


@dataclass
class Config:
    """A resolved configuration: one dataclass instance per section."""

    run: RunConfig
    algo: Any
    env: Any = None
    backend: Any = None
    sources: dict[str, str] = field(default_factory=dict)
    """Where each 'section.key' was last set (file path or '--set'), for error messages."""
    tune: dict[str, Any] = field(default_factory=dict)
    """The raw ``[tune]`` section (search space for ``harness tune``); not part of training
    and not written into the run directory's config.toml."""

    def to_dict(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for section in SECTIONS:
            value = getattr(self, section)
            if value is not None:
                out[section] = dataclasses.asdict(value)
        return out


# ------------------------------------------------------------------------------------------
# Documentation from attribute docstrings


def field_docs(cls: type[Any]) -> dict[str, str]:
    hashable: Any = cls
    return dict(_field_docs(hashable))


@cache
def _field_docs(cls: Any) -> dict[str, str]:
    """``{field: docstring}`` from the string literal under each annotated attribute."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))  # type: ignore[arg-type]
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        stmts = body.body
        for node, nxt in itertools.pairwise(stmts):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe(cls: type[Any], prefix: str = "") -> list[tuple[str, str, str]]:
    """``(key, default, doc)`` rows for ``--help`` and docs."""
    docs = field_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        rows.append((prefix + f.name, default, docs.get(f.name, "")))
    return rows


# ------------------------------------------------------------------------------------------
# Reading files and overrides


def find_pack_file(path: str | os.PathLike[str]) -> Path:
    """A pack directory (holding pack.toml/yaml) or a file path -> the pack file."""
    p = Path(path)
    if p.is_dir():
        for name in PACK_FILE_NAMES:
            if (p / name).is_file():
                return p / name
        raise ConfigError(
            f"{p} is a directory without a pack file. Put the config in {p / 'pack.toml'} "
            f"(sections [run], [algo], [env], [backend])."
        )
    if p.is_file():
        return p
    raise ConfigError(
        f"Pack {str(path)!r} does not exist. Pass a pack directory (e.g. competitions/cartpole), "
        f"a .toml/.yaml file, or a registered competition name (see `harness plugins`)."
    )


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse TOML or YAML into a dict, with the file and line in any syntax error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc.strerror}.") from None
    try:
        if path.suffix in {".yaml", ".yml"}:
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except Exception as exc:  # tomllib/yaml errors carry the line number in their text
        raise ConfigError(
            f"Malformed config file {path}: {exc}. Fix the syntax at that position "
            f"(TOML: key = value under [section] headers)."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a table of sections, not {data!r}.")
    known = (*SECTIONS, *RAW_SECTIONS)
    for key, value in data.items():
        if key not in known:
            raise ConfigError(
                f"{path}: unknown section [{key}].{did_you_mean(key, known)} "
                f"Sections are: {', '.join(known)}."
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [{key}] must be a table of key = value pairs.")
    return data


def parse_override(text: str) -> tuple[str, str, Any]:
    """``'algo.learning_rate=3e-4'`` -> ``('algo', 'learning_rate', 0.0003)``.

    A bare key means ``run.KEY``. Values are parsed as TOML literals (numbers, booleans, lists,
    quoted strings); anything else is taken as a plain string.
    """
    if "=" not in text:
        raise ConfigError(
            f"--set {text!r} is not KEY=VALUE. Example: --set algo.learning_rate=3e-4"
        )
    key, raw = text.split("=", 1)
    key = key.strip()
    section, _, name = key.rpartition(".")
    section = section or "run"
    if section not in SECTIONS or not name:
        raise ConfigError(
            f"--set {text!r}: {key!r} is not SECTION.KEY with a section in "
            f"{', '.join(SECTIONS)}.{did_you_mean(section, SECTIONS)}"
        )
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, name, value


# ------------------------------------------------------------------------------------------
# Validation


def build_dataclass(
    cls: type[Any],
    values: Mapping[str, Any],
    where: Mapping[str, str],
    section: str,
    owner: str,
    *,
    owners_of: Callable[[str], list[str]] | None = None,
) -> Any:
    """Instantiate ``cls`` from ``values``, checking every key and type.

    ``where`` maps a key to the file (or '--set') it came from; ``owner`` names what the section
    configures (e.g. "algorithm 'ppo'") for the error message; ``owners_of(key)`` names the
    other plugins whose section has an unknown key (``algo.recurrent`` on an algorithm without
    it names the algorithms that have it).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        origin = where.get(key, "config")
        if key not in names:
            others = owners_of(key) if owners_of is not None else []
            where_else = (
                f" It is an option of {', '.join(map(repr, others))}: choose one of them, or "
                f"remove {section}.{key}."
                if others
                else did_you_mean(key, names)
            )
            raise ConfigError(
                f"{origin}: [{section}] key {key!r} is not an option of {owner}.{where_else} "
                "See `harness run --help` for every key."
            )
        try:
            kwargs[key] = coerce(value, hints[key])
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{origin}: [{section}] {key} = {value!r} has the wrong type: expected "
                f"{type_name(hints[key])} ({exc})."
            ) from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{section}] for {owner}: {exc}") from None


INFERENCE_CHOICES: tuple[str, ...] = ("actor", "central", "auto")
"""Values of ``run.inference`` (see :class:`RunConfig`)."""

INFERENCE_DEVICE_CHOICES: tuple[str, ...] = ("learner", "cpu")
"""Values of ``run.inference_device`` (see :class:`RunConfig`)."""

RUN_LOWER_BOUNDS: tuple[tuple[str, int, str], ...] = (
    ("total_steps", 1, "Give the env steps to train for, e.g. --steps 100000."),
    ("num_envs", 1, "Give the envs stepped together, e.g. --set run.num_envs=8."),
    ("seed", 0, "Use a seed of 0 or more, e.g. --seed 1."),
    ("eval_every", 0, "0 turns periodic evaluation off."),
    ("eval_episodes", 0, "0 turns evaluation off."),
    ("checkpoint_every", 0, "0 writes only the final checkpoint."),
    ("log_every", 0, "0 writes a metrics row every iteration."),
    ("max_seconds", 0, "0 means no time limit."),
    ("progress_every_s", 0, "0 turns the plain progress lines off."),
    ("actors", -1, "0 runs the envs in this process; -1 starts one actor per core."),
    ("max_actors", 0, "0 sizes the limit from this machine's available memory."),
    ("max_policy_lag", 0, "0 makes every actor wait for the newest weights."),
    ("actor_memory_mb", 0, "0 means no limit."),
    ("inference_wait_ms", 0, "0 serves the waiting actors at once."),
)
"""``(key, smallest value, how to fix it)`` for every number of :class:`RunConfig`."""


def check_run(run: RunConfig, where: Mapping[str, str]) -> None:
    """Refuse [run] numbers out of range (a negative budget would otherwise train, a zero
    num_envs fail deep inside an env plugin), naming where each was set and the fix."""
    for key, low, fix in RUN_LOWER_BOUNDS:
        value = getattr(run, key)
        if value != value or value < low:  # (value != value: NaN)
            raise ConfigError(
                f"{where.get(key, 'config')}: run.{key} = {value!r} is out of range: it must "
                f"be {low} or more. {fix}"
            )
    if run.inference not in INFERENCE_CHOICES:
        raise ConfigError(
            f"{where.get('inference', 'config')}: run.inference = {run.inference!r} is not a "
            f"choice.{did_you_mean(run.inference, INFERENCE_CHOICES)} Use 'actor' (each actor "
            "acts with its own copy of the policy), 'central' (one batched policy server for "
            "the farm) or 'auto'."
        )
    if run.inference_device not in INFERENCE_DEVICE_CHOICES:
        raise ConfigError(
            f"{where.get('inference_device', 'config')}: run.inference_device = "
            f"{run.inference_device!r} is not a choice."
            f"{did_you_mean(run.inference_device, INFERENCE_DEVICE_CHOICES)} Use 'learner' "
            "(the policy server acts on the learner's device: its GPU where it has one) or "
            "'cpu'; a GPU is chosen for the learner with [backend] device."
        )
    if run.stop_at_return is not None and run.stop_at_return != run.stop_at_return:
        raise ConfigError(
            f"{where.get('stop_at_return', 'config')}: run.stop_at_return is NaN, which no "
            f"return reaches. Give a number, or leave it out to never stop early."
        )


_LEARNING_RATE = re.compile(r"(^|_)(lr|learning_rate)($|_)")
"""Field names of learning rates (``learning_rate``, ``vf_learning_rate``, ``lr_actor``)."""

_LAYER_WIDTHS = re.compile(r"(^|_)hidden$")
"""Field names of layer widths (``hidden = [64, 64]``, ``rnn_hidden = 64``)."""


def is_learning_rate(key: str) -> bool:
    """Whether the option ``key`` (``learning_rate``, ``algo.lr_actor``) names a learning
    rate: a word ``lr`` or ``learning_rate`` in its last part."""
    return bool(_LEARNING_RATE.search(key.rpartition(".")[2]))


def check_learning_rate(key: str, value: Any, origin: str = "config", *, zero: bool = True) -> None:
    """Refuse a learning rate that is not a finite number >= 0 (> 0 with ``zero=False``):
    NaN trains to NaN weights, a negative one climbs the loss; 0 freezes the networks, which
    a test or a frozen baseline may want, but a search bound of 0 samples nothing useful.
    Names ``origin`` (a file, ``--set ...``) and ``key``. Used for every algorithm's
    learning-rate options (:func:`check_algo_options`) and for search bounds of them
    (``harness tune``, ``zero=False``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return  # (the type check names a wrong type)
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        least = "0 or more (0 freezes the networks)" if zero else "greater than 0"
        raise ConfigError(
            f"{origin}: {key} = {value!r} is not a usable learning rate: it must be a finite "
            f"number {least} (e.g. --set {key}=3e-4)."
        )


def check_algo_options(options: Any, where: Mapping[str, str], section: str = "algo") -> None:
    """Refuse what no algorithm can train with, whatever its plugin checks itself: a
    learning rate that is not finite and >= 0 (every field :func:`is_learning_rate` names)
    and a layer width below 1 (fields named ``hidden`` or ``*_hidden``: ``[-5]``, ``0``)."""
    if options is None or not dataclasses.is_dataclass(options):
        return
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        origin = where.get(f.name, "config")
        key = f"{section}.{f.name}"
        if is_learning_rate(f.name):
            check_learning_rate(key, value, origin)
        elif _LAYER_WIDTHS.search(f.name):
            widths = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(w, int) and not isinstance(w, bool) and w < 1 for w in widths):
                example = "[64,64]" if isinstance(value, list | tuple) else "64"
                raise ConfigError(
                    f"{origin}: {key} = {value!r}: every layer needs a width of 1 or more "
                    f"(e.g. --set {key}={example})."
                )


def type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any) -> Any:
    """Check ``value`` against annotation ``tp``, allowing int->float and list<->tuple."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError("; ".join(errors))
    if origin is typing.Literal:
        if value in args:
            return value
        raise ValueError(f"must be one of {', '.join(repr(a) for a in args)}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise TypeError(f"got {type(value).__name__}, expected a list")
        if origin is list:
            return [coerce(v, args[0]) if args else v for v in value]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0]) for v in value)
        if args and len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return (
            tuple(coerce(v, a) for v, a in zip(value, args, strict=False)) if args else tuple(value)
        )
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"got {type(value).__name__}, expected a table")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise TypeError(f"got {type(value).__name__}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"got {type(value).__name__}, write true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"got {type(value).__name__}, write it in quotes")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise TypeError(f"got {type(value).__name__}")
    return value


# ------------------------------------------------------------------------------------------
# Layering


@dataclass
class RawConfig:
    """Merged, unvalidated sections plus where each key came from."""

    sections: dict[str, dict[str, Any]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    sources: dict[str, str] = field(default_factory=dict)
    algo_of: dict[str, str | None] = field(default_factory=dict)
    """For each [algo] key, the algorithm its layer was written for (None: whichever is chosen)."""
    raw_sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Sections kept raw for plugins (:data:`RAW_SECTIONS`); a later file replaces a top-level
    key of an earlier one."""

    def merge(
        self, data: Mapping[str, Mapping[str, Any]], origin: str, *, for_algo: str | None = None
    ) -> None:
        for section, values in data.items():
            for key, value in values.items():
                self.sections[section][key] = value
                self.sources[f"{section}.{key}"] = origin
                if section == "algo":
                    self.algo_of[key] = for_algo

    def merge_file(self, path: Path) -> None:
        """A file's [algo] keys belong to the algorithm that file selects (or inherits), so a
        later layer that switches algorithm does not inherit options meant for another one."""
        data = read_config_file(path)
        for name in RAW_SECTIONS:
            if name in data:
                self.raw_sections.setdefault(name, {}).update(data.pop(name))
        for_algo = data.get("run", {}).get("algo", self.sections["run"].get("algo"))
        self.merge(data, str(path), for_algo=for_algo)

    def algo_section(
        self, algo: str, *, same: Callable[[str], bool] | None = None
    ) -> dict[str, Any]:
        """The [algo] keys meant for ``algo``: written for no algorithm in particular, for
        ``algo`` itself, or for a name ``same`` says is ``algo`` too (``ppo`` and ``algos:ppo``)."""

        def meant(owner: str | None) -> bool:
            return owner is None or owner == algo or (same is not None and same(owner))

        return {k: v for k, v in self.sections["algo"].items() if meant(self.algo_of.get(k))}

    def where(self, section: str) -> dict[str, str]:
        prefix = section + "."
        return {k[len(prefix) :]: v for k, v in self.sources.items() if k.startswith(prefix)}


def layer(
    pack_file: Path | None,
    user_files: Iterable[Path] = (),
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> RawConfig:
    """Merge defaults < HARNESS_BACKEND < pack < user files < --set into one :class:`RawConfig`."""
    raw = RawConfig()
    environ = os.environ if environ is None else environ
    if environ.get("HARNESS_BACKEND"):
        raw.merge({"run": {"backend": environ["HARNESS_BACKEND"]}}, "HARNESS_BACKEND")
    if pack_file is not None:
        raw.merge_file(pack_file)
    for path in user_files:
        raw.merge_file(Path(path))
    for text in overrides:
        section, key, value = parse_override(text)
        raw.merge({section: {key: value}}, f"--set {text}")
    return raw


def write_resolved(config: Config, directory: Path, extra: Mapping[str, Any]) -> None:
    """Write ``config.toml`` (a runnable pack file) and ``run.json`` (config + plugin versions)."""
    data = config.to_dict()
    (directory / "config.toml").write_text(dump_toml(data), encoding="utf-8")
    info = {"config": data, **extra}
    (directory / "run.json").write_text(json.dumps(info, indent=2, default=str), encoding="utf-8")


def dump_toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """A TOML writer for config sections: ``[section]`` then ``key = value`` per option, tables
    (a MyoSuite env's ``kwargs``, a curriculum's stages, ``closeness`` entries) as inline tables
    at any depth, keys that are not bare (``"obj_pos[2]"``) quoted."""
    lines: list[str] = []
    for section, values in data.items():
        lines.append(f"[{_toml_key(section)}]")
        lines.extend(
            f"{_toml_key(k)} = {_toml_value(v)}"
            for k, v in values.items()
            if v is not None  # TOML has no null: leaving the key out restores the default None
        )
        lines.append("")
    return "\n".join(lines)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    """A TOML key: bare where it may be, else a quoted string."""
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and value != value:
            return "nan"
        if isinstance(value, float) and value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + ", ".join(items) + "}"
    return json.dumps(str(value))


def resolve(raw: RawConfig, registry: Registry) -> Config:
    """Validate every section against the dataclasses of the selected plugins."""
    run = build_dataclass(RunConfig, raw.sections["run"], raw.where("run"), "run", "the run")
    check_run(run, raw.where("run"))
    sources = raw.sources

    def pick(kind: str, name: str, key: str) -> Any:
        try:
            return getattr(registry, kind).get(name)
        except PluginError as exc:
            origin = sources.get(f"run.{key}", "default")
            raise ConfigError(f"{origin}: [run] {key} = {name!r}: {exc}") from None

    algo_spec = pick("algorithms", run.algo, "algo")
    try:
        env_spec = registry.env_for(run.env)
    except PluginError as exc:
        raise ConfigError(f"{sources.get('run.env', 'default')}: [run] env: {exc}") from None
    backend_spec = pick("backends", run.backend, "backend")
    if "run.trackers" in sources:
        for tracker in run.trackers:
            pick("trackers", tracker, "trackers")
    else:  # the default list names optional plugins: skip the ones not installed
        missing = [t for t in run.trackers if t not in registry.trackers]
        if missing:
            log.debug("default trackers %s are not installed; running without them", missing)
        run.trackers = [t for t in run.trackers if t in registry.trackers]

    def section(name: str, cls: type[Any] | None, owner: str) -> Any:
        if name == "algo":
            values = raw.algo_section(
                run.algo, same=lambda owner: registry.algorithms.find(owner) is algo_spec
            )
        else:
            values = raw.sections[name]
        if cls is None:
            if values:
                keys = ", ".join(values)
                raise ConfigError(f"[{name}] keys {keys} given, but {owner} takes no options.")
            return None
        owners = algorithms_with if name == "algo" else None
        return build_dataclass(cls, values, raw.where(name), name, owner, owners_of=owners)

    def algorithms_with(key: str) -> list[str]:
        return [
            name
            for name, spec in registry.algorithms.items()
            if spec.config_cls is not None
            and key in {f.name for f in dataclasses.fields(spec.config_cls)}
        ]

    algo = section("algo", algo_spec.config_cls, f"algorithm {run.algo!r}")
    check_algo_options(algo, raw.where("algo"))
    return Config(
        run=run,
        algo=algo,
        env=section("env", env_spec.config_cls, f"env family {env_spec.name!r}"),
        backend=section("backend", backend_spec.config_cls, f"backend {run.backend!r}"),
        sources=dict(sources),
        tune=dict(raw.raw_sections.get("tune", {})),
    )
