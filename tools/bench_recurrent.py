"""Recurrent PPO: wall-clock to 475 on CartPole-v1 with the velocities hidden, harness vs
SB3-contrib RecurrentPPO; and what a recurrent policy costs a farm actor per env step.

Run the learning comparison in the benchmark venv (it needs sb3-contrib, which harness itself
does not); the acting measurement needs harness only:

    bash tools/bench_env.sh                                    # creates .venv-bench (idempotent)
    .venv-bench/bin/python tools/bench_recurrent.py              # full: 3 seeds x 3 configs
    .venv-bench/bin/python tools/bench_recurrent.py --quick      # smoke run: 1 seed
    .venv/bin/python tools/bench_recurrent.py --acting           # acting cost per env step
    .venv/bin/python tools/bench_recurrent.py --acting --farm    # ... and over a 2-actor farm

The task is CartPole-v1 observed through entries [0, 2] only (cart position, pole angle): the
RL Zoo's ``CartPoleNoVel-v1``, a POMDP a policy solves only by remembering. harness hides the
velocities with ``env.obs_keep = [0, 2]``, SB3 with a gymnasium ObservationWrapper keeping the
same entries with the same bounds (the Zoo's MaskVelocityWrapper multiplies them by 0 instead:
the same information). Both sides train PPO with the RL Zoo's tuned RecurrentPPO entry for
CartPoleNoVel-v1 (rl-baselines3-zoo hyperparams/ppo_lstm.yml, unchanged since 2022-06, read at
v2.8.0): 8 envs x 32 steps, batch 256 (one minibatch of 8 whole sequences per epoch), 20
epochs, gamma 0.98, GAE 0.8, lr 1e-3 and clip 0.2 annealed linearly to 0, no entropy bonus,
``normalize: True`` (observations and rewards: VecNormalize with gamma 0.98, clip 10; harness
``algo.normalize_obs``, ``algo.normalize_reward``), LSTM of 64 units, ReLU heads of one 64-unit
layer each; SB3's defaults, spelled out the same on both sides: vf_coef 0.5, max_grad_norm 0.5,
Adam eps 1e-5, advantages normalized per minibatch. The harness side is the CartPole pack with
competitions/cartpole/masked_ppo.toml, plus ``algo.normalize_reward = true`` when that file
lacks it (the settings are checked at start). Not matched: the Zoo's ``ortho_init=False``
(torch's default init; harness initialises its layers orthogonally).

The recurrent layer is where the two differ, so the SB3 side runs in two shapes:

* ``harness``       ONE LSTM(64) over the observations; its output feeds a 64-unit ReLU actor
                    head and a 64-unit ReLU critic head; actor and critic losses both train the
                    LSTM (``algo.recurrent = "lstm"``, ``algo.rnn_hidden = 64``).
* ``sb3-zoo``       the Zoo entry exactly: RecurrentPPO's default shape, separate actor and
                    critic LSTMs (64 each, ``enable_critic_lstm=True``), each with its head:
                    twice harness's recurrent work. The baseline of the issue's target
                    (harness <= 0.5x its wall-clock to 475).
* ``sb3-shared``    the same with ``shared_lstm=True, enable_critic_lstm=False``: one LSTM,
                    both heads on its output, as harness, but SB3 detaches the critic's input,
                    so only the actor loss trains the LSTM. The closest shape and the cheaper
                    per step, but it learns worse (seed 1: best evaluation 418 in 100k steps,
                    where sb3-zoo reached 500 at 41k), so its ratio is shown beside the
                    baseline's rather than instead of it.
* ``harness-notrack``, ``harness-ff`` (not run by default): without trackers; feed-forward.

Evaluation protocol, clock and tables are tools/bench_learn.py's (read its docstring; the code
both share is in tools/benchlib.py): after the first policy update at or past every 10k env
steps, 20 greedy episodes over 8 envs with the recurrent state carried through each episode
(harness ``evaluate``; SB3 ``evaluate_policy``, which passes the LSTM states and episode starts
to ``predict``, on an eval VecNormalize synchronised with the training one, rewards
unnormalized), stop at the first mean >= 475; a run that never gets there is a failure
(infinite wall-clock to 475). The clock starts after the imports and plugin discovery. Each run
is a fresh subprocess; the configs are interleaved seed by seed in rotated order. torch runs on
one thread on both sides (the pack's ``[backend] threads = 1``; ``torch.set_num_threads(1)``
for SB3).

``--acting``: the farm acting cost of a recurrent policy vs a feed-forward one of the same
width (PPO with the settings above, ``algo.hidden = [64]``; recurrent: an LSTM or a GRU of 64
units before those heads; ``none``: the heads alone, on the observations): what a farm actor
does per chunk (``EnvStepper.rollout``: the agent's numpy ``sample``, the env step, the chunk
arrays, ``episodes_ended`` on episode ends), timed on 4 envs (a 2-actor farm's share of 8) in
interleaved rounds; µs per env step in all and in ``sample`` alone, and the ratio of each
recurrent kind to ``none`` (the issue's target: <= 1.5x). With ``--farm`` also a real 2-actor
run (ZeroMQ, embedded) per kind for ``--farm-steps`` env steps, reporting the farm's own
``farm/actor_sps_mean`` (env steps per second of stepping, per actor; its mean over the logged
rows after the first).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import benchlib

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "competitions" / "cartpole" / "pack.toml"
MASKED = REPO / "competitions" / "cartpole" / "masked_ppo.toml"
ENV_ID = "CartPole-v1"
KEEP = (0, 2)  # cart position, pole angle: the RL Zoo's CartPoleNoVel-v1
RNN_HIDDEN = 64
CONFIGS = ("harness", "harness-notrack", "harness-ff", "sb3-shared", "sb3-zoo")
DEFAULT_CONFIGS = ("harness", "sb3-shared", "sb3-zoo")
BASELINE = "sb3-zoo"
RESULT_TAG = "BENCH_RECURRENT_RESULT "

# The Zoo's CartPoleNoVel-v1 RecurrentPPO entry (see the docstring) in harness's names, with
# the SB3 defaults it relies on (also harness's):
ZOO: dict[str, Any] = {
    **benchlib.ZOO_CARTPOLE_PPO,
    "normalize_advantage": True,
    "clip_vloss": False,
    "target_kl": None,
    "normalize_obs": True,
    "normalize_reward": True,
    "clip_obs": 10.0,
    "clip_reward": 10.0,
    "hidden": [64],
    "activation": "relu",
    "recurrent": "lstm",
    "rnn_hidden": RNN_HIDDEN,
}
RECURRENT = ("algo.normalize_reward=true",)
HARNESS_OVERRIDES = {
    "harness": RECURRENT,
    "harness-notrack": (*RECURRENT, "run.trackers=[]"),
    "harness-ff": (*RECURRENT, 'algo.recurrent="none"'),
}
SB3_SHAPES: dict[str, dict[str, Any]] = {
    "sb3-zoo": {"lstm_hidden_size": RNN_HIDDEN, "enable_critic_lstm": True},
    "sb3-shared": {
        "lstm_hidden_size": RNN_HIDDEN,
        "shared_lstm": True,
        "enable_critic_lstm": False,
    },
}
ARCHITECTURE = (
    "harness: one LSTM(64) -> 64 ReLU actor head + 64 ReLU critic head, both losses train the "
    "LSTM; sb3-shared: one LSTM(64), both heads on it, critic input detached (only the actor "
    "loss trains it); sb3-zoo: actor LSTM(64) + critic LSTM(64), each with its head"
)


# ------------------------------------------------------------------------------------------
# Children: one training run each, printing one JSON line tagged RESULT_TAG


def harness_config(registry: Any, overrides: Sequence[str], recurrent: str = "lstm") -> Any:
    """The CartPole pack with masked_ppo.toml and ``overrides``, checked against ZOO (with
    ``algo.recurrent`` = ``recurrent``)."""
    from harness.config import layer, resolve

    config = resolve(layer(PACK, [MASKED], list(overrides)), registry)
    algo = config.algo
    want: dict[str, Any] = {**ZOO, "recurrent": recurrent}
    have = {k: getattr(algo, k, None) for k in want}
    have["num_envs"] = config.run.num_envs
    diff = {k: (have[k], v) for k, v in want.items() if have[k] != v}
    extra = {"obs_keep": (config.env.obs_keep, list(KEEP)), "threads": (config.backend.threads, 1)}
    diff.update({k: v for k, v in extra.items() if v[0] != v[1]})
    if recurrent == "none":
        diff.pop("rnn_hidden", None)
    if diff:
        raise SystemExit(f"bench_recurrent: harness settings differ from the Zoo's: {diff}")
    return config


def child_harness(config_name: str, spec: benchlib.RunSpec) -> dict[str, Any]:
    """The masked pack with ``HARNESS_OVERRIDES[config_name]``, checked against ZOO; the
    runner's evaluation calls timed."""
    recurrent = "none" if config_name == "harness-ff" else "lstm"

    def make_config(registry: Any, run: list[str]) -> Any:
        return harness_config(registry, [*run, *HARNESS_OVERRIDES[config_name]], recurrent)

    return benchlib.harness_child(
        make_config, spec, prefix="bench_recurrent_", timed={"evaluate": "eval_s"}
    )


