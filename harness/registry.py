"""Typed records that plugins register (conda-style), and the lookup tables built from them.

Registration hooks return these records and instantiate nothing: a record names a factory and
the config dataclass it takes, so listing plugins stays cheap and importing torch or an
environment happens only when a run actually selects that component.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from harness.curriculum import CurriculumSpec
from harness.errors import ConfigError, PluginError, did_you_mean

log = logging.getLogger(__name__)


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
    """What ``[run] algo`` names (unique among all plugins' algorithms)."""
    make_agent: Callable[..., Any]
    """``make_agent(env_info, backend, config, *, seed, total_steps) -> Agent``: called once
    per run (and once per farm actor) with the :class:`harness.api.EnvInfo`, a backend
    already seeded (the ``backend`` stream of ``[run] seed``, :mod:`harness.seeds`), and an
    instance of :attr:`config_cls` built from the ``[algo]`` section; ``seed`` is the ``agent``
    stream's (for ``Agent.rng``), ``total_steps`` is ``[run] total_steps`` (for schedules)."""
    config_cls: type[Any]
    """The dataclass of the ``[algo]`` section; each field's docstring is its ``--help``."""
    action_spaces: tuple[str, ...] = ("discrete", "box")
    """The action-space kinds it supports (see above)."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""
    backends: tuple[str, ...] = ()
    """The backends it runs on; empty: every backend (see above)."""
    agents: str = "single"
    """Which envs it takes: "single" (gymnasium, arrays), "multi" (multi-agent envs,
    agent-keyed dicts; see docs/multiagent.md) or "any" (both, e.g. the random policy). A
    mismatch is refused at start-up."""
    make_algorithm: Callable[..., Any] | None = None
    """``make_algorithm(backend, env_info, config) -> Algorithm`` (the order of an
    :class:`harness.api.Algorithm`'s own constructor, so the class itself often fits): the
    algorithm alone, its networks, for :attr:`make_policy`. Declared with it."""
    make_policy: Callable[..., Any] | None = None
    """``make_policy(parts) -> harness.policy.Policy``: the algorithm's policy made from
    :class:`harness.policy.ActingParts` (an agent, or an :class:`harness.policy.Acting`
    around :attr:`make_algorithm`'s algorithm). With both, a farm actor and a central policy
    server build only these: no agent, replay or optimiser state. Without them (the default
    of specs written before them: deprecated, one release, a farm warns at start-up) they
    build an agent and act through ``Agent.policy()``."""

    @property
    def acts_without_agent(self) -> bool:
        """Whether a process that only acts can make this algorithm's policy without an
        agent (:attr:`make_algorithm` and :attr:`make_policy` both given)."""
        return self.make_algorithm is not None and self.make_policy is not None


@dataclass(frozen=True)
class EvalProtocol:
    """A competition's evaluation protocol for an env (``harness eval RUN --protocol NAME``):
    which env and ``[env]`` settings to evaluate on, and over how many episodes, as the
    challenge evaluated submissions. Its score is the episode metric ``score``."""

    name: str
    """What ``--protocol`` selects (e.g. 'official', 'phase1')."""
    episodes: int
    """Episodes the challenge evaluated a submission on (``--episodes`` overrides)."""
    env: str | None = None
    """The env id to evaluate on (a challenge's phase-2 id); None keeps the run's."""
    env_options: Mapping[str, Any] = field(default_factory=dict)
    """``[env]`` keys to set (over the run's)."""
    env_reset: Callable[[Any], Mapping[str, Any]] | None = None
    """``env_reset(options) -> {key: value}``: given the run's ``[env]`` options (as its
    checkpoint saved them), the ``[env]`` keys to set back so the evaluation runs the
    challenge's own task, not one the run trained on (a curriculum's stage, goal ranges it
    narrowed); set over :attr:`env_options`. ``harness eval`` prints the keys it changed."""
    description: str = ""
    """One line naming the challenge, its phase and where the protocol comes from."""
    score: Callable[[Mapping[str, Sequence[float]]], float] | None = None
    """The challenge's score from the evaluated episodes' metrics (name -> one value per
    episode) where it is not the mean of the episode metric ``score`` (a clipped mean)."""

    def config_layer(self, options: Any) -> dict[str, dict[str, Any]]:
        """The config layer that turns a run's config into this protocol's, given the run's
        ``[env]`` options: the env id, :attr:`env_options`, and what :attr:`env_reset` sets
        back (only the keys whose values change)."""
        env = dict(self.env_options)
        if self.env_reset is not None:
            env.update(
                (key, value)
                for key, value in self.env_reset(options).items()
                if getattr(options, key, None) != value
            )
        return {"env": env, "run": {"env": self.env}} if self.env is not None else {"env": env}

    def score_of(self, metrics: Mapping[str, Sequence[float]]) -> float | None:
        """The protocol's score of the episodes (None when the env reports none)."""
        if self.score is not None:
            return self.score(metrics)
        values = metrics.get("score")
        return float(sum(values) / len(values)) if values else None


@dataclass(frozen=True)
class EnvSpec:
    """An environment family:
    ``make_env(env_id, *, num_envs, seed, vector, options) -> VectorEnv`` (gymnasium's vector API
    with SAME_STEP autoreset; ``vector`` is 'sync' or 'async'; ``options`` an instance of
    ``config_cls`` or None).

    ``accepts(env_id)`` tells the runner whether this family can build ``env_id``; the first
    accepting family (in plugin order, :attr:`fallback` families last) wins, so a specific
    family can sit beside a generic one.
    """

    name: str
    """The family's name (``harness plugins`` lists it); env ids are matched by
    :attr:`accepts`, not by this name."""
    make_env: Callable[..., Any]
    """``make_env(env_id, *, num_envs, seed, vector, options) -> VectorEnv``. The runner
    passes ``seed=None`` and resets the vector env itself with ``reset(seed=...)``; reset with
    ``seed`` here only when one is given (direct callers such as ``check_env``)."""
    accepts: Callable[[str], bool]
    """``accepts(env_id) -> bool``: whether this family builds ``env_id`` (cheap, imports
    nothing)."""
    config_cls: type[Any] | None = None
    """The dataclass of the ``[env]`` section, passed to :attr:`make_env` as ``options``;
    None when the family has no options."""
    known_ids: Callable[[], Iterable[str]] | None = None
    """``known_ids() -> ids`` for the "did you mean" hint when no family accepts an id."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    protocols: Callable[[str], Mapping[str, EvalProtocol]] | None = None
    """``protocols(env_id) -> {name: EvalProtocol}``: the competition evaluation protocols of
    an env id (none for most envs), for ``harness eval --protocol``."""
    render_modes: tuple[str, ...] = ()
    """The render modes :attr:`make_env` accepts as a keyword ``render_mode=`` (``harness eval
    --video``). With ``"rgb_array"`` the vector env's ``render()`` returns one ``(H, W, 3)``
    uint8 frame per env, the same shape at every call (gymnasium's vector convention); an id
    that cannot render raises ``ConfigError`` from :attr:`make_env` saying what is missing.
    Families that declare none are never passed ``render_mode``."""
    evaluation_options: Callable[[Any], Any] | None = None
    """``evaluation_options(options) -> options``: the ``[env]`` options greedy evaluations
    (``eval/`` metrics, ``harness eval``, baselines) build their envs with, given the run's.
    A family drops training-only aids here, so that an evaluation measures the run's task
    (harness_myo drops its per-env adaptive goal range). None: the run's options."""
    fallback: bool = False
    """A generic family (gymnasium's: any id in gymnasium's registry), asked only after every
    other family declined. A specific family whose ids also land in gymnasium's registry once
    its package is imported (MyoSuite's) then keeps them, whatever the process imported
    before."""
    curriculum: CurriculumSpec | None = None
    """The family's curriculum (:class:`harness.curriculum.CurriculumSpec`): its ``[env]``
    dataclass has the curriculum fields, and the core applies the current stage before any env
    is built and advances it after iterations, for every env of the family. None: no
    curriculum."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""


@dataclass(frozen=True)
class BackendSpec:
    """A neural-network backend: ``load(config) -> Backend`` imports the framework lazily."""

    name: str
    """What ``[run] backend`` names (``torch``, ``paddle``)."""
    load: Callable[..., Any]
    """``load(config) -> Backend`` with an instance of :attr:`config_cls` built from the
    ``[backend]`` section (None without one); the only place the framework is imported."""
    config_cls: type[Any] | None = None
    """The dataclass of the ``[backend]`` section (device, threads, ...), or None."""
    install_hint: str = ""
    """How to install the framework (``pip install 'harness[torch]'``), for messages about
    a missing framework (the ``harness_backend`` fixture's skip reason)."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""
    preload: tuple[str, ...] = ()
    """Modules worth importing once in a fork server before actor processes are forked (the
    framework itself: ~150 MB and 1-2 s per process otherwise)."""


@dataclass(frozen=True)
class TransportSpec:
    """A distribution transport (ZeroMQ farm, Ray): ``connect(address, **options)`` returns a
    :class:`harness.remote.Client`. Commands of a transport (``harness cluster ...`` of
    harness_zmq) are :class:`CommandSpec` records like any plugin's."""

    name: str
    """What ``harness.connect(transport=...)`` and ``[run] transport`` name."""
    connect: Callable[..., Any]
    """``connect(address, **options) -> Client``; ``address=None`` asks for the transport's
    local default (an embedded farm)."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""
    cluster: Callable[[Sequence[str]], int] | None = None
    """Deprecated, ignored (to be removed in the next release): ``harness cluster`` is no
    longer a core command dispatching to a transport; register the command with
    ``harness_register_commands`` (a :class:`CommandSpec`, as harness_zmq does). Setting it
    warns (DeprecationWarning)."""

    def __post_init__(self) -> None:
        if self.cluster is not None:
            warnings.warn(
                f"TransportSpec({self.name!r}, cluster=...) is deprecated and ignored: register "
                f"the command with harness_register_commands as a CommandSpec (harness_zmq "
                f"registers 'cluster' that way).",
                DeprecationWarning,
                stacklevel=3,
            )


@dataclass(frozen=True)
class TrackerSpec:
    """An experiment tracker: ``make(run_dir, config) -> Tracker``."""

    name: str
    """What ``[run] trackers`` lists."""
    make: Callable[..., Any]
    """``make(run_dir, config, *, start_step) -> Tracker``: an object with
    ``record(step, metrics)`` (a dict of finite floats, namespaced keys) and ``close()``.
    ``config`` is the whole resolved run config; ``start_step > 0`` on ``--resume``, where
    rows logged after that step must be dropped. Raise
    :class:`harness.errors.PluginError` when a dependency is missing."""
    default: bool = False
    """Informational: whether the tracker is meant to run by default. The default list is
    ``[run] trackers`` (``["csv", "tensorboard"]``), which does not read this flag."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""


@dataclass(frozen=True)
class CompetitionSpec:
    """A competition pack: a pack file (TOML/YAML) and its directory."""

    name: str
    """What ``harness run NAME`` accepts in place of a pack path."""
    pack_file: Path
    """The pack's absolute path, usually inside the plugin's package
    (``Path(__file__).parent / "pack.toml"``; ship it as package data)."""
    description: str = ""
    """One line on what it is, for people reading the registry (informational)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in (leave it
    empty), and error messages name it."""


@dataclass(frozen=True)
class CommandSpec:
    """A ``harness NAME ...`` subcommand: ``add_arguments(parser)`` declares its options on an
    argparse parser (which already has the common ``-p``/``--debug``/``-v`` flags), ``run(args)
    -> exit code`` runs it. Raise :class:`harness.errors.HarnessError` for a clear error."""

    name: str
    """The subcommand: ``harness NAME ...`` (must not be a core command)."""
    add_arguments: Callable[[Any], None]
    """``add_arguments(parser)``: declare the options on the subcommand's argparse parser."""
    run: Callable[[Any], int]
    """``run(args) -> exit code`` with the parsed :class:`argparse.Namespace`."""
    help: str = ""
    """One line for ``harness --help``."""
    description: str = ""
    """The subcommand's ``--help`` text (``help`` when empty)."""
    plugin: str = ""
    """The entry-point name of the plugin that registered it; harness fills it in."""


R = TypeVar("R")


@dataclass
class Table(Generic[R]):
    """Name -> record for one kind, suggesting names on a miss.

    Every record is also reachable by its qualified name ``PLUGIN:NAME``. When two plugins
    register the same name, the bare name keeps one of them (a first-party record over a
    third-party one, else the first registered), :attr:`clashes` remembers both, and a lookup of
    the bare name warns once, naming the qualified names that choose either: a clash costs the
    user one ``--set algo=myplugin:ppo``, never a whole plugin.
    """

    kind: str
    """The kind in words, for messages ("algorithm", "env family", ...)."""
    records: dict[str, R] = field(default_factory=dict)
    """Bare name -> record, in registration (plugin) order."""
    qualified: dict[str, R] = field(default_factory=dict)
    """``PLUGIN:NAME`` -> record, for every record registered."""
    clashes: dict[str, list[str]] = field(default_factory=dict)
    """A name registered by several plugins -> those plugins, the one the bare name uses first."""
    _preferred: set[str] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)

    def add(self, record: R, *, preferred: bool = False) -> None:
        """Add ``record``; ``preferred`` (first-party) wins a name clash over an earlier
        record that is not preferred."""
        name: str = getattr(record, "name")  # noqa: B009 - every record type has a name
        plugin: str = getattr(record, "plugin", "") or "?"
        self.qualified[f"{plugin}:{name}"] = record
        if name not in self.records:
            self.records[name] = record
            if preferred:
                self._preferred.add(name)
            return
        owners = self.clashes.setdefault(name, [_plugin_of(self.records[name])])
        if preferred and name not in self._preferred:
            self.records[name] = record
            self._preferred.add(name)
            owners.insert(0, plugin)
        else:
            owners.append(plugin)
        log.debug("%s", self.clash_message(name))  # (warned about when the bare name is used)

    def clash_message(self, name: str) -> str:
        """One paragraph on a clashed name: who registered it, which one the bare name uses,
        and the qualified names that choose."""
        owners = self.clashes[name]
        choices = " or ".join(repr(f"{p}:{name}") for p in owners)
        return (
            f"{self.kind} {name!r} is registered by plugins {', '.join(map(repr, owners))}; "
            f"{name!r} means the one of plugin {owners[0]!r}. Choose one by its qualified name "
            f"({choices}), or rename it in the other plugin."
        )

    def get(self, name: str) -> R:
        """The record ``name`` (bare or ``PLUGIN:NAME``) stands for; a
        :class:`harness.errors.PluginError` with a "did you mean" hint when there is none."""
        if ":" in name:
            try:
                return self.qualified[name]
            except KeyError:
                raise PluginError(
                    f"Unknown {self.kind} {name!r} (PLUGIN:NAME)."
                    f"{did_you_mean(name, self.qualified)} Run `harness plugins` to see what is "
                    f"installed."
                ) from None
        try:
            record = self.records[name]
        except KeyError:
            raise PluginError(
                f"Unknown {self.kind} {name!r}.{did_you_mean(name, self.records)} "
                f"Run `harness plugins` to see what is installed."
            ) from None
        if name in self.clashes and name not in self._warned:
            self._warned.add(name)
            log.warning("%s", self.clash_message(name))
        return record

    def find(self, name: str) -> R | None:
        """The record ``name`` (bare or ``PLUGIN:NAME``) stands for, or None; never warns."""
        return self.qualified.get(name) if ":" in name else self.records.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.records or name in self.qualified

    def __iter__(self) -> Iterator[str]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def items(self) -> Iterator[tuple[str, R]]:
        """``(bare name, record)`` pairs in registration order."""
        return iter(self.records.items())


def _plugin_of(record: Any) -> str:
    return getattr(record, "plugin", "") or "?"


KINDS: Mapping[str, type[Any]] = {
    "algorithms": AlgorithmSpec,
    "envs": EnvSpec,
    "backends": BackendSpec,
    "transports": TransportSpec,
    "trackers": TrackerSpec,
    "competitions": CompetitionSpec,
    "commands": CommandSpec,
}
"""Registration-hook kind (``harness_register_<kind>``) -> the record type it must return."""


@dataclass
class Registry:
    """Every record the loaded plugins registered, one table per kind."""

    algorithms: Table[AlgorithmSpec] = field(default_factory=lambda: Table("algorithm"))
    """From ``harness_register_algorithms``."""
    envs: Table[EnvSpec] = field(default_factory=lambda: Table("env family"))
    """From ``harness_register_envs``; look an env id up with :meth:`env_for`."""
    backends: Table[BackendSpec] = field(default_factory=lambda: Table("backend"))
    """From ``harness_register_backends``."""
    transports: Table[TransportSpec] = field(default_factory=lambda: Table("transport"))
    """From ``harness_register_transports``."""
    trackers: Table[TrackerSpec] = field(default_factory=lambda: Table("tracker"))
    """From ``harness_register_trackers``."""
    competitions: Table[CompetitionSpec] = field(default_factory=lambda: Table("competition"))
    """From ``harness_register_competitions``."""
    commands: Table[CommandSpec] = field(default_factory=lambda: Table("command"))
    """From ``harness_register_commands``."""

    def protocol(self, env_id: str, name: str, flag: str | None = None) -> EvalProtocol:
        """The evaluation protocol ``name`` of ``env_id`` (its env family's
        :attr:`EnvSpec.protocols`); a clear error naming the ones there are. ``flag`` is the
        option as the user gave it, for that error (default ``--protocol NAME``)."""
        flag = flag or f"--protocol {name}"
        spec = self.env_for(env_id)
        found = dict(spec.protocols(env_id)) if spec.protocols is not None else {}
        if name in found:
            return found[name]
        if not found:
            raise ConfigError(
                f"{flag}: the env {env_id!r} has no evaluation protocols (env family "
                f"{spec.name!r}); they come with competition envs (e.g. MyoChallenge ids such "
                f"as myoChallengeDieReorientP1-v0, or Prosthetics-v0 and L2M2019-v0). Drop "
                f"{flag.split()[0]} to evaluate on the run's env."
            )
        raise ConfigError(
            f"{flag}: {env_id!r} has the protocols {', '.join(sorted(found))}."
            f"{did_you_mean(name, found)}"
        )

    def env_for(self, env_id: str) -> EnvSpec:
        """The first env family that accepts ``env_id`` (fallback families last); a clear
        error when none does."""
        specs = [spec for _, spec in self.envs.items()]
        for spec in sorted(specs, key=lambda s: s.fallback):  # (stable: else plugin order)
            if _asked(spec, "accepts", spec.accepts, env_id):
                return spec
        families = ", ".join(self.envs) or "none installed"
        known = [
            i
            for _, s in self.envs.items()
            if s.known_ids
            for i in _asked(s, "known_ids", s.known_ids) or ()
        ]
        hint = did_you_mean(env_id, known) if known else ""
        raise PluginError(
            f"No env plugin knows env id {env_id!r} (env families: {families}).{hint} Check "
            f"the spelling, or install the package that registers it."
        )


_BROKEN_FAMILIES: set[tuple[str, str]] = set()
"""(plugin, family) pairs whose ``accepts`` or ``known_ids`` raised: warned about once."""


def _asked(spec: EnvSpec, what: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` of an env family (its ``accepts`` or ``known_ids``); one that raises is
    a broken family: it answers no (None), with a warning naming its plugin once per process,
    so one broken env plugin cannot stop runs of every other plugin's envs."""
    try:
        return call(*args)
    except Exception as exc:  # a plugin's bug: isolate it
        key = (spec.plugin, spec.name)
        if key not in _BROKEN_FAMILIES:
            _BROKEN_FAMILIES.add(key)
            log.warning(
                "env family %r of plugin %r is skipped: its %s() raised %s: %s. Fix or "
                "uninstall that plugin (or block it with -p no:%s).",
                spec.name,
                spec.plugin or "?",
                what,
                type(exc).__name__,
                exc,
                spec.plugin or spec.name,
            )
        return None
