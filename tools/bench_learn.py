"""Wall-clock to the CartPole-v1 475 threshold: harness PPO vs Stable-Baselines3 PPO.

Run in the benchmark venv (it needs stable-baselines3, which harness itself does not):

    bash tools/bench_env.sh                             # creates .venv-bench (idempotent)
    .venv-bench/bin/python tools/bench_learn.py           # full run: 3 seeds x 4 configs
    .venv-bench/bin/python tools/bench_learn.py --quick   # smoke run: 1 seed

Both sides train PPO with the hyper-parameters of competitions/cartpole/pack.toml (8 envs x 32
steps, batch 256, 20 epochs, gamma 0.98, GAE 0.8, lr 1e-3 and clip 0.2 annealed linearly to 0,
no entropy bonus, vf_coef 0.5, max_grad_norm 0.5, Adam eps 1e-5, separate 64x64 tanh actor and
critic with orthogonal init) on a budget of 100k env steps, and follow one evaluation protocol:
after the first policy update at or past every 10k env steps, 20 greedy episodes spread over
8 envs (harness ``evaluate``; SB3 ``evaluate_policy``, which splits episodes over the envs the
same way); training stops as soon as an evaluation's mean return is >= 475. When the budget
runs out without that, both sides run one last evaluation (harness does so by itself) and the
run is counted as a failure.

The clock (``time.perf_counter``) starts after the imports (torch included on both sides) and
plugin discovery, right before env/model construction. "Wall-clock to 475" stops when the
evaluation that reaches the threshold has finished; "whole run" stops when training returns
and also counts what each framework does after that (harness: summary, final checkpoint,
learning-curve plot). Each run is a fresh subprocess; the configs
are interleaved seed by seed (rotated order) so load noise hits all of them.

Configs:

* ``harness``          the pack as shipped (trackers csv + tensorboard, checkpoints every 25k),
                       progress bar off; torch 1 thread ([backend] threads = 1 in the pack).
* ``harness-notrack``  the same with ``run.trackers=[]``.
* ``sb3-1t``           SB3 PPO, ``torch.set_num_threads(1)``.
* ``sb3-default``      SB3 PPO with torch's default thread count (context only).

Ratios are median harness wall-clock / median ``sb3-1t`` wall-clock. Runs that never reach 475
are failures: their wall-clock to threshold is infinite (so a median over 3 seeds is infinite
when 2 of them fail); their budget-run wall-clock is shown separately. ``s/100k steps``
(wall-clock divided by env steps trained) separates framework speed from sample efficiency.

Profile the harness side with, e.g.:

    .venv-bench/bin/python -m cProfile -o /tmp/h.prof tools/bench_learn.py --child harness --seed 1
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import benchlib

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "competitions" / "cartpole" / "pack.toml"
ENV_ID = "CartPole-v1"
CONFIGS = ("harness", "harness-notrack", "sb3-1t", "sb3-default")
BASELINE = "sb3-1t"
RESULT_TAG = "BENCH_LEARN_RESULT "

# The pack's [algo] section, spelled out for SB3 (read from the pack at run time and checked).
HPARAMS: dict[str, Any] = {**benchlib.ZOO_CARTPOLE_PPO, "hidden": [64, 64], "activation": "tanh"}


# ------------------------------------------------------------------------------------------
# Children: one training run each, printing one JSON line tagged RESULT_TAG


def child_harness(spec: benchlib.RunSpec, trackers: bool, keep: bool) -> dict[str, Any]:
    """The pack as shipped (``trackers`` off: ``run.trackers=[]``), with the runner's
    evaluation and checkpoint calls timed (the learning curve is a run-end hookimpl now,
    harness.builtin's, outside ``harness.runtime.run``)."""

    def make_config(registry: Any, run: list[str]) -> Any:
        from harness.config import layer, resolve

        overrides = run if trackers else [*run, "run.trackers=[]"]
        config = resolve(layer(PACK, [], overrides), registry)
        check_pack(config)
        return config

    timed = {"evaluate": "eval_s", "_checkpoint": "ckpt_s"}
    return benchlib.harness_child(make_config, spec, prefix="bench_learn_", timed=timed, keep=keep)


def check_pack(config: Any) -> None:
    """Fail loudly if the pack drifted from the hyper-parameters given to SB3."""
    algo, run = config.algo, config.run
    have = {k: getattr(algo, k) for k in HPARAMS if hasattr(algo, k)}
    have["num_envs"] = run.num_envs
    diff = {k: (have.get(k), v) for k, v in HPARAMS.items() if have.get(k) != v}
    extra = {
        "clip_vloss": (algo.clip_vloss, False),
        "normalize_advantage": (algo.normalize_advantage, True),
        "target_kl": (algo.target_kl, None),
        "threads": (config.backend.threads, 1),
    }
    diff.update({k: v for k, v in extra.items() if v[0] != v[1]})
    if diff:
        raise SystemExit(f"bench_learn: pack.toml differs from the SB3 settings: {diff}")


def child_sb3(spec: benchlib.RunSpec, one_thread: bool) -> dict[str, Any]:
    """SB3 PPO with the pack's settings (``one_thread``: ``torch.set_num_threads(1)``)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    if one_thread:
        torch.set_num_threads(1)
    seed = spec.seed
    clock = time.perf_counter(), time.process_time()
    env = make_vec_env(ENV_ID, n_envs=HPARAMS["num_envs"], seed=seed)
    eval_env = make_vec_env(ENV_ID, n_envs=min(8, spec.episodes), seed=10_000 + seed)
    model = PPO(
        "MlpPolicy", env, **benchlib.sb3_ppo_kwargs(HPARAMS, seed, torch.nn.Tanh, ortho_init=True)
    )
    return benchlib.sb3_learn(model, env, eval_env, spec, clock)


def child_main(args: argparse.Namespace) -> None:
    children = {
        "harness": partial(child_harness, trackers=True, keep=args.keep),
        "harness-notrack": partial(child_harness, trackers=False, keep=args.keep),
        "sb3-1t": partial(child_sb3, one_thread=True),
        "sb3-default": partial(child_sb3, one_thread=False),
    }
    benchlib.run_as_child(args, RESULT_TAG, children)


# ------------------------------------------------------------------------------------------
# Parent: interleaved subprocesses, tables


def report(results: list[dict[str, Any]], args: argparse.Namespace, header: dict[str, Any]) -> str:
    configs = benchlib.present(CONFIGS, results)
    lines = benchlib.run_table(results, configs, "framework", "475", threads=True)
    columns = [
        "reached 475",
        "median wall-clock to 475 s",
        "median wall-clock (all runs) s",
        "median steps to 475",
        "median s/100k steps",
        f"ratio to {BASELINE} (to 475)",
        f"ratio to {BASELINE} (s/100k steps)",
    ]
    lines += [
        "",
        *benchlib.summary_table(
            benchlib.medians(results, configs), "framework", columns, [BASELINE]
        ),
    ]
    head = [
        f"bench_learn {header['date']}: {header['machine']}; {header['versions']}; "
        f"seeds {args.seeds}; budget {args.budget}; eval every {args.eval_every} steps, "
        f"{args.eval_episodes} greedy episodes; threshold {args.threshold}; load average "
        f"(1/5/15 min) {benchlib.fmt_load(header['loadavg'])} at start, "
        f"{benchlib.fmt_load(header['loadavg_end'])} at end",
        "",
    ]
    return "\n".join(head + lines)


def versions() -> str:
    import gymnasium
    import stable_baselines3

    return (
        f"{benchlib.python_torch()}, stable-baselines3 {stable_baselines3.__version__}, gymnasium "
        f"{gymnasium.__version__}"
    )


def parent_main(args: argparse.Namespace) -> None:
    header = benchlib.machine(versions())
    benchlib.note_thread_env(header)
    results = benchlib.run_interleaved(__file__, RESULT_TAG, args.configs or CONFIGS, args)
    header["loadavg_end"] = os.getloadavg()
    print(report(results, args, header))
    if args.json:
        benchlib.write_json(args.json, header, args, results)


def main(argv: Sequence[str] | None = None) -> None:
    description = __doc__.split("\n\n")[0]
    p = benchlib.learning_parser(
        description, CONFIGS, f"subset of {CONFIGS}", budget=100_000, timeout=900
    )
    p.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args)
        return
    if args.quick:
        args.seeds = args.seeds[:1]
    parent_main(args)


if __name__ == "__main__":
    main()