def child_sb3(config_name: str, spec: benchlib.RunSpec) -> dict[str, Any]:
    """SB3-contrib RecurrentPPO with the Zoo entry in the LSTM shape ``SB3_SHAPES[config_name]``
    on the masked CartPole, observations and rewards normalised as the Zoo's."""
    import gymnasium as gym
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    h, seed = ZOO, spec.seed

    class KeepEntries(gym.ObservationWrapper):
        """The observation entries ``KEEP`` with their bounds (as harness's env.obs_keep)."""

        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.index = np.asarray(KEEP)
            space = env.observation_space
            self.observation_space = gym.spaces.Box(
                space.low[self.index], space.high[self.index], dtype=space.dtype
            )

        def observation(self, observation: Any) -> Any:
            return observation[self.index]

    clock = time.perf_counter(), time.process_time()
    env = make_vec_env(ENV_ID, n_envs=h["num_envs"], seed=seed, wrapper_class=KeepEntries)
    # the Zoo's `normalize: True`: observations and rewards, its gamma; the eval env uses the
    # training statistics frozen and reports raw rewards (the Zoo's and EvalCallback's way)
    env = VecNormalize(env, gamma=h["gamma"], clip_obs=h["clip_obs"], clip_reward=h["clip_reward"])
    eval_env = VecNormalize(
        make_vec_env(
            ENV_ID, n_envs=min(8, spec.episodes), seed=10_000 + seed, wrapper_class=KeepEntries
        ),
        training=False,
        norm_reward=False,
        clip_obs=h["clip_obs"],
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        normalize_advantage=h["normalize_advantage"],
        target_kl=h["target_kl"],
        **benchlib.sb3_ppo_kwargs(
            h, seed, torch.nn.ReLU, ortho_init=False, **SB3_SHAPES[config_name]
        ),
    )
    return benchlib.sb3_learn(model, env, eval_env, spec, clock, sync_normalization=True)


