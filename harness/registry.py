"""Typed records that plugins register (conda-style), and the lookup tables built from them.

Registration hooks return these records and instantiate nothing: a record names a factory and
the config dataclass it takes, so listing plugins stays cheap and importing torch or an
environment happens only when a run actually selects that component.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from harness.errors import PluginError, did_you_mean


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm: ``make_agent(env_info, backend, config) -> Agent``.

    ``action_spaces`` lists the action-space kinds it supports ("discrete", "box"; for a
    multi-agent algorithm, every agent's) so an incompatible pairing is refused at start-up,
    before any training. ``backends`` names the
    backends it runs on when it needs framework code of its own; empty (the default) means
    every backend, as for an algorithm written against :class:`harness.api.Backend` only.
    """

    name: str
    make_agent: Callable[..., Any]
    config_cls: type[Any]
    action_spaces: tuple[str, ...] = ("discrete", "box")
    description: str = ""
    plugin: str = ""
    backends: tuple[str, ...] = ()
    agents: str = "single"
    """Which envs it takes: "single" (gymnasium, arrays), "multi" (multi-agent envs,
    agent-keyed dicts; see docs/multiagent.md) or "any" (both, e.g. the random policy). A
    mismatch is refused at start-up."""


@dataclass(frozen=True)
class EnvSpec:
    """An environment family:
    ``make_env(env_id, *, num_envs, seed, vector, options) -> VectorEnv`` (gymnasium's vector API
    with SAME_STEP autoreset; ``vector`` is 'sync' or 'async'; ``options`` an instance of
    ``config_cls`` or None).

    ``accepts(env_id)`` tells the runner whether this family can build ``env_id``; the first
    accepting family (in plugin order) wins, so a specific family can sit beside a generic one.
    """

    name: str
    make_env: Callable[..., Any]
    accepts: Callable[[str], bool]
    config_cls: type[Any] | None = None
    known_ids: Callable[[], Iterable[str]] | None = None
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class BackendSpec:
    """A neural-network backend: ``load(config) -> Backend`` imports the framework lazily."""

    name: str
    load: Callable[..., Any]
    config_cls: type[Any] | None = None
    install_hint: str = ""
    description: str = ""
    plugin: str = ""
    preload: tuple[str, ...] = ()
    """Modules worth importing once in a fork server before actor processes are forked (the
    framework itself: ~150 MB and 1-2 s per process otherwise)."""


@dataclass(frozen=True)
class TransportSpec:
    """A distribution transport (ZeroMQ farm, Ray): ``connect(address, **options)`` returns a
    :class:`harness.remote.Client`. ``cluster(argv) -> exit code``, when given, implements
    ``harness cluster ...`` for this transport (it parses ``argv`` itself)."""

    name: str
    connect: Callable[..., Any]
    description: str = ""
    plugin: str = ""
    cluster: Callable[[Sequence[str]], int] | None = None


@dataclass(frozen=True)
class TrackerSpec:
    """An experiment tracker: ``make(run_dir, config) -> Tracker``."""

    name: str
    make: Callable[..., Any]
    default: bool = False
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class CompetitionSpec:
    """A competition pack: a pack file (TOML/YAML) and its directory."""

    name: str
    pack_file: Path
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """A ``harness NAME ...`` subcommand: ``add_arguments(parser)`` declares its options on an
    argparse parser (which already has the common ``-p``/``--debug``/``-v`` flags), ``run(args)
    -> exit code`` runs it. Raise :class:`harness.errors.HarnessError` for a clear error."""

    name: str
    add_arguments: Callable[[Any], None]
    run: Callable[[Any], int]
    help: str = ""
    description: str = ""
    plugin: str = ""


R = TypeVar("R")


@dataclass
class Table(Generic[R]):
    """Name -> record for one kind, rejecting duplicates and suggesting names on a miss."""

    kind: str
    records: dict[str, R] = field(default_factory=dict)

    def add(self, record: R) -> None:
        name: str = getattr(record, "name")  # noqa: B009 - every record type has a name
        if name in self.records:
            first = getattr(self.records[name], "plugin", "?")
            second = getattr(record, "plugin", "?")
            raise PluginError(
                f"{self.kind} {name!r} is registered twice: by plugin {first!r} and by plugin "
                f"{second!r}. Uninstall or block one of them (harness -p no:{second} ...)."
            )
        self.records[name] = record

    def get(self, name: str) -> R:
        try:
            return self.records[name]
        except KeyError:
            raise PluginError(
                f"Unknown {self.kind} {name!r}.{did_you_mean(name, self.records)} "
                f"Run `harness plugins` to see what is installed."
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.records

    def __iter__(self) -> Iterator[str]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def items(self) -> Iterator[tuple[str, R]]:
        return iter(self.records.items())


KINDS: Mapping[str, type[Any]] = {
    "algorithms": AlgorithmSpec,
    "envs": EnvSpec,
    "backends": BackendSpec,
    "transports": TransportSpec,
    "trackers": TrackerSpec,
    "competitions": CompetitionSpec,
    "commands": CommandSpec,
}


@dataclass
class Registry:
    """Every record the loaded plugins registered, one table per kind."""

    algorithms: Table[AlgorithmSpec] = field(default_factory=lambda: Table("algorithm"))
    envs: Table[EnvSpec] = field(default_factory=lambda: Table("env family"))
    backends: Table[BackendSpec] = field(default_factory=lambda: Table("backend"))
    transports: Table[TransportSpec] = field(default_factory=lambda: Table("transport"))
    trackers: Table[TrackerSpec] = field(default_factory=lambda: Table("tracker"))
    competitions: Table[CompetitionSpec] = field(default_factory=lambda: Table("competition"))
    commands: Table[CommandSpec] = field(default_factory=lambda: Table("command"))

    def env_for(self, env_id: str) -> EnvSpec:
        """The first env family that accepts ``env_id``; a clear error when none does."""
        for _, spec in self.envs.items():
            if spec.accepts(env_id):
                return spec
        families = ", ".join(self.envs) or "none installed"
        known = [i for _, s in self.envs.items() if s.known_ids for i in s.known_ids()]
        hint = did_you_mean(env_id, known) if known else ""
        raise PluginError(
            f"No env plugin knows env id {env_id!r} (env families: {families}).{hint} Check "
            f"the spelling, or install the package that registers it."
        )
