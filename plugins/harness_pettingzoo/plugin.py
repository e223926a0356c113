"""Registers the ``pettingzoo`` env family: PettingZoo envs as multi-agent vector envs.

Ids:

- ``mpe2/<task>``, e.g. ``mpe2/simple_spread_v3``: a task of the mpe2 package (the Multi-Agent
  Particle Environments);
- ``pettingzoo:<module>``, e.g. ``pettingzoo:pettingzoo.butterfly.cooperative_pong_v5``: any
  module with PettingZoo's ``parallel_env()`` / ``env()`` constructors (third-party ones too);
- ``pettingzoo:<module>:<factory>``: a function of that module returning a ParallelEnv or an
  AECEnv (e.g. your env inside your own wrappers).

pettingzoo and mpe2 are imported only when such an env is built, so listing plugins stays
cheap. The adapter itself is :mod:`harness_pettingzoo.vector`; docs/multiagent.md has the whole
story.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import pkgutil
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness import hookimpl
from harness.errors import ConfigError, PluginError, did_you_mean
from harness.registry import EnvSpec

log = logging.getLogger(__name__)

MPE2 = "mpe2/"
GENERIC = "pettingzoo:"
INSTALL = "pip install 'harness[multiagent]'"
APIS = ("parallel", "aec")


@dataclass
class PettingZooConfig:
    """Options of the pettingzoo env family ([env] section). The named options go to the env's
    constructor when set (unset: the env's own default); ``kwargs`` passes any other one."""

    api: str = "parallel"
    """Which PettingZoo API the adapter drives: 'parallel' (``parallel_env()``, all agents act
    at once) or 'aec' (``env()``, agents act in turn, one cycle per vector step). mpe2 gives
    identical trajectories either way; parallel is faster."""
    continuous_actions: bool | None = None
    """mpe2: Box(0, 1) actions instead of Discrete(5); unset: the env's default (false)."""
    max_cycles: int | None = None
    """Steps until the episode is truncated; unset: the env's default (mpe2: 25)."""
    N: int | None = None
    """mpe2 tasks that have it (simple_spread, simple_adversary, simple_tag, ...): the number
    of agents (and landmarks); unset: the env's default."""
    local_ratio: float | None = None
    """mpe2 simple_spread: weight of each agent's own reward against the team's (0..1)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Any other keyword argument of the env's constructor, e.g. {dynamic_rescaling = false};
    a key the constructor does not take fails at start-up."""

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api = {self.api!r} must be one of {', '.join(map(repr, APIS))}")
        if self.max_cycles is not None and self.max_cycles < 1:
            raise ValueError(f"max_cycles = {self.max_cycles} must be >= 1")
        if self.N is not None and self.N < 1:
            raise ValueError(f"N = {self.N} must be >= 1")
        if self.local_ratio is not None and not 0.0 <= self.local_ratio <= 1.0:
            raise ValueError(f"local_ratio = {self.local_ratio} must be within [0, 1]")
        named = ("continuous_actions", "max_cycles", "N", "local_ratio")
        twice = [k for k in named if k in self.kwargs and getattr(self, k) is not None]
        if twice:
            raise ValueError(f"{', '.join(twice)} given both as an option and in kwargs")

    def env_kwargs(self) -> dict[str, Any]:
        """Everything the env's constructor gets."""
        kwargs = dict(self.kwargs)
        for key in ("continuous_actions", "max_cycles", "N", "local_ratio"):
            value = getattr(self, key)
            if value is not None:
                kwargs[key] = value
        return kwargs


# ------------------------------------------------------------------------------------------
# Ids


def accepts(env_id: str) -> bool:
    """Decided from the id alone (no import): a wrong task or module fails in ``make_env``
    with a message that names it."""
    if env_id.startswith(MPE2):
        return bool(re.fullmatch(r"\w+", env_id.removeprefix(MPE2)))
    if env_id.startswith(GENERIC):
        return bool(re.fullmatch(r"[\w.]+(:\w+)?", env_id.removeprefix(GENERIC)))
    return False


def mpe2_tasks() -> list[str]:
    """mpe2's task modules (``simple_spread_v3``, ...), found without importing mpe2."""
    spec = importlib.util.find_spec("mpe2")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(
        m.name
        for m in pkgutil.iter_modules(spec.submodule_search_locations)
        if re.search(r"_v\d+$", m.name)
    )


def known_ids() -> list[str]:
    return [MPE2 + task for task in mpe2_tasks()]


def _require(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise PluginError(
            f"The pettingzoo env family needs the {package!r} package, which is not installed. "
            f"Install the multi-agent extras: {INSTALL}"
        )


def _import(env_id: str) -> tuple[Any, str | None]:
    """The module an id names and the factory name of a ``pettingzoo:module:factory`` id."""
    _require("pettingzoo")
    if env_id.startswith(MPE2):
        _require("mpe2")
        task = env_id.removeprefix(MPE2)
        tasks = mpe2_tasks()
        if task not in tasks:
            raise ConfigError(
                f"[run] env = {env_id!r}: mpe2 has no task {task!r}.{did_you_mean(task, tasks)}"
            )
        return importlib.import_module(f"mpe2.{task}"), None
    module_name, _, factory = env_id.removeprefix(GENERIC).partition(":")
    try:
        with warnings.catch_warnings():
            # pettingzoo >= 1.27 warns on importing its env modules (it prefers its registry);
            # importing the module is what a pettingzoo:<module> id asks for, on every version
            warnings.filterwarnings(
                "ignore", "The old environment creation API", DeprecationWarning
            )
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in ("pettingzoo", "mpe2"):
            raise PluginError(f"{env_id!r} needs {exc.name!r}: {INSTALL}") from None
        raise ConfigError(
            f"[run] env = {env_id!r}: cannot import module {module_name!r} ({exc}). Install the "
            f"package that provides it, or fix the id (pettingzoo:<module>[:<factory>])."
        ) from None
    return module, factory or None


def _accepted_keys(module: Any, constructor: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments ``constructor`` takes, when its signature (or, for the usual
    ``env(**kwargs)`` of PettingZoo modules, ``module.raw_env``'s) says; None if unknown."""
    for candidate in (constructor, getattr(module, "raw_env", None)):
        if candidate is None:
            continue
        try:
            params = inspect.signature(candidate).parameters.values()
        except (TypeError, ValueError):
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params):
            continue
        return {
            p.name
            for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
        }
    return None


def _close(name: str, choices: set[str]) -> str:
    """did_you_mean's suggestion, without its fallback list (the message lists them all)."""
    hint = did_you_mean(name, choices)
    return hint if hint.startswith(" Did you mean") else ""


def constructor(env_id: str, options: PettingZooConfig) -> Callable[[], Any]:
    """A zero-argument function building one env of ``env_id`` with ``options``, checked:
    it exists for the API ``options.api`` names and takes every keyword argument given."""
    module, factory = _import(env_id)
    aec = options.api == "aec"
    if factory is not None:
        build = getattr(module, factory, None)
        if not callable(build):
            raise ConfigError(
                f"[run] env = {env_id!r}: module {module.__name__!r} has no function {factory!r}."
            )
    else:
        name = "env" if aec else "parallel_env"
        build = getattr(module, name, None)
        if not callable(build):
            other = "parallel_env" if aec else "env"
            hint = (
                f" It has {other}(): set [env] api = {'parallel' if aec else 'aec'!r}."
                if callable(getattr(module, other, None))
                else " Is it a PettingZoo env module?"
            )
            raise ConfigError(
                f"[run] env = {env_id!r}: module {module.__name__!r} has no {name}() "
                f"([env] api = {options.api!r}).{hint}"
            )
    kwargs = options.env_kwargs()
    accepted = _accepted_keys(module, build)
    if accepted is not None:
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            raise ConfigError(
                f"[env] option {', '.join(map(repr, unknown))} is not an argument of "
                f"{env_id!r}.{_close(unknown[0], accepted)} Its arguments: "
                f"{', '.join(sorted(accepted)) or 'none'}."
            )
    return functools.partial(_build_one, env_id, build, kwargs, aec)


def _build_one(env_id: str, build: Callable[..., Any], kwargs: dict[str, Any], aec: bool) -> Any:
    from pettingzoo import AECEnv, ParallelEnv

    try:
        env = build(**kwargs)
    except TypeError as exc:
        found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if not found:
            raise
        raise ConfigError(
            f"[env] option {found.group(1)!r} is not an argument of {env_id!r} ({exc})."
        ) from None
    want = AECEnv if aec else ParallelEnv
    if not isinstance(env, want):
        got = type(env).__name__
        other = "parallel" if aec else "aec"
        env.close()
        raise ConfigError(
            f"[run] env = {env_id!r} built a {got}, not a {want.__name__} as [env] api = "
            f"{'aec' if aec else 'parallel'!r} asks for"
            + (f"; set [env] api = {other!r}." if isinstance(env, AECEnv | ParallelEnv) else ".")
        )
    return env


# ------------------------------------------------------------------------------------------
# The family


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: PettingZooConfig | None = None,
) -> Any:
    """A :class:`harness_pettingzoo.vector.MultiAgentVectorEnv` of ``num_envs`` copies, reset
    with ``seed`` when given. ``vector = 'async'`` is accepted and steps the copies in this
    process too: a multi-agent run gets its parallelism from the actor farm (``run.actors``),
    where each actor steps its own vector env."""
    options = options or PettingZooConfig()
    if vector not in ("sync", "async"):
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    if vector == "async":
        log.info("%s: vector = 'async' steps the copies in this process (see run.actors)", env_id)
    make_one = constructor(env_id, options)
    from harness_pettingzoo.vector import MultiAgentVectorEnv

    envs = MultiAgentVectorEnv(make_one, num_envs, aec=options.api == "aec", name=env_id)
    if seed is not None:
        envs.reset(seed=seed)
    return envs


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            "pettingzoo",
            make_env=make_env,
            accepts=accepts,
            config_cls=PettingZooConfig,
            known_ids=known_ids,
            description="multi-agent PettingZoo envs: mpe2/<task> (e.g. mpe2/simple_spread_v3) "
            "and pettingzoo:<module>[:<factory>] for any installed PettingZoo env",
        )
    ]