def child_main(args: argparse.Namespace) -> None:
    children = {name: partial(child_harness, name) for name in HARNESS_OVERRIDES}
    children.update({name: partial(child_sb3, name) for name in SB3_SHAPES})
    benchlib.run_as_child(args, RESULT_TAG, children)


# ------------------------------------------------------------------------------------------
# Parent: interleaved subprocesses, tables


def report(results: list[dict[str, Any]], args: argparse.Namespace, header: dict[str, Any]) -> str:
    t = args.threshold
    configs = benchlib.present(CONFIGS, results)
    lines = benchlib.run_table(results, configs, "config", f"{t:.0f}", threads=False)
    bases = [b for b in (BASELINE, "sb3-shared") if b in configs]
    columns = [f"reached {t:.0f}", f"median wall-clock to {t:.0f} s", "median wall-clock s"]
    columns += [f"median steps to {t:.0f}", "median s/100k steps"]
    for b in bases:
        columns += [f"ratio to {b} (to {t:.0f})", f"ratio to {b} (s/100k)"]
    lines += [
        "",
        *benchlib.summary_table(benchlib.medians(results, configs), "config", columns, bases),
    ]
    head = [
        f"bench_recurrent {header['date']}: {header['machine']}; {header['versions']}; "
        f"CartPole-v1 observing entries {list(KEEP)}; seeds {args.seeds}; budget "
        f"{args.budget}; eval every {args.eval_every} steps, {args.eval_episodes} greedy "
        f"episodes; threshold {t}; load average (1/5/15 min) "
        f"{benchlib.fmt_load(header['loadavg'])} at start, "
        f"{benchlib.fmt_load(header['loadavg_end'])} at end",
        f"Architectures: {ARCHITECTURE}. Baseline of the issue's target (<= 0.5x): {BASELINE}.",
        "",
    ]
    return "\n".join(head + lines)


