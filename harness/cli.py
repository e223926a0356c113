"""The ``harness`` command: run | eval | plugins.

This module is the presentation layer: it parses arguments, builds a plugin manager, prints
(rich) and maps :class:`harness.errors.HarnessError` to a one-paragraph message and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# the helpers a plugin's subcommand shares with the core commands live in harness.commands
from harness.commands import _load_plugins, _pack_file, _plugin_flags, add_config_options

# re-exported for plugins written before harness.commands (which imported them from here)
from harness.commands import checkpoint_config as checkpoint_config
from harness.commands import pack_file as pack_file
from harness.commands import plugins_for as plugins_for
from harness.config import RunConfig, describe, layer, resolve
from harness.errors import ConfigError, HarnessError, missing_extra
from harness.plugins import HarnessPluginManager
from harness.registry import KINDS
from harness.version import __version__

log = logging.getLogger("harness")

EXIT_USAGE = 2
EXIT_TERMINATED = 128 + 15
"""``harness run`` stopped by SIGTERM (after a checkpoint): the shell's code for that signal."""


CORE_COMMANDS = ("run", "eval", "plugins", "checkpoint")

PLUGIN_COMMANDS: Mapping[str, tuple[str, str | None]] = {
    "cluster": ("zmq", "zmq"),
    "collect": ("offline", "offline"),
    "export": ("onnx", "onnx"),
    "report": ("report", None),
    "tune": ("optuna", "tune"),
}
"""First-party plugins' commands -> (plugin, extra): where one is missing (its plugin blocked,
broken or not installed) the error names what brings it back, not argparse's 'invalid
choice'. The commands themselves are the plugins' ``CommandSpec`` records."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, sub, common = _parser()
    pm = _add_plugin_commands(sub, common, argv) if _wants_plugin_commands(argv) else None
    missing = _missing_plugin_command(_command_word(argv), sub.choices, pm)
    if missing is not None:
        print(f"harness: error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.plugins = [*args.plugins_top, *getattr(args, "plugins", [])]
    args.argv = argv  # (harness eval records the command that reproduces it)
    logging.basicConfig(
        level=logging.DEBUG
        if args.verbose > 1
        else logging.INFO
        if args.verbose
        else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        result: int = args.func(args)
        return result
    except HarnessError as exc:
        if args.debug:
            raise
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:  # an optional extra that is not installed
        error = missing_extra(exc)
        if error is None or args.debug:
            raise
        print(f"harness: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        hint = "; resume with --resume RUN_DIR" if args.command == "run" else ""
        print(f"harness: interrupted{hint}", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------------
# Argument parsing


def _help_epilog() -> str:
    lines = ["run options ([run] section of a pack file, or --set KEY=VALUE):"]
    lines += _rows(describe(RunConfig))
    try:
        _, registry = _load_plugins([], [])
    except HarnessError:
        return "\n".join(lines)
    for name, spec in registry.algorithms.items():
        lines += ["", f"algorithm {name!r} options ([algo] section, --set algo.KEY=VALUE):"]
        lines += _rows(describe(spec.config_cls, "algo."))
    for name, bspec in registry.backends.items():
        if bspec.config_cls is not None:
            lines += ["", f"backend {name!r} options ([backend] section):"]
            lines += _rows(describe(bspec.config_cls, "backend."))
    for name, espec in registry.envs.items():
        if espec.config_cls is not None:
            lines += ["", f"env family {name!r} options ([env] section):"]
            lines += _rows(describe(espec.config_cls, "env."))
    lines += [
        "",
        "precedence: defaults < HARNESS_BACKEND < pack file < --config files < --set",
    ]
    return "\n".join(lines)


def _rows(rows: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for key, default, doc in rows:
        out.append(f"  {key} = {default}")
        out += textwrap.wrap(doc, 92, initial_indent="      ", subsequent_indent="      ")
    return out


class _LazyEpilogParser(argparse.ArgumentParser):
    """Builds the long config listing only when --help is printed."""

    def format_help(self) -> str:
        if self.epilog is None:
            self.epilog = _help_epilog()
        return super().format_help()


def _common(top: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the subcommand (``harness -p no:x run ...`` and
    ``harness run -p no:x ...``). Subcommand copies default to SUPPRESS so they do not
    overwrite what was given before the subcommand; ``-p`` values from both places add up."""
    common = argparse.ArgumentParser(add_help=False)
    default: Any = None if top else argparse.SUPPRESS
    common.add_argument(
        "-p",
        dest="plugins_top" if top else "plugins",
        action="append",
        default=[] if top else argparse.SUPPRESS,
        metavar="NAME",
        help="load plugin NAME (an entry point or module) even with autoloading off; "
        "-p no:NAME blocks plugin NAME, -p no:NAME@DIST only distribution DIST's entry point "
        "NAME (where two distributions claim one name)",
    )
    common.add_argument(
        "--debug",
        action="store_true",
        default=False if top else default,
        help="show tracebacks for errors",
    )
    common.add_argument(
        "-v", "--verbose", action="count", default=0 if top else default, help="more logging"
    )
    return common


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first word that is neither an option nor a -p value)."""
    return next(
        (
            a
            for i, a in enumerate(argv)
            if not a.startswith("-") and (i == 0 or argv[i - 1] != "-p")
        ),
        None,
    )


def _wants_plugin_commands(argv: Sequence[str]) -> bool:
    """Whether argv names no core command (a plugin's, or none: ``--help`` lists them all);
    only then are plugins loaded before parsing."""
    command = _command_word(argv)
    if command in CORE_COMMANDS:
        return False
    return command is not None or any(a in ("-h", "--help") for a in argv)


def _missing_plugin_command(
    command: str | None, known: Mapping[str, Any], pm: HarnessPluginManager | None
) -> str | None:
    """The error for a first-party plugin's command that no loaded plugin registers
    (:data:`PLUGIN_COMMANDS`), naming the plugin and its extra; None otherwise."""
    if command is None or command in known or command not in PLUGIN_COMMANDS:
        return None
    plugin, extra = PLUGIN_COMMANDS[command]
    install = f" (pip install 'harness[{extra}]')" if extra else ""
    if pm is not None and plugin in pm.blocked_names:
        why = f"it is blocked here (-p no:{plugin}): drop that flag"
    elif pm is not None and plugin in pm.broken:
        why = f"it failed to load ({pm.broken[plugin]}): `harness plugins` lists why"
    else:
        why = (
            f"it is not loaded: install it, or with HARNESS_DISABLE_PLUGIN_AUTOLOAD=1 load it "
            f"with -p {plugin}"
        )
    return f"harness {command} is the {plugin!r} plugin's command{install}, and {why}."


def _add_plugin_commands(
    sub: Any, common: argparse.ArgumentParser, argv: Sequence[str]
) -> HarnessPluginManager | None:
    """Subcommands registered by plugins (``harness_register_commands``), with the -p flags
    given so far; the plugin manager they came from (None when plugins could not load)."""
    flags = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-p"]
    try:
        pm, registry = _load_plugins(*_plugin_flags(flags))
    except HarnessError as exc:
        log.debug("plugin commands unavailable: %s", exc)
        return None
    for name, spec in registry.commands.items():
        if name in CORE_COMMANDS:
            continue
        cmd = sub.add_parser(
            name,
            parents=[common],
            help=f"{spec.help} (plugin {spec.plugin})",
            description=spec.description or spec.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        spec.add_arguments(cmd)
        cmd.set_defaults(func=spec.run)
    return pm


def _parser() -> tuple[argparse.ArgumentParser, Any, argparse.ArgumentParser]:
    common = _common(top=False)
    parser = argparse.ArgumentParser(
        prog="harness",
        description="A plugin-based harness for (distributed) reinforcement learning.",
        parents=[_common(top=True)],
        epilog="Plugins: HARNESS_DISABLE_PLUGIN_AUTOLOAD=1 disables entry-point loading, "
        "HARNESS_TRACE=1 logs every hook call (with -v).",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=argparse.ArgumentParser)

    run = sub.add_parser(
        "run",
        parents=[common],
        help="train a pack",
        description="Train a competition pack or config file. PACK is a pack directory "
        "(e.g. competitions/cartpole), a .toml/.yaml file, or a registered competition name.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.__class__ = _LazyEpilogParser
    run.epilog = None
    run.add_argument("pack", nargs="?", help="pack directory, pack file or competition name")
    run.add_argument("--steps", type=int, help="total env steps (run.total_steps)")
    run.add_argument("--seed", type=int, help="seed (run.seed)")
    run.add_argument(
        "--actors",
        type=int,
        help="farm actor processes (run.actors; -1: one per core); run.num_envs is raised to "
        "at least this",
    )
    run.add_argument(
        "--out",
        help="parent directory for run directories (run.out): a writable directory (made if "
        "missing) with room for a checkpoint, checked before training",
    )
    add_config_options(
        run, "override a config key, e.g. --set algo.learning_rate=3e-4 (bare KEY = run.KEY)"
    )
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its last checkpoint (checked before anything is written; "
        "refused while another process holds the run directory's lock)",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr: neither the live bar (on a terminal) nor the plain lines "
        "every run.progress_every_s seconds (elsewhere)",
    )
    run.set_defaults(func=cmd_run)

    ev = sub.add_parser("eval", parents=[common], help="evaluate a checkpoint greedily")
    ev.add_argument("checkpoint", help="a run directory or a checkpoint directory inside it")
    ev.add_argument(
        "--episodes",
        type=int,
        help="episodes to run (default 20, 3 with --video, or the number the --protocol's "
        "challenge used)",
    )
    ev.add_argument("--seed", type=int, default=12345, help="env seed for evaluation")
    ev.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the checkpoint's config (e.g. --set backend.device=cpu)",
    )
    ev.add_argument(
        "--round",
        type=int,
        metavar="N",
        help="deprecated (to be removed in the next release): the same as --protocol roundN",
    )
    ev.add_argument(
        "--protocol",
        metavar="NAME",
        help="a competition's evaluation protocol for the run's env, as its env family "
        "declares them (e.g. 'official': a MyoChallenge's phase-2 settings and episode count; "
        "'round2': an OpenSim competition's round 2 rules and episode length), on the "
        "challenge's own task whatever the run's curriculum reached; prints the challenge's "
        "score",
    )
    ev.add_argument(
        "--video",
        action="store_true",
        help="film every evaluated episode (one env, episodes in sequence): "
        "RUN/videos/CHECKPOINT[-PROTOCOL].mp4, a small .gif and a -filmstrip.png of the first "
        "episode (docs/video.md)",
    )
    ev.add_argument(
        "--fps",
        type=float,
        help="--video: frames per second of the films (default: the env's render_fps, else 30)",
    )
    ev.add_argument(
        "--video-width",
        type=int,
        metavar="PX",
        help="--video: scale frames wider than PX pixels down in the MP4 (ffmpeg, on its own "
        "core; default: the rendered size). Where the encoder cannot keep up with a fast "
        "renderer (CartPole's 600 px on 2 cores), --video-width 300 keeps filming cheap",
    )
    ev.set_defaults(func=_cmd_eval)

    from harness import checkpoint_cli  # (argparse and the checkpoint layout only)

    ck = sub.add_parser(
        "checkpoint",
        parents=[common],
        help="convert checkpoints of earlier versions (pickles) once, with --trust",
        description=checkpoint_cli.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    checkpoint_cli.add_arguments(ck)
    ck.set_defaults(func=checkpoint_cli.run)

    pl = sub.add_parser("plugins", parents=[common], help="list plugins and what they register")
    pl.set_defaults(func=cmd_plugins)
    return parser, sub, common


# ------------------------------------------------------------------------------------------
# Commands


def cmd_run(args: argparse.Namespace) -> int:
    from harness.runtime import train
    from harness.runtime.build import farm_size

    pm, registry = _load_plugins(*_plugin_flags(args.plugins))
    resume = Path(args.resume) if args.resume else None
    if args.pack is None and resume is None:
        raise ConfigError(
            "harness run needs a PACK (e.g. competitions/cartpole) or --resume RUN_DIR."
        )
    if args.pack is not None:
        pack_file = _pack_file(args.pack, registry)
    else:
        assert resume is not None
        pack_file = resume / "config.toml"
        if not pack_file.is_file():
            raise ConfigError(
                f"--resume {resume}: no config.toml there; is it a harness run directory?"
            )
    overrides = list(args.overrides)
    for flag, key in (
        (args.steps, "total_steps"),
        (args.seed, "seed"),
        (args.out, "out"),
        (args.actors, "actors"),
    ):
        if flag is not None:
            overrides.insert(0, f"run.{key}={_toml_literal(flag)}")
    if args.no_progress:
        overrides.insert(0, "run.progress=false")
    raw = layer(pack_file, [Path(c) for c in args.configs], overrides)
    # --actors N raises run.num_envs before resolving, so the checks and config.toml see it;
    # -1 (one actor per core) is made concrete by build_run with the same farm_size
    if args.actors is not None and args.actors > 0:
        num_envs = raw.sections["run"].get("num_envs", RunConfig.num_envs)
        if isinstance(num_envs, int):  # (else resolve names the bad value)
            _, wanted = farm_size(args.actors, num_envs)
            if wanted != num_envs:
                raw.merge({"run": {"num_envs": wanted}}, "--actors")
    config = resolve(raw, registry)
    if config.run.progress:  # a bar on a terminal; plain lines in logs (nohup, CI, batch jobs)
        from harness.progress import LineProgressReporter, RichProgressReporter

        total = config.run.total_steps
        if sys.stderr.isatty():
            pm.register(RichProgressReporter(total), name="progress")
        elif config.run.progress_every_s > 0:
            every = config.run.progress_every_s
            limit = config.run.max_seconds  # (the ETA is the sooner of steps and time)
            pm.register(LineProgressReporter(total, every, max_seconds=limit), name="progress")
    result = train(config, registry, pm, resume=resume, stop_on_sigterm=True)
    _print_summary(_written_summary(result.as_dict(), result.run_dir))
    if result.terminated:
        print(
            f"harness: terminated (SIGTERM) at step {result.steps}, checkpoint written; resume "
            f"with harness run --resume {result.run_dir}",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    return 0


def _toml_literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _cmd_eval(args: argparse.Namespace) -> int:
    from harness import eval_cli  # (the evaluation's own module, imported when it runs)

    return eval_cli.cmd_eval(args)


def cmd_plugins(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    pm, registry = _load_plugins(*_plugin_flags(args.plugins))
    table = Table(title="harness plugins", show_lines=False)
    for column in ("plugin", "distribution", "version", "module", "registers"):
        table.add_column(column)
    for name, info in sorted(pm.infos.items()):
        registers = "; ".join(
            f"{kind}: {', '.join(names)}" for kind, names in info.registers.items()
        )
        table.add_row(
            name, info.distribution or "-", info.version or "-", info.module, registers or "-"
        )
    console = Console(width=160)
    console.print(table)
    for name, error in sorted(pm.broken.items()):
        console.print(f"[red]broken[/red] {name}: {error}", markup=True, highlight=False)
    for name, why in sorted(pm.skipped.items()):
        console.print(f"[yellow]skipped[/yellow] {name}: {why}", markup=True, highlight=False)
    for kind in KINDS:
        table_of_kind = getattr(registry, kind)
        for clashed in sorted(table_of_kind.clashes):
            console.print(
                f"[yellow]clash[/yellow] {table_of_kind.clash_message(clashed)}",
                markup=True,
                highlight=False,
            )
    for name in sorted(pm.blocked_names):
        console.print(
            f"[yellow]blocked[/yellow] {name} (-p no:{name})", markup=True, highlight=False
        )
    return 0


def _written_summary(summary: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The summary as ``summary.json`` has it (with the official score ``eval/score`` where
    the env reports one), less the nested per-metric table; ``summary`` if it is unreadable."""
    try:
        written = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return summary
    if not isinstance(written, dict):
        return summary
    written.pop("final_eval_metrics", None)
    return written


def _print_summary(summary: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    for key, value in summary.items():
        shown = f"{value:.2f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        table.add_row(key, shown)
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
