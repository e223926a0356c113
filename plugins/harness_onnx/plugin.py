"""The onnx plugin: ``harness export RUN`` (entry point ``onnx = harness_onnx.plugin``).

Only argparse and harness are imported here; onnx, onnxruntime and the backend are imported
when a policy is exported, so ``harness --help`` stays fast.
"""

from __future__ import annotations

import argparse

from harness import hookimpl
from harness.registry import CommandSpec

DESCRIPTION = """\
Write a run's greedy policy (the actions `harness eval` takes) as a self-contained ONNX file,
e.g. a MyoChallenge submission (`evalmc submit-onnx FILE`).

RUN is a run directory of `harness run` (its newest checkpoint, or --checkpoint NAME under
RUN/checkpoints) or a checkpoint directory inside one. The graph is built from the policy's
numpy weights, so runs of every backend (torch, paddle) export alike, and no framework is
needed to run it: onnxruntime alone.

Graph interface (docs/export.md):
  input  obs        float32 (batch, obs_dim)     the env's observations, flattened
  output action     float32 (batch, act_dim)     box actions as `harness eval` sends them
                    int64   (batch,)             discrete actions
  recurrent policies (algo.recurrent = "lstm" | "gru") also have
  input  state      float32 (batch, state_size)  zeros at an episode's start (LSTM: h then c)
  output state_out  float32 (batch, state_size)  feed it back as `state` at the next step
Observation standardisation (algo.normalize_obs) is inside the graph. The model's metadata
names the harness version, algo, env id, dims and recurrent kind.

Before writing, onnxruntime runs the graph on probe observations and its actions must equal
the numpy policy's. Exportable: PPO, A2C, PG, IMPALA (MLP or LSTM/GRU over flat
observations), SAC, TD3, DQN.

Examples:
  harness export runs/myoChallengeDieReorientP1-v0__ppo__1__1700000000
  harness export runs/Pendulum-v1__sac__1__1700000000 --out pendulum_sac.onnx
  harness export RUN --checkpoint step_000200000 --set backend.device=cpu
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory of `harness run`, or a checkpoint inside it")
    parser.add_argument(
        "--format",
        choices=("onnx",),
        default="onnx",
        help="file format (default and only choice: onnx)",
    )
    parser.add_argument("--out", metavar="FILE", help="where to write (default: RUN/policy.onnx)")
    parser.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="a checkpoint under RUN/checkpoints, e.g. step_000200000 (default: the newest)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the run's config (e.g. --set backend.device=cpu)",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.commands import plugins_for
    from harness_onnx.export import export

    _pm, registry = plugins_for(args)
    result = export(
        Path(args.run),
        registry,
        out=None if args.out is None else Path(args.out),
        checkpoint=args.checkpoint,
        overrides=args.overrides,
    )
    print(result.summary())
    return 0


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "export",
            add_arguments,
            run,
            help="write a run's greedy policy as an ONNX file (onnxruntime runs it)",
            description=DESCRIPTION,
        )
    ]
