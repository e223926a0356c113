"""What a plugin's subcommand needs to behave like the core commands.

A plugin adds ``harness NAME ...`` with a :class:`harness.registry.CommandSpec`; its
``add_arguments(parser)`` and ``run(args)`` use these helpers so that its ``--set``/``--config``
options, its ``-p`` flags, its ``PACK`` argument and its checkpoint loading mean what they mean
for ``harness run`` and ``harness eval``::

    from pathlib import Path

    from harness.commands import add_config_options, pack_file, plugins_for
    from harness.config import layer, resolve

    def add_arguments(parser):
        parser.add_argument("pack")
        add_config_options(parser, "override a config key of the pack")

    def run(args):
        _pm, registry = plugins_for(args)
        pack = pack_file(args.pack, registry)
        config = resolve(layer(pack, [Path(c) for c in args.configs], args.overrides), registry)
        ...

``harness.cli`` (the presentation layer: argparse, rich output, exit codes) is private; it
uses these same helpers.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.config import Config, RawConfig, RunConfig, find_pack_file, parse_override, resolve
from harness.errors import ConfigError, did_you_mean
from harness.plugins import HarnessPluginManager, collect_registry, make_plugin_manager
from harness.registry import Registry

__all__ = ["add_config_options", "checkpoint_config", "pack_file", "plugins_for"]


def add_config_options(parser: argparse.ArgumentParser, set_help: str) -> None:
    """``--set KEY=VALUE`` (into ``args.overrides``) and ``--config FILE`` (into
    ``args.configs``), both repeatable: how every command layers config over a pack."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=set_help,
    )
    parser.add_argument(
        "--config",
        dest="configs",
        action="append",
        default=[],
        metavar="FILE",
        help="a user config file layered over the pack (repeatable)",
    )


def plugins_for(args: argparse.Namespace) -> tuple[HarnessPluginManager, Registry]:
    """The plugin manager and registry for a command's parsed arguments (its ``-p`` flags,
    broken plugins reported on stderr): what a plugin's command needs to resolve configs."""
    return _load_plugins(*_plugin_flags(getattr(args, "plugins", [])))


def pack_file(pack: str, registry: Registry) -> Path:
    """The pack file of a CLI ``PACK`` argument: a pack directory, a .toml/.yaml file or a
    registered competition name (a clear error otherwise)."""
    return _pack_file(pack, registry)


def checkpoint_config(
    source: Path,
    overrides: Sequence[str],
    registry: Registry,
    *,
    extra: tuple[Mapping[str, Mapping[str, Any]], str] | None = None,
) -> tuple[Config, Path]:
    """The resolved config of a run directory's newest checkpoint (or of a checkpoint
    directory) with ``--set`` overrides, and that checkpoint: what ``harness eval`` and plugin
    commands that load a trained agent (``harness collect``) start from. ``extra`` is one more
    layer (values, origin) merged after the overrides and after the check that the checkpoint
    fits the config (an evaluation protocol may evaluate on another env id than the run's)."""
    # deferred: the runtime is not needed to parse arguments or list plugins
    from harness.checkpoint import latest_checkpoint, read_meta
    from harness.runtime.build import check_compatible

    ckpt = latest_checkpoint(source)
    meta = read_meta(ckpt)
    if "config" not in meta:
        raise ConfigError(f"{ckpt}: meta.json has no config; it was not written by harness run.")
    raw = RawConfig()
    raw.merge(meta["config"], str(ckpt / "meta.json"), for_algo=meta.get("algo"))
    for text in overrides:
        section, key, value = parse_override(text)
        raw.merge({section: {key: value}}, f"--set {text}")
    check_compatible(meta, RunConfig(**raw.sections["run"]), ckpt)
    if extra is not None:  # a deliberate layer (an evaluation protocol may change the env)
        raw.merge(*extra)
    return resolve(raw, registry), ckpt


def _plugin_flags(values: Sequence[str]) -> tuple[list[str], list[str]]:
    blocked = [v[3:] for v in values if v.startswith("no:")]
    load = [v for v in values if not v.startswith("no:")]
    return blocked, load


def _load_plugins(
    blocked: Sequence[str], load: Sequence[str]
) -> tuple[HarnessPluginManager, Registry]:
    pm = make_plugin_manager(blocked=blocked, load=load)  # (it warns once per broken plugin)
    return pm, collect_registry(pm)


def _pack_file(pack: str, registry: Registry) -> Path:
    if not os.path.exists(pack) and pack in registry.competitions:
        return registry.competitions.get(pack).pack_file
    if not os.path.exists(pack) and os.sep not in pack and registry.competitions:
        hint = did_you_mean(pack, registry.competitions)
        raise ConfigError(f"Pack {pack!r} is neither a path nor a registered competition.{hint}")
    return find_pack_file(pack)
