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
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import cpus_and_model

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "competitions" / "cartpole" / "pack.toml"
ENV_ID = "CartPole-v1"
CONFIGS = ("harness", "harness-notrack", "sb3-1t", "sb3-default")
BASELINE = "sb3-1t"
RESULT_TAG = "BENCH_LEARN_RESULT "

# The pack's [algo] section, spelled out for SB3 (read from the pack at run time and checked).
HPARAMS = {
    "num_envs": 8,
    "n_steps": 32,
    "batch_size": 256,
    "n_epochs": 20,
    "gamma": 0.98,
    "gae_lambda": 0.8,
    "learning_rate": 1e-3,
    "anneal_lr": True,
    "clip_range": 0.2,
    "anneal_clip": True,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "hidden": [64, 64],
    "activation": "tanh",
}


# ------------------------------------------------------------------------------------------
# Children: one training run each, printing one JSON line tagged RESULT_TAG


def child_harness(
    seed: int, budget: int, threshold: float, every: int, episodes: int, trackers: bool, keep: bool
) -> dict[str, Any]:
    import harness.runtime.run as runmod
    from harness import hookimpl
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    out = Path(tempfile.mkdtemp(prefix="bench_learn_"))
    overrides = [
        "run.progress=false",
        f'run.out="{out}"',
        f"run.seed={seed}",
        f"run.total_steps={budget}",
        f"run.eval_every={every}",
        f"run.eval_episodes={episodes}",
        f"run.stop_at_return={float(threshold)}",
    ]
    if not trackers:
        overrides.append("run.trackers=[]")
    config = resolve(layer(PACK, [], overrides), registry)
    check_pack(config)

    # Instrumentation only: time the runner's evaluation, checkpoint and plot calls (module
    # globals that train() looks up at call time) and keep the evaluation history.
    timers = {"eval_s": 0.0, "ckpt_s": 0.0, "plot_s": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timers[name] += time.perf_counter() - t

        return wrapper

    runmod.evaluate = timed("eval_s", runmod.evaluate)
    runmod._checkpoint = timed("ckpt_s", runmod._checkpoint)
    runmod._plot = timed("plot_s", runmod._plot)

    class Recorder:
        def __init__(self) -> None:
            self.evals: list[tuple[int, float]] = []
            self.threshold_s = math.inf

        @hookimpl
        def harness_iteration_end(self, run: Any, metrics: Any) -> None:
            if metrics.get("eval/mean_return", -math.inf) >= threshold and math.isinf(
                self.threshold_s
            ):
                self.threshold_s = time.perf_counter() - t0

        @hookimpl
        def harness_run_end(self, run: Any, summary: Any) -> None:
            self.evals = [(int(s), float(m)) for s, m in run.eval_history]

    recorder = Recorder()
    pm.register(recorder, name="bench_learn_recorder")
    # SB3's side imports torch before its clock starts (stable_baselines3 imports it): do the
    # same here, where the backend plugin would otherwise import it lazily inside train().
    import torch

    import harness_torch.backend  # noqa: F401

    cpu0, t0 = time.process_time(), time.perf_counter()
    result = runmod.train(config, registry, pm)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "steps": result.steps,
        "evals": recorder.evals,
        "torch_threads": torch.get_num_threads(),
        "runner_wall_s": result.wall_time,
        "threshold_s": recorder.threshold_s,
        **timers,
    }


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


