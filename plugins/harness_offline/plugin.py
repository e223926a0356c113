"""The offline plugin: ``harness collect`` (entry point ``offline = harness_offline.plugin``).

Only argparse and harness are imported here; Minari, gymnasium and the backend are imported
when a dataset is recorded, so ``harness --help`` stays fast.
"""

from __future__ import annotations

import argparse

from harness import hookimpl
from harness.registry import CommandSpec

DESCRIPTION = """\
Record a Minari dataset (offline RL data) by rolling out a trained agent in its run's env.

SOURCE is a run directory of `harness run` (its newest checkpoint acts) or a checkpoint
directory inside one. The agent acts greedily; --noise adds Gaussian noise to box actions (std
in units of the half range of the action box, clipped to the box) or makes a discrete action
uniformly random with that probability (epsilon). With --policy random the actions are uniform
over the action space and SOURCE may also be a pack (directory, file or competition name):
only its env is used.

Episode i is reset with seed S + i (--seed S); Minari records each episode's seed, so every
episode can be replayed. The dataset is written with Minari's own API (DataCollector, HDF5
storage) to the directory --out names, which must not exist yet and must be named NAME-vN: the
Minari dataset id. No hub, no network.

Load it with Minari:      MINARI_DATASETS_PATH=data python -c "import minari;
                          print(minari.load_dataset('pendulum-medium-v0'))"
Train on it offline:      harness run competitions/pendulum --set algo=cql \\
                              --set algo.dataset=data/pendulum-medium-v0 --steps 20000

Examples:
  harness collect runs/Pendulum-v1__sac__1__1700000000 --episodes 50 --noise 0.1 \\
      --out data/pendulum-medium-v0
  harness collect competitions/pendulum --policy random --episodes 20 \\
      --out data/pendulum-random-v0
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.commands import add_config_options

    parser.add_argument(
        "source",
        help="run directory or checkpoint of `harness run`; with --policy random also a pack",
    )
    parser.add_argument(
        "--episodes", type=int, required=True, metavar="N", help="complete episodes to record"
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DATASET",
        help="dataset directory to create, named NAME-vN (e.g. data/pendulum-medium-v0)",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=0.0,
        metavar="STD",
        help="box: Gaussian action noise std (fraction of the half range); discrete: epsilon "
        "(default 0: the greedy policy)",
    )
    parser.add_argument(
        "--policy",
        choices=("agent", "random"),
        default="agent",
        help="agent: SOURCE's trained policy (default); random: uniform random actions",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="episode i is reset with seed S + i; also seeds the noise (default 0)",
    )
    add_config_options(parser, "override a config key of SOURCE (e.g. --set backend.device=cpu)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.commands import plugins_for
    from harness_offline.collect import collect

    _pm, registry = plugins_for(args)
    result = collect(
        args.source,
        registry,
        episodes=args.episodes,
        out=Path(args.out),
        noise=args.noise,
        policy=args.policy,
        seed=args.seed,
        overrides=args.overrides,
        configs=args.configs,
    )
    print(result.summary())
    return 0


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "collect",
            add_arguments,
            run,
            help="record a Minari dataset from a trained run (or random actions)",
            description=DESCRIPTION,
        )
    ]