def versions() -> str:
    import gymnasium

    text = f"{benchlib.python_torch()}, gymnasium {gymnasium.__version__}"
    try:
        import sb3_contrib
        import stable_baselines3
    except ImportError:
        return text
    return text + (
        f", stable-baselines3 {stable_baselines3.__version__}, sb3-contrib "
        f"{sb3_contrib.__version__}"
    )


def parent_main(args: argparse.Namespace) -> None:
    configs = args.configs or DEFAULT_CONFIGS
    if any(c in SB3_SHAPES for c in configs):
        try:
            import sb3_contrib  # noqa: F401
        except ImportError:
            raise SystemExit(
                "bench_recurrent: sb3-contrib is not installed here; run `bash "
                "tools/bench_env.sh` and use .venv-bench/bin/python (or --configs harness)."
            ) from None
    header = benchlib.machine(versions())
    benchlib.note_thread_env(header)
    results = benchlib.run_interleaved(__file__, RESULT_TAG, configs, args)
    header["loadavg_end"] = os.getloadavg()
    print(report(results, args, header))
    if args.json:
        benchlib.write_json(args.json, header, args, results)


# ------------------------------------------------------------------------------------------
# --acting: what a recurrent policy costs a farm actor per env step


def acting_costs(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """µs per env step of ``EnvStepper.rollout`` (all) and of the agent's ``sample`` (policy)
    for each kind, the best of ``args.rounds`` interleaved rounds (timeit's convention: load
    on a shared machine only ever adds time; the ratios of medians swung 1.2x-2x here)."""
    import numpy as np

    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime.build import make_agent, make_envs
    from harness.runtime.farm import acting_config
    from harness.runtime.spaces import env_info
    from harness.runtime.stepper import EnvStepper

    registry = collect_registry(make_plugin_manager())
    steppers: dict[str, tuple[Any, Any, dict[str, float]]] = {}
    for kind in args.kinds:
        config = acting_config(harness_config(registry, kind_overrides(kind), kind))
        envs = make_envs(config, registry, args.acting_envs, seed=None)
        agent = make_agent(config, registry, env_info(config.run.env, envs))
        agent.rng = np.random.default_rng([1, 0])
        clock = {"sample_s": 0.0}
        sample = agent.sample

        def timed_sample(obs: Any, sample: Any = sample, clock: dict[str, float] = clock) -> Any:
            t = time.perf_counter()
            try:
                return sample(obs)
            finally:
                clock["sample_s"] += time.perf_counter() - t

        agent.sample = timed_sample  # type: ignore[method-assign]
        stepper = EnvStepper(envs, 1)
        stepper.rollout(agent, config.algo.n_steps, [])  # warm-up
        steppers[kind] = (stepper, agent, clock)
    rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in args.kinds}
    for i in range(args.rounds):
        order = args.kinds[i % len(args.kinds) :] + args.kinds[: i % len(args.kinds)]
        for kind in order:
            stepper, agent, clock = steppers[kind]
            clock["sample_s"] = 0.0
            finished: list[Any] = []
            t = time.perf_counter()
            for _ in range(args.acting_chunks):
                stepper.rollout(agent, 32, finished)
            total = time.perf_counter() - t
            env_steps = args.acting_chunks * 32 * stepper.n
            rounds[kind].append((total / env_steps * 1e6, clock["sample_s"] / env_steps * 1e6))
    for stepper, _, _ in steppers.values():
        stepper.envs.close()
    return {
        k: {"all_us": min(a for a, _ in v), "sample_us": min(s for _, s in v)}
        for k, v in rounds.items()
    }


def kind_overrides(kind: str) -> list[str]:
    """The masked_ppo settings with ``algo.recurrent = kind`` (``none``: feed-forward, the
    same heads)."""
    return [*RECURRENT, f'algo.recurrent="{kind}"']


