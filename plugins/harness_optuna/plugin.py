"""The optuna plugin: ``harness tune PACK`` (entry point ``optuna = harness_optuna.plugin``).

Only argparse and harness are imported here; optuna is imported when a study runs, so
``harness --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import hookimpl
from harness.registry import CommandSpec

DESCRIPTION = """\
Run an Optuna study over the search space in PACK's [tune] section.

Each trial is an in-process train(config) with the sampled values as overrides; it reports
the [tune] metric (default eval/mean_return) at every evaluation through trial.report, and
the pruner stops unpromising trials early (state PRUNED). The study ends when --trials
trials are COMPLETE or PRUNED in total.

Resume: run the same command again. The storage (default STUDY_DIR/study.db, SQLite) keeps
finished trials; a trial left RUNNING by a killed harness tune is marked FAIL and does not
count. Any Optuna storage URL works (postgresql://..., mysql://...); a path without :// is an
Optuna journal file.

Outputs in STUDY_DIR (= --out/--study): best.toml (harness run PACK --config best.toml
trains the best trial's config), trials/ (one run directory per trial), and the plots
optimization_history, param_importances, parallel_coordinate (.png; .html with plotly).
Watch it live: optuna-dashboard sqlite:///STUDY_DIR/study.db

The search space (docs/tuning.md):
  [tune]
  metric = "eval/mean_return"    direction = "maximize"    pruner = "median"
  trials = 20                    objective = "final"       # or "best"
  [tune.space]
  "algo.learning_rate" = { type = "float", low = 1e-4, high = 3e-3, log = true }
  "algo.n_epochs" = { type = "int", low = 4, high = 20, step = 4 }
  "algo.hidden" = { type = "categorical", choices = [[64, 64], [128, 128]] }
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.commands import add_config_options

    parser.add_argument("pack", help="pack directory, pack file or competition name")
    parser.add_argument(
        "--trials", type=int, help="finished (COMPLETE or PRUNED) trials to reach ([tune] trials)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="J",
        help="trials run concurrently as remote jobs (default 1: in this process); J > 1 "
        "starts an embedded local farm unless --cluster is given",
    )
    parser.add_argument("--study", help="study name (default: the pack directory's name)")
    parser.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage: an RDB URL or a journal file path (default "
        "sqlite:///STUDY_DIR/study.db)",
    )
    parser.add_argument(
        "--pruner",
        choices=("median", "halving", "hyperband", "none"),
        help="pruner ([tune] pruner, default median); options from [tune.pruners.NAME]",
    )
    parser.add_argument(
        "--out", default="studies", help="parent of the study directory (default: studies)"
    )
    add_config_options(
        parser, "override a config key for every trial, e.g. --set run.total_steps=20000"
    )
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run trials on a cluster (tcp://HOST:PORT of `harness cluster start`, or a Ray "
        "cluster's address with --transport ray); its workers must reach the storage",
    )
    parser.add_argument(
        "--transport",
        default="zmq",
        metavar="NAME",
        help="how --jobs trials are placed: zmq (default: the embedded local farm or a "
        "`harness cluster`) or ray (Ray actors: RAY_ADDRESS / --cluster, else a local Ray)",
    )
    parser.add_argument("--seed", type=int, help="seed of the sampler (TPE)")


def run(args: argparse.Namespace) -> int:
    """``harness tune``: validate, run the study, write and print the outputs."""
    from rich.console import Console

    from harness.commands import pack_file as find_pack
    from harness.commands import plugins_for
    from harness_optuna.report import summary_table, write_best, write_plots
    from harness_optuna.study import TuneRequest, base_pack_config, prepare, run_study

    pm, registry = plugins_for(args)
    pack_file = find_pack(args.pack, registry)
    request = TuneRequest(
        pack_file=pack_file,
        configs=[Path(c) for c in args.configs],
        sets=list(args.overrides),
        trials=args.trials,
        jobs=args.jobs,
        study=args.study,
        storage=args.storage,
        pruner=args.pruner,
        out=Path(args.out),
        cluster=args.cluster,
        transport=args.transport,
        seed=args.seed,
        plugins=pm.selection,
    )
    prep = prepare(request, registry)
    import optuna

    if not getattr(args, "verbose", 0):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = Console(width=max(120, Console().width))

    def notify(text: str) -> None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)
        sys.stdout.flush()

    study = run_study(prep, registry, notify)
    console.print(summary_table(study))
    best = write_best(study, pack_file, base_pack_config(pack_file, registry), prep.study_dir)
    plots = write_plots(study, prep.study_dir)
    if best is not None:
        console.print(
            f"best config: {best}\n  reproduce: harness run {pack_file} --config {best}",
            soft_wrap=True,
        )
    else:
        console.print("no trial completed: no best.toml")
    if plots:
        console.print("plots: " + ", ".join(str(p) for p in plots), soft_wrap=True)
    console.print(f"dashboard: optuna-dashboard {prep.storage_url}", soft_wrap=True)
    return 0


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "tune",
            add_arguments=add_arguments,
            run=run,
            help="tune a pack's hyper-parameters with Optuna",
            description=DESCRIPTION,
        )
    ]
