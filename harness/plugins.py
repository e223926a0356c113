"""The plugin manager factory. No global manager exists at import time: every caller (the CLI,
a test) builds its own, so tests never fight shared state.

Plugins are found through the ``harness`` entry-point group, first-party ones exactly like
third-party ones. A plugin that fails to import (or whose registration hook raises) is reported
by name and skipped; the rest keeps working. ``HARNESS_DISABLE_PLUGIN_AUTOLOAD=1`` disables
entry-point loading; ``-p no:NAME`` (``blocked``) blocks one plugin; ``HARNESS_TRACE=1``
(``trace``) logs every hook call.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata as md
import logging
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from harness import hookspecs
from harness.errors import ConfigError
from harness.registry import KINDS, Registry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "harness"
AUTOLOAD_ENV = "HARNESS_DISABLE_PLUGIN_AUTOLOAD"
TRACE_ENV = "HARNESS_TRACE"


@dataclass(frozen=True)
class PluginSelection:
    """Which plugins a process loads: the ``-p`` choices and the autoload switch, resolved once
    (the learner's ``HARNESS_DISABLE_PLUGIN_AUTOLOAD`` included). It travels with what every
    farm actor is built with, so actors on this host, a fork server's and a cluster worker's
    build exactly the learner's plugin set whatever their own environment says."""

    blocked: tuple[str, ...] = ()
    """``-p no:NAME`` (or ``NAME@DIST``) selectors."""
    load: tuple[str, ...] = ()
    """``-p NAME``: entry-point names or module paths loaded even with autoloading off."""
    autoload: bool = True
    """Whether entry-point plugins load (``HARNESS_DISABLE_PLUGIN_AUTOLOAD=1``: False)."""

    @classmethod
    def from_environment(cls) -> PluginSelection:
        """No ``-p`` choices; autoloading as this process's environment says."""
        return cls(autoload=_autoload_from_environment())

    def manager(self) -> HarnessPluginManager:
        """A plugin manager with this selection (tracing follows ``HARNESS_TRACE`` here)."""
        return make_plugin_manager(blocked=self.blocked, load=self.load, autoload=self.autoload)

    def load_plugins(self, where: str = "this process") -> tuple[HarnessPluginManager, Registry]:
        """The manager and registry of this selection, as another process of the run (a
        farm actor, a tune trial) builds them: a ``-p`` plugin that does not load here is an
        error naming it and ``where`` (the learner has it, so this process would otherwise
        run with another plugin set)."""
        pm = self.manager()
        missing = [name for name in self.load if name in pm.broken]
        if missing:
            name = missing[0]
            raise ConfigError(
                f"Plugin {name!r} (loaded by the learner with -p {name}) cannot be loaded in "
                f"{where}: {pm.broken[name]}. Install it on that host, or make the module "
                "importable there (PYTHONPATH, or the worker's working directory), then start "
                "again."
            )
        return pm, collect_registry(pm)

    def registry(self, where: str = "this process") -> Registry:
        """The registry of :meth:`load_plugins`."""
        return self.load_plugins(where)[1]


@dataclass
class PluginInfo:
    """What `harness plugins` shows for one plugin."""

    name: str
    module: str
    distribution: str = ""
    version: str = ""
    registers: dict[str, list[str]] = field(default_factory=dict)


class HarnessPluginManager(pluggy.PluginManager):
    """pluggy's manager plus the bookkeeping harness reports: origins, broken plugins and
    plugins skipped because another one holds their name."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.broken: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        """``NAME@DISTRIBUTION`` (or a module name) -> why it was not registered (a clash)."""
        self.blocked_names: set[str] = set()
        self.selection = PluginSelection()
        """What built this manager (:func:`make_plugin_manager` fills it in)."""

    def set_blocked(self, name: str) -> None:
        """Block ``NAME`` (every plugin of that name) or ``NAME@DISTRIBUTION`` (the entry point
        ``NAME`` of that distribution only)."""
        if "@" not in name:
            super().set_blocked(name)
        self.blocked_names.add(name)

    def is_blocked_entry_point(self, name: str, distribution: str) -> bool:
        return self.is_blocked(name) or f"{name}@{_canonical(distribution)}" in {
            _canonical_selector(b) for b in self.blocked_names
        }

    def register_plugin(
        self, plugin: Any, name: str, *, distribution: str = "", version: str = ""
    ) -> None:
        """Register ``plugin`` under ``name`` unless blocked, remembering where it came from. A
        plugin whose name or module is already registered is skipped with a warning."""
        if self.is_blocked(name):
            log.info("plugin %r is blocked; not registering it", name)
            return
        module = getattr(plugin, "__name__", type(plugin).__module__)
        try:
            self.register(plugin, name=name)
        except ValueError as exc:  # pluggy: that name, or that very module, is registered
            holder = self.get_name(plugin) or name
            self.skipped[f"{name}@{distribution}" if distribution else name] = (
                f"module {module} is already registered as plugin {holder!r} ({exc})"
            )
            warn_once(f"plugin {name!r} ({module}) was skipped: {exc}.")
            return
        self.infos[name] = PluginInfo(name, module, distribution, version)

    def mark_broken(self, name: str, error: BaseException) -> None:
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        self.broken[name] = detail
        warn_once(f"plugin {name!r} failed to load and was skipped: {detail}")
        plugin = self.get_plugin(name)
        if plugin is not None:
            self.unregister(plugin)
        self.infos.pop(name, None)


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning once per process: a broken or clashing plugin is reported
    once, however many managers the process builds (the CLI, a farm's fork server, tuning)."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


def _canonical(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def _canonical_selector(selector: str) -> str:
    name, _, dist = selector.partition("@")
    return f"{name}@{_canonical(dist)}" if dist else name


def make_plugin_manager(
    *,
    blocked: Iterable[str] = (),
    load: Iterable[str] = (),
    autoload: bool | None = None,
    trace: bool | None = None,
) -> HarnessPluginManager:
    """Build a manager: hookspecs, then entry-point plugins (unless disabled), then ``load``.

    ``load`` names entry points (loaded even when autoloading is off, like pytest's ``-p``) or
    importable modules.
    """
    pm = HarnessPluginManager()
    blocked, load = tuple(blocked), tuple(load)
    for name in blocked:
        pm.set_blocked(name)
    if autoload is None:
        autoload = _autoload_from_environment()
    if not pm.is_blocked("builtin"):
        from harness import builtin

        pm.register_plugin(builtin, "builtin", distribution="harness", version=_version())
    wanted = list(load)
    for ep in _entry_points(pm):
        if (autoload or ep.name in wanted) and not pm.is_blocked(ep.name):
            _load_entry_point(pm, ep)
        if ep.name in wanted:
            wanted.remove(ep.name)
    for module_name in wanted:
        if pm.is_blocked(module_name):
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a broken plugin must not take the rest down
            pm.mark_broken(module_name, exc)
            continue
        pm.register_plugin(module, module_name)
    # what other processes of this run load: a -p plugin broken here too is left out, so
    # only one that loads here and not there is an error there (PluginSelection.registry)
    pm.selection = PluginSelection(blocked, tuple(n for n in load if n not in pm.broken), autoload)
    if trace is None:
        trace = os.environ.get(TRACE_ENV, "").strip() in {"1", "true", "yes"}
    if trace:
        pm.trace.root.setwriter(lambda msg: log.info("hook: %s", msg.rstrip()))
        pm.enable_tracing()
    return pm


def _autoload_from_environment() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip() not in {"1", "true", "yes"}


def _version() -> str:
    from harness.version import __version__

    return __version__


def _entry_points(pm: HarnessPluginManager) -> list[md.EntryPoint]:
    """The group's entry points, one per name: where distributions clash on a name, harness's
    own keeps it (else the first found), and the others are recorded in ``pm.skipped`` with a
    warning that says how to rename or choose. ``-p no:NAME@DIST`` blocks one of them."""
    by_name: dict[str, list[md.EntryPoint]] = {}
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        dist = _dist_name(ep)
        if pm.is_blocked_entry_point(ep.name, dist):
            log.info("entry point %r of %s is blocked", ep.name, dist)
            continue
        same = by_name.setdefault(ep.name, [])
        if not any(_dist_name(e) == dist and e.value == ep.value for e in same):
            same.append(ep)  # (one distribution seen twice on sys.path is no clash)
    chosen = []
    for name, eps in by_name.items():
        eps.sort(key=lambda e: _dist_name(e) != "harness")  # stable: else the first found
        chosen.append(eps[0])
        for other in eps[1:]:
            dist = _dist_name(other)
            pm.skipped[f"{name}@{dist}"] = (
                f"entry point {name!r} = {other.value} of distribution {dist!r} clashes with "
                f"{eps[0].value} of {_dist_name(eps[0])!r}, which keeps the name"
            )
            warn_once(
                f"plugin name {name!r} is claimed by two distributions: "
                f"{_dist_name(eps[0])!r} ({eps[0].value}) keeps it, and {dist!r} "
                f"({other.value}) was skipped. Rename the entry point in {dist!r}'s packaging "
                f"(e.g. [project.entry-points.harness] {_canonical(dist).replace('-', '_')} = "
                f"...), or choose it with -p no:{name}@{_dist_name(eps[0])}."
            )
    return chosen


def _dist_name(ep: md.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ""


def _load_entry_point(pm: HarnessPluginManager, ep: md.EntryPoint) -> None:
    dist = ep.dist
    try:
        plugin = ep.load()
    except Exception as exc:  # a broken plugin must not take the rest down
        pm.mark_broken(ep.name, exc)
        return
    pm.register_plugin(
        plugin,
        ep.name,
        distribution=dist.name if dist else "",
        version=dist.version if dist else "",
    )


def collect_registry(pm: HarnessPluginManager) -> Registry:
    """Call every registration hook plugin by plugin, so each record knows its plugin.

    A plugin whose registration raises or returns something that is not a record is marked
    broken and skipped. A name two plugins register stays reachable for both as
    ``PLUGIN:NAME`` (:class:`harness.registry.Table`); the bare name prefers harness's own.
    """
    registry = Registry()
    for kind, record_type in KINDS.items():
        caller = getattr(pm.hook, f"harness_register_{kind}")
        table = getattr(registry, kind)
        for impl in caller.get_hookimpls():  # registration order, first plugin first
            name = impl.plugin_name
            if name in pm.broken:
                continue
            pm.trace.root.get("hook")(f"harness_register_{kind}", f"[plugin {name}]")
            try:
                records = list(impl.function() or ())
                for record in records:
                    if not isinstance(record, record_type):
                        raise TypeError(
                            f"harness_register_{kind} returned {type(record).__name__}, "
                            f"expected {record_type.__name__}"
                        )
            except Exception as exc:
                pm.mark_broken(name, exc)
                _drop_records_of(registry, name)
                continue
            info = pm.infos.get(name)
            first_party = info is not None and info.distribution == "harness"
            for record in records:
                table.add(dataclasses.replace(record, plugin=name), preferred=first_party)
                if info is not None:
                    info.registers.setdefault(kind, []).append(record.name)
    return registry


def _drop_records_of(registry: Registry, plugin: str) -> None:
    for kind in KINDS:
        table = getattr(registry, kind)
        for key in [k for k, r in table.items() if r.plugin == plugin]:
            del table.records[key]