def farm_rates(args: argparse.Namespace) -> dict[str, float]:
    """``farm/actor_sps_mean`` of real 2-actor runs: per kind the median over every logged
    iteration but each run's first (the actors' start-up), ``--farm-rounds`` runs per kind in
    rotated order. One iteration is a 128-step chunk per actor (a few ms), so single rows are
    noisy on a busy machine: the median of many is the number to read."""
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    rows: dict[str, list[float]] = {k: [] for k in args.kinds}
    for i in range(args.farm_rounds):
        for kind in args.kinds[i % len(args.kinds) :] + args.kinds[: i % len(args.kinds)]:
            pm = make_plugin_manager()
            registry = collect_registry(pm)
            out = Path(tempfile.mkdtemp(prefix="bench_recurrent_farm_"))
            run = ["run.progress=false", f'run.out="{out}"', "run.actors=2"]
            run += [f"run.total_steps={args.farm_steps}", "run.eval_every=0", "run.log_every=0"]
            run += ["run.eval_episodes=0", "run.checkpoint_every=0", 'run.trackers=["csv"]']
            config = harness_config(registry, [*run, *kind_overrides(kind)], kind)
            result = train(config, registry, pm)
            with (Path(result.run_dir) / "metrics.csv").open(newline="") as f:
                values = [r["farm/actor_sps_mean"] for r in csv.DictReader(f)]
            rows[kind] += [float(v) for v in values if v][1:]
            shutil.rmtree(out, ignore_errors=True)
    return {k: statistics.median(v) if v else math.nan for k, v in rows.items()}


def acting_main(args: argparse.Namespace) -> None:
    header = benchlib.machine(versions())
    costs = acting_costs(args)
    base = costs.get("none")
    lines = [
        f"bench_recurrent --acting {header['date']}: {header['machine']}; {header['versions']}"
        f"; PPO on CartPole-v1 observing {list(KEEP)}, heads 64 ReLU, recurrent {RNN_HIDDEN}"
        f" units; {args.acting_envs} envs per actor, chunks of 32 vector steps, "
        f"{args.acting_chunks} chunks x {args.rounds} interleaved rounds (best); load "
        f"average {benchlib.fmt_load(header['loadavg'])} at start, "
        f"{benchlib.fmt_load(os.getloadavg())} at end",
        "",
        "| policy | µs per env step (rollout) | µs per env step (sample) | ratio to none "
        "(rollout) | ratio to none (sample) |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, c in costs.items():
        r_all = benchlib.ratio(c["all_us"], base["all_us"]) if base else "-"
        r_sample = benchlib.ratio(c["sample_us"], base["sample_us"]) if base else "-"
        lines.append(
            f"| {kind} | {c['all_us']:.1f} | {c['sample_us']:.1f} | {r_all} | {r_sample} |"
        )
    if args.farm:
        rates = farm_rates(args)
        lines += [
            "",
            f"2-actor farm (embedded ZeroMQ), 8 envs, {args.farm_rounds} runs of "
            f"{args.farm_steps} env steps per kind (median over iterations):",
            "",
            "| policy | farm/actor_sps_mean (env steps/s per actor) | cost ratio to none |",
            "|---|---:|---:|",
        ]
        for kind, sps in rates.items():
            cost = benchlib.ratio(rates["none"], sps) if "none" in rates else "-"
            lines.append(f"| {kind} | {sps:.0f} | {cost} |")
    print("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> None:
    description = __doc__.split("\n\n")[0]
    configs_help = f"default {DEFAULT_CONFIGS}"
    p = benchlib.learning_parser(description, CONFIGS, configs_help, budget=200_000, timeout=1800)
    p.add_argument("--acting", action="store_true", help="measure the acting cost instead")
    p.add_argument("--kinds", nargs="+", default=["none", "lstm", "gru"])
    p.add_argument("--acting-envs", type=int, default=4, help="envs per actor (--acting)")
    p.add_argument("--acting-chunks", type=int, default=30, help="chunks per round (--acting)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (--acting)")
    p.add_argument("--farm-rounds", type=int, default=3, help="farm runs per kind (--farm)")
    p.add_argument("--farm", action="store_true", help="--acting: also a 2-actor farm run")
    p.add_argument("--farm-steps", type=int, default=30_000, help="env steps per farm run")
    args = p.parse_args(argv)
    if args.child:
        child_main(args)
    elif args.acting:
        acting_main(args)
    else:
        if args.quick:
            args.seeds = args.seeds[:1]
        parent_main(args)


if __name__ == "__main__":
    main()