class Linear:
    """SB3 schedule: ``value * progress_remaining``, clamped at 0 like harness's anneal."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, progress_remaining: float) -> float:
        return self.value * min(max(progress_remaining, 0.0), 1.0)


def child_sb3(
    seed: int, budget: int, threshold: float, every: int, episodes: int, one_thread: bool
) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    if one_thread:
        torch.set_num_threads(1)
    h = HPARAMS

    class EvalAfterUpdate(BaseCallback):
        """harness's protocol: evaluate after the first update at or past every ``every`` steps
        (i.e. at the start of the next rollout), stop once the mean reaches ``threshold``;
        one last evaluation at the end when the budget runs out."""

        def __init__(self, eval_env: Any) -> None:
            super().__init__()
            self.eval_env = eval_env
            self.next_eval = every
            self.evals: list[tuple[int, float]] = []
            self.stop = False
            self.eval_s = 0.0
            self.threshold_s = math.inf

        def _evaluate(self) -> float:
            t = time.perf_counter()
            self.eval_env.seed(10_000 + seed + self.num_timesteps)
            rewards, _ = evaluate_policy(
                self.model,
                self.eval_env,
                n_eval_episodes=episodes,
                deterministic=True,
                return_episode_rewards=True,
            )
            mean = float(sum(rewards) / len(rewards))
            self.evals.append((self.num_timesteps, mean))
            self.eval_s += time.perf_counter() - t
            return mean

        def _on_rollout_start(self) -> None:
            if self.num_timesteps >= self.next_eval:
                mean = self._evaluate()
                self.next_eval = self.num_timesteps + every
                self.stop = mean >= threshold
                if self.stop:
                    self.threshold_s = time.perf_counter() - t0

        def _on_step(self) -> bool:
            return not self.stop

        def _on_training_end(self) -> None:
            if not self.stop and (not self.evals or self.evals[-1][0] != self.num_timesteps):
                self._evaluate()

    cpu0, t0 = time.process_time(), time.perf_counter()
    env = make_vec_env(ENV_ID, n_envs=h["num_envs"], seed=seed)
    eval_env = make_vec_env(ENV_ID, n_envs=min(8, episodes), seed=10_000 + seed)
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=Linear(h["learning_rate"]),
        n_steps=h["n_steps"],
        batch_size=h["batch_size"],
        n_epochs=h["n_epochs"],
        gamma=h["gamma"],
        gae_lambda=h["gae_lambda"],
        clip_range=Linear(h["clip_range"]),
        ent_coef=h["ent_coef"],
        vf_coef=h["vf_coef"],
        max_grad_norm=h["max_grad_norm"],
        policy_kwargs={
            "net_arch": {"pi": h["hidden"], "vf": h["hidden"]},
            "activation_fn": torch.nn.Tanh,
            "ortho_init": True,
        },
        seed=seed,
        device="cpu",
        verbose=0,
    )
    callback = EvalAfterUpdate(eval_env)
    model.learn(total_timesteps=budget, callback=callback)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    env.close()
    eval_env.close()
    # With a stop, SB3 has taken one more vector step (the callback stops it on the first
    # step of the next rollout); the run's length is the step of the deciding evaluation.
    steps = callback.evals[-1][0] if callback.stop else model.num_timesteps
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "steps": steps,
        "evals": callback.evals,
        "torch_threads": torch.get_num_threads(),
        "eval_s": callback.eval_s,
        "threshold_s": callback.threshold_s,
    }


def child_main(args: argparse.Namespace) -> None:
    kw = {
        "seed": args.seed,
        "budget": args.budget,
        "threshold": args.threshold,
        "every": args.eval_every,
        "episodes": args.eval_episodes,
    }
    if args.child == "harness":
        out = child_harness(**kw, trackers=True, keep=args.keep)
    elif args.child == "harness-notrack":
        out = child_harness(**kw, trackers=False, keep=args.keep)
    elif args.child == "sb3-1t":
        out = child_sb3(**kw, one_thread=True)
    elif args.child == "sb3-default":
        out = child_sb3(**kw, one_thread=False)
    else:
        raise SystemExit(f"unknown config {args.child!r}")
    out.update(config=args.child, seed=args.seed)
    print(RESULT_TAG + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------
# Parent: interleaved subprocesses, tables


def run_child(config: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        config,
        "--seed",
        str(seed),
        "--budget",
        str(args.budget),
        "--threshold",
        str(args.threshold),
        "--eval-every",
        str(args.eval_every),
        "--eval-episodes",
        str(args.eval_episodes),
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    process_s = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"bench_learn: {config} seed {seed} failed (exit {proc.returncode})")
    out: dict[str, Any] = json.loads(lines[-1][len(RESULT_TAG) :])
    out["process_s"] = process_s
    reached = [s for s, m in out["evals"] if m >= args.threshold]
    out["reached_at"] = reached[0] if reached else None
    out["final_eval"] = out["evals"][-1][1] if out["evals"] else math.nan
    out["to_threshold_s"] = out["threshold_s"] if reached else math.inf
    return out


def fmt(x: float | None, spec: str = ".1f") -> str:
    if x is None:
        return "never"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def fmt_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def report(results: list[dict[str, Any]], args: argparse.Namespace, header: dict[str, Any]) -> str:
    lines = [
        "| framework | seed | wall-clock to 475 s | whole run s | steps to threshold | final eval "
        "| evals (step: mean) | eval s | s/100k steps | CPU s | threads |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    configs = [c for c in CONFIGS if any(r["config"] == c for r in results)]
    for c in configs:
        for r in sorted((r for r in results if r["config"] == c), key=lambda r: r["seed"]):
            evals = ", ".join(f"{s // 1000}k: {m:.0f}" for s, m in r["evals"])
            wall = fmt(r["wall_s"], ".2f") + ("" if r["reached_at"] else " (failed)")
            lines.append(
                f"| {c} | {r['seed']} | {fmt(r['to_threshold_s'], '.2f')} | {wall} | "
                f"{r['reached_at'] or 'never'} | "
                f"{r['final_eval']:.1f} | {evals} | {r['eval_s']:.2f} | "
                f"{r['wall_s'] / r['steps'] * 1e5:.1f} | {r['cpu_s']:.1f} | {r['torch_threads']} |"
            )
    lines += [
        "",
        "| framework | reached 475 | median wall-clock to 475 s | median wall-clock (all runs) s "
        "| median steps to 475 | median s/100k steps | ratio to " + BASELINE + " (to 475) "
        "| ratio to " + BASELINE + " (s/100k steps) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    med: dict[str, dict[str, float]] = {}
    for c in configs:
        rs = [r for r in results if r["config"] == c]
        reached = [r["reached_at"] for r in rs if r["reached_at"]]
        med[c] = {
            "to": median([r["to_threshold_s"] for r in rs]),
            "all": median([r["wall_s"] for r in rs]),
            "steps": median(reached) if reached else math.nan,
            "per100k": median([r["wall_s"] / r["steps"] * 1e5 for r in rs]),
            "n": len(rs),
            "ok": len(reached),
        }
    base = med.get(BASELINE)
    for c in configs:
        m = med[c]
        ratio_to = ratio_sps = "-"
        if base:
            if math.isfinite(m["to"]) and math.isfinite(base["to"]):
                ratio_to = f"{m['to'] / base['to']:.2f}x"
            ratio_sps = f"{m['per100k'] / base['per100k']:.2f}x"
        steps = "never" if math.isnan(m["steps"]) else f"{m['steps']:.0f}"
        lines.append(
            f"| {c} | {m['ok']}/{m['n']} | {fmt(m['to'], '.2f')} | {m['all']:.2f} | {steps} "
            f"| {m['per100k']:.1f} | {ratio_to} | {ratio_sps} |"
        )
    head = [
        f"bench_learn {header['date']}: {header['machine']}; {header['versions']}; "
        f"seeds {args.seeds}; budget {args.budget}; eval every {args.eval_every} steps, "
        f"{args.eval_episodes} greedy episodes; threshold {args.threshold}; load average "
        f"(1/5/15 min) {fmt_load(header['loadavg'])} at start, "
        f"{fmt_load(header['loadavg_end'])} at end",
        "",
    ]
    return "\n".join(head + lines)


def machine() -> dict[str, Any]:
    import gymnasium
    import stable_baselines3
    import torch

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpus_and_model()}, " + ("CUDA" if torch.cuda.is_available() else "no GPU"),
        "versions": f"Python {platform.python_version()}, torch {torch.__version__} "
        f"(default threads {torch.get_num_threads()}), stable-baselines3 "
        f"{stable_baselines3.__version__}, gymnasium {gymnasium.__version__}",
        "loadavg": os.getloadavg(),
        "env": {
            k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ
        },
    }


def parent_main(args: argparse.Namespace) -> None:
    configs = args.configs or list(CONFIGS)
    header = machine()
    if header["env"]:
        print(f"note: thread variables set: {header['env']}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    for i, seed in enumerate(args.seeds):
        order = configs[i % len(configs) :] + configs[: i % len(configs)]
        for c in order:
            r = run_child(c, seed, args)
            results.append(r)
            print(
                f"  {c:16s} seed {seed}: {r['wall_s']:6.2f} s, steps {r['steps']:6d}, "
                f"475 at {r['reached_at'] or 'never'}, final eval {r['final_eval']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    header["loadavg_end"] = os.getloadavg()
    text = report(results, args, header)
    print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"header": header, "args": vars(args), "results": results}, indent=1, default=str
            )
        )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed (smoke run)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--configs", nargs="+", choices=CONFIGS, help=f"subset of {CONFIGS}")
    p.add_argument("--budget", type=int, default=100_000, help="env steps per run")
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--json", help="also write all results to this JSON file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
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
