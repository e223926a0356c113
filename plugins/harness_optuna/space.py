"""The ``[tune]`` section of a pack file: settings and search space, checked before any trial.

    [tune]
    metric = "eval/mean_return"     # reported through trial.report at every evaluation
    direction = "maximize"
    objective = "final"             # trial value: the metric's final value, or its "best"
    pruner = "median"               # median | halving | hyperband | none
    trials = 20
    set = ["run.total_steps=50000"] # overrides for every trial (same syntax as --set)
    enqueue = [{ "algo.learning_rate" = 1e-3 }]  # trials to run first (e.g. the defaults)

    [tune.pruners.median]           # options of a pruner, used when it is selected
    n_startup_trials = 3

    [tune.space]                    # one distribution per config key
    "algo.learning_rate" = { type = "float", low = 1e-4, high = 3e-3, log = true }
    "algo.n_epochs" = { type = "int", low = 4, high = 20, step = 4 }
    "algo.hidden" = { type = "categorical", choices = [[64, 64], [128, 128]] }

Nothing here imports optuna: the space is plain data until a study samples it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import (
    SECTIONS,
    Config,
    RawConfig,
    check_learning_rate,
    is_learning_rate,
    parse_override,
    resolve,
)
from harness.errors import ConfigError, did_you_mean
from harness.registry import Registry

KINDS = ("float", "int", "categorical")
PRUNERS = ("median", "halving", "hyperband", "none")
OBJECTIVES = ("final", "best")
DIRECTIONS = ("maximize", "minimize")
SETTINGS = ("metric", "direction", "objective", "pruner", "pruners", "trials", "set", "enqueue")
SETTINGS_ALL = (*SETTINGS, "space")
PARAM_KEYS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
TUNER_KEYS = ("run.out", "run.name", "run.progress")
"""Keys harness tune sets itself for every trial (each trial's run directory)."""

DIST_HINT = (
    'Use type = "float" (low, high; log = true for log-uniform; step), "int" (low, high; step; '
    'log) or "categorical" (choices = [...]).'
)


@dataclass(frozen=True)
class Param:
    """One searched config key and its distribution."""

    key: str
    """'section.name' of the config key, e.g. 'algo.learning_rate'."""
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()
    encoded: bool = False
    """Categorical choices that are lists/tables are stored in Optuna as their JSON text."""

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    def optuna_choices(self) -> tuple[Any, ...]:
        return tuple(json.dumps(c) for c in self.choices) if self.encoded else self.choices

    def decode(self, value: Any) -> Any:
        """An Optuna parameter value -> the config value."""
        return json.loads(value) if self.encoded else value

    def encode(self, value: Any) -> Any:
        return json.dumps(value) if self.encoded else value

    def bounds(self) -> list[Any]:
        """Values that must each make a valid config (checked before any trial)."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]

    def contains(self, value: Any) -> bool:
        if self.kind == "categorical":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"categorical {list(self.choices)}"
        extra = " log" if self.log else ""
        extra += f" step {self.step}" if self.step is not None else ""
        return f"{self.kind} [{self.low}, {self.high}]{extra}"


@dataclass
class TuneSettings:
    """The validated ``[tune]`` section (with the command line's choices applied)."""

    space: list[Param]
    metric: str = "eval/mean_return"
    direction: str = "maximize"
    objective: str = "final"
    pruner: str = "median"
    pruner_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    trials: int = 20
    set: list[str] = field(default_factory=list)
    enqueue: list[dict[str, Any]] = field(default_factory=list)

    def param(self, key: str) -> Param:
        return next(p for p in self.space if p.key == key)


def read_settings(tune: Mapping[str, Any], pack_file: Path) -> TuneSettings:
    """Parse the raw ``[tune]`` table of ``pack_file`` (config keys are checked later by
    :func:`check_against_config`)."""
    where = f"{pack_file}: [tune]"
    if not tune:
        raise ConfigError(
            f"{pack_file} has no [tune] section, so there is nothing to search. Add one with a "
            f"[tune.space] table, e.g.\n\n[tune.space]\n"
            f'"algo.learning_rate" = {{ type = "float", low = 1e-4, high = 3e-3, log = true }}'
            f"\n\n(see docs/tuning.md), or pass a pack that has one."
        )
    for key in tune:
        if key not in SETTINGS_ALL:
            raise ConfigError(
                f"{where} has an unknown key {key!r}.{did_you_mean(key, SETTINGS_ALL)} "
                f"Keys are: {', '.join(SETTINGS_ALL)}."
            )
    space = tune.get("space")
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"{where} has no search space: add a [tune.space] table with one distribution per "
            f'config key, e.g. "algo.learning_rate" = {{ type = "float", low = 1e-4, '
            f"high = 3e-3, log = true }}."
        )
    settings = TuneSettings(space=[_param(k, v, pack_file) for k, v in _flatten(space)])
    for key, allowed in (
        ("direction", DIRECTIONS),
        ("objective", OBJECTIVES),
        ("pruner", PRUNERS),
    ):
        if key in tune:
            value = tune[key]
            if value not in allowed:
                raise ConfigError(
                    f"{where} {key} = {value!r} is not one of {', '.join(allowed)}."
                    f"{did_you_mean(str(value), allowed)}"
                )
            setattr(settings, key, value)
    if "metric" in tune:
        if not isinstance(tune["metric"], str) or not tune["metric"]:
            raise ConfigError(f"{where} metric must be a metric name, e.g. 'eval/mean_return'.")
        settings.metric = tune["metric"]
    if "trials" in tune:
        settings.trials = check_trials(tune["trials"], f"{where} trials")
    if "set" in tune:
        sets = tune["set"]
        if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
            raise ConfigError(f'{where} set must be a list of "KEY=VALUE" strings, like --set.')
        for text in sets:
            parse_override(text)  # the core's message for a malformed one
        settings.set = list(sets)
    settings.pruner_options = _pruner_options(tune.get("pruners", {}), where)
    settings.enqueue = _enqueue(tune.get("enqueue", []), settings, where)
    return settings


def check_trials(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} = {value!r} must be a whole number >= 1.")
    return value


def _flatten(space: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"algo": {"lr": {...}}}`` and ``{"algo.lr": {...}}`` both give ``("algo.lr", {...})``:
    a table with any distribution key is a leaf."""
    out: list[tuple[str, Any]] = []
    leaf_keys = {"type", "low", "high", "choices", "log", "step"}
    for key, value in space.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and not leaf_keys & set(value):
            out.extend(_flatten(value, path + "."))
        else:
            out.append((path, value))
    return out


def _param(key: str, spec: Any, pack_file: Path) -> Param:
    where = f"{pack_file}: [tune.space] {key!r}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where} = {spec!r} must be a table with a distribution. {DIST_HINT}")
    kind = spec.get("type")
    if kind not in KINDS:
        shown = "no type" if kind is None else f"unknown distribution type {kind!r}"
        raise ConfigError(f"{where} has {shown}.{did_you_mean(str(kind), KINDS)} {DIST_HINT}")
    for name in spec:
        if name not in PARAM_KEYS[kind]:
            raise ConfigError(
                f"{where}: {name!r} is not an option of a {kind} distribution "
                f"(options: {', '.join(PARAM_KEYS[kind])}). {DIST_HINT}"
            )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, e.g. [64, 128, 256].")
        encoded = any(isinstance(c, list | dict) for c in choices)
        if len({json.dumps(c, sort_keys=True) for c in choices}) != len(choices):
            raise ConfigError(f"{where}: choices {choices!r} repeat a value; list each once.")
        return Param(key, kind, choices=tuple(choices), encoded=encoded)
    return _numeric(key, kind, spec, where)


def _numeric(key: str, kind: str, spec: Mapping[str, Any], where: str) -> Param:
    number: Any = int if kind == "int" else (int, float)
    for name in ("low", "high"):
        value = spec.get(name)
        if value is None:
            raise ConfigError(f"{where}: a {kind} distribution needs {name} = <number>.")
        if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
            raise ConfigError(f"{where}: {name} = {value!r} must be a finite {kind} number.")
    low, high = spec["low"], spec["high"]
    if low >= high:
        what = "an empty range" if low == high else "an inverted range"
        raise ConfigError(
            f"{where}: low = {low!r}, high = {high!r} is {what}. Give low < high (to fix the "
            f"key at one value, set it in the pack's [{key.split('.')[0]}] section instead)."
        )
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log = {log!r} must be true or false.")
    step = spec.get("step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, number) or step <= 0:
            raise ConfigError(f"{where}: step = {step!r} must be a positive {kind} number.")
        if log and (kind == "float" or step != 1):
            raise ConfigError(f"{where}: log = true cannot be combined with a step; drop one.")
        if step > high - low:
            raise ConfigError(f"{where}: step = {step!r} is wider than the range [{low}, {high}].")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log distribution needs low > 0, got low = {low!r}.")
    if is_learning_rate(key):  # (a trial of lr <= 0 would train nothing, or diverge)
        for name in ("low", "high"):
            check_learning_rate(key, spec[name], f"{where} {name}", zero=False)
    if kind == "float":
        low, high = float(low), float(high)
        step = float(step) if step is not None else None
    return Param(key, kind, low=low, high=high, log=log, step=step)


def _pruner_options(options: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where} pruners must be tables, e.g. [tune.pruners.median].")
    for name, values in options.items():
        if name not in PRUNERS or name == "none":
            raise ConfigError(
                f"{where}.pruners.{name}: unknown pruner.{did_you_mean(name, PRUNERS[:-1])}"
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}.pruners.{name} must be a table of options.")
    return {name: dict(values) for name, values in options.items()}


def _enqueue(items: Any, settings: TuneSettings, where: str) -> list[dict[str, Any]]:
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise ConfigError(f'{where} enqueue must be a list of tables: [{{ "algo.KEY" = V }}].')
    keys = [p.key for p in settings.space]
    out = []
    for item in items:
        for key, value in _flatten(item):
            if key not in keys:
                raise ConfigError(
                    f"{where} enqueue names {key!r}, which is not in [tune.space]."
                    f"{did_you_mean(key, keys)}"
                )
            if not settings.param(key).contains(value):
                raise ConfigError(
                    f"{where} enqueue: {key} = {value!r} is outside its distribution "
                    f"({settings.param(key).describe()})."
                )
        out.append(dict(_flatten(item)))
    return out


# ------------------------------------------------------------------------------------------
# Against the config


def config_keys(config: Config) -> dict[str, type[Any]]:
    """Every 'section.key' of a resolved config -> the dataclass that owns it."""
    keys: dict[str, type[Any]] = {}
    for section in SECTIONS:
        value = getattr(config, section)
        if value is not None:
            for f in dataclasses.fields(value):
                keys[f"{section}.{f.name}"] = type(value)
    return keys


def check_against_config(
    settings: TuneSettings, raw: RawConfig, registry: Registry, pack_file: Path
) -> Config:
    """Resolve the base config and check that every searched key exists and that each bound
    (or choice) gives a valid config, so bad input fails before any trial. Returns the base
    config."""
    base = resolve(raw, registry)
    keys = config_keys(base)
    for param in settings.space:
        where = f"{pack_file}: [tune.space] {param.key!r}"
        if "." not in param.key or param.section not in SECTIONS:
            raise ConfigError(
                f"{where} is not SECTION.KEY with a section in {', '.join(SECTIONS)}."
                f"{did_you_mean(param.key, keys)}"
            )
        if param.key not in keys:
            raise ConfigError(
                f"{where} is not a config key of this pack.{did_you_mean(param.key, keys)} "
                f"`harness run --help` lists every key."
            )
        if param.key in TUNER_KEYS:
            raise ConfigError(f"{where}: harness tune sets {param.key} itself; search another key.")
        for value in param.bounds():
            probe = _copy(raw)
            probe.merge({param.section: {param.name: value}}, where)
            resolve(probe, registry)
    return base


def _copy(raw: RawConfig) -> RawConfig:
    return RawConfig(
        sections={k: dict(v) for k, v in raw.sections.items()},
        sources=dict(raw.sources),
        algo_of=dict(raw.algo_of),
        raw_sections={k: dict(v) for k, v in raw.raw_sections.items()},
    )


def params_to_sections(params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"algo.lr": 1e-3}`` -> ``{"algo": {"lr": 1e-3}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in params.items():
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out
