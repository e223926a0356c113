"""What the benchmark tools in this folder share (imported as a sibling module: the tools run
as scripts, `python tools/NAME.py`, so this folder is on sys.path).

Besides the machine description, the plumbing of the learning benchmarks (bench_learn.py,
bench_recurrent.py), kept here once so their protocol cannot drift apart: each run is a fresh
subprocess of the script (``--child CONFIG``) that prints one JSON line behind a tag; the
parent interleaves configs seed by seed; a harness child and an SB3 child follow one
evaluation protocol (after the first policy update at or past every ``every`` env steps,
``episodes`` greedy episodes; stop at the first mean >= threshold; one last evaluation when
the budget runs out) and one clock (started after the imports, stopped when training returns,
the time to threshold taken when the deciding evaluation has finished). Nothing here imports
torch, SB3 or the harness runtime at module level: the other tools import this module in the
plain venv.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import hookimpl
from harness.cpus import cpu_share

REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpus_and_model() -> str:
    """``"2 CPUs (AMD EPYC ...)"``: the cores this process may use and their model."""
    return f"{cpu_share()} CPUs ({cpu_model()})"


def python_torch() -> str:
    """``"Python 3.11.7, torch 2.13.0+cpu (default threads 2)"``, the start of a versions line."""
    import torch

    return (
        f"Python {platform.python_version()}, torch {torch.__version__} (default threads "
        f"{torch.get_num_threads()})"
    )


def machine(versions: str) -> dict[str, Any]:
    """A learning benchmark's header record: date, cores and GPU, ``versions`` (the line the
    script composes for what it compares), load average at start and the thread variables
    that would change torch's thread count (reported, since they skew CPU timings)."""
    import torch

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpus_and_model()}, " + ("CUDA" if torch.cuda.is_available() else "no GPU"),
        "versions": versions,
        "loadavg": os.getloadavg(),
        "env": {
            k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ
        },
    }


# ------------------------------------------------------------------------------------------
# Command line, children and the parent's interleaving


@dataclass(frozen=True)
class RunSpec:
    """One child run: its seed, env-step budget and evaluation protocol (the threshold, an
    evaluation after the first update at or past every ``every`` steps, ``episodes`` each)."""

    seed: int
    budget: int
    threshold: float
    every: int
    episodes: int


def learning_parser(
    description: str, configs: Sequence[str], configs_help: str, budget: int, timeout: float
) -> argparse.ArgumentParser:
    """The options every learning benchmark takes (a script adds its own after these);
    ``--child``/``--seed`` are the hidden ones the parent passes to each run's subprocess."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="1 seed (smoke run)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--configs", nargs="+", choices=configs, help=configs_help)
    p.add_argument("--budget", type=int, default=budget, help="env steps per run")
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--timeout", type=float, default=timeout, help="seconds per run")
    p.add_argument("--json", help="also write all results to this JSON file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    return p


def run_as_child(
    args: argparse.Namespace,
    tag: str,
    children: Mapping[str, Callable[[RunSpec], dict[str, Any]]],
) -> None:
    """Run config ``args.child`` once (``children[name](spec)``) and print its result as one
    JSON line behind ``tag``, the parent's only way to tell it from the frameworks' own
    output."""
    child = children.get(args.child)
    if child is None:
        raise SystemExit(f"unknown config {args.child!r}")
    spec = RunSpec(args.seed, args.budget, args.threshold, args.eval_every, args.eval_episodes)
    out = child(spec)
    out.update(config=args.child, seed=args.seed)
    print(tag + json.dumps(out), flush=True)


def run_child(
    script: str, tag: str, config: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One run of ``config`` as a fresh subprocess of ``script`` (so no run inherits another's
    imports, threads or allocator state), with what the tables derive from its evaluations:
    the first step at or past the threshold, the last evaluation's mean and the wall-clock to
    the threshold (infinite for a run that never got there)."""
    cmd = [sys.executable, str(Path(script).resolve()), "--child", config, "--seed", str(seed)]
    cmd += ["--budget", str(args.budget), "--threshold", str(args.threshold)]
    cmd += ["--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    process_s = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        name = Path(script).stem
        raise SystemExit(f"{name}: {config} seed {seed} failed (exit {proc.returncode})")
    out: dict[str, Any] = json.loads(lines[-1][len(tag) :])
    out["process_s"] = process_s
    reached = [s for s, m in out["evals"] if m >= args.threshold]
    out["reached_at"] = reached[0] if reached else None
    out["final_eval"] = out["evals"][-1][1] if out["evals"] else math.nan
    out["to_threshold_s"] = out["threshold_s"] if reached else math.inf
    return out


def run_interleaved(
    script: str, tag: str, configs: Sequence[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every config for every seed in ``args.seeds``, the configs interleaved seed by seed in
    rotated order, so that load noise on a shared machine hits all of them alike; a progress
    line per run on stderr."""
    configs = list(configs)
    results: list[dict[str, Any]] = []
    for i, seed in enumerate(args.seeds):
        for c in configs[i % len(configs) :] + configs[: i % len(configs)]:
            r = run_child(script, tag, c, seed, args)
            results.append(r)
            print(
                f"  {c:16s} seed {seed}: {r['wall_s']:7.2f} s, steps {r['steps']:6d}, "
                f"{args.threshold:.0f} at {r['reached_at'] or 'never'}, final eval "
                f"{r['final_eval']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    return results


def note_thread_env(header: Mapping[str, Any]) -> None:
    """Warn on stderr when thread variables are set: they change what torch's default means."""
    if header["env"]:
        print(f"note: thread variables set: {header['env']}", file=sys.stderr)


def write_json(
    path: str, header: Mapping[str, Any], args: argparse.Namespace, results: list[dict[str, Any]]
) -> None:
    """Everything a table was made from, for later re-analysis (``--json``)."""
    Path(path).write_text(
        json.dumps(
            {"header": header, "args": vars(args), "results": results}, indent=1, default=str
        )
    )


# ------------------------------------------------------------------------------------------
# The harness child


class HarnessRecorder:
    """A hook plugin keeping the run's evaluation history and the wall-clock (from ``t0``,
    set when the clock starts) at which the first evaluation reached ``threshold``: the
    iteration-end hook runs right after that evaluation, as SB3's callback does."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.t0 = math.nan
        self.evals: list[tuple[int, float]] = []
        self.threshold_s = math.inf

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Any) -> None:
        reached = metrics.get("eval/mean_return", -math.inf) >= self.threshold
        if reached and math.isinf(self.threshold_s):
            self.threshold_s = time.perf_counter() - self.t0

    @hookimpl
    def harness_run_end(self, run: Any, summary: Any) -> None:
        self.evals = [(int(s), float(m)) for s, m in run.eval_history]


def harness_child(
    make_config: Callable[[Any, list[str]], Any],
    spec: RunSpec,
    *,
    prefix: str,
    timed: Mapping[str, str],
    keep: bool = False,
) -> dict[str, Any]:
    """One harness training run under the protocol: ``make_config(registry, run_overrides)``
    resolves (and checks) the script's config with the protocol's ``run.*`` overrides;
    ``timed`` maps functions of ``harness.runtime.run`` (module globals that ``train`` looks
    up at call time) to the result keys that add up their time (instrumentation only). The
    output folder (``prefix``) is removed afterwards unless ``keep``."""
    import harness.runtime.run as runmod
    from harness.plugins import collect_registry, make_plugin_manager

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    out = Path(tempfile.mkdtemp(prefix=prefix))
    run = [
        "run.progress=false",
        f'run.out="{out}"',
        f"run.seed={spec.seed}",
        f"run.total_steps={spec.budget}",
        f"run.eval_every={spec.every}",
        f"run.eval_episodes={spec.episodes}",
        f"run.stop_at_return={float(spec.threshold)}",
    ]
    config = make_config(registry, run)
    timers = dict.fromkeys(timed.values(), 0.0)
    for attr, key in timed.items():
        setattr(runmod, attr, _timed(timers, key, getattr(runmod, attr)))
    recorder = HarnessRecorder(spec.threshold)
    pm.register(recorder, name=prefix + "recorder")
    # SB3's side imports torch before its clock starts (stable_baselines3 imports it): do the
    # same here, where the backend plugin would otherwise import it lazily inside train().
    import torch

    import harness_torch.backend  # noqa: F401

    cpu0, recorder.t0 = time.process_time(), time.perf_counter()
    result = runmod.train(config, registry, pm)
    wall, cpu = time.perf_counter() - recorder.t0, time.process_time() - cpu0
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


def _timed(timers: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding its wall-clock to ``timers[key]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[key] += time.perf_counter() - t

    return wrapper


# ------------------------------------------------------------------------------------------
# The SB3 child


# The RL Zoo's tuned PPO numbers for CartPole in harness's names: its ppo.yml CartPole-v1 entry
# (competitions/cartpole/pack.toml) and its ppo_lstm.yml CartPoleNoVel-v1 entry share them;
# vf_coef and max_grad_norm are SB3's defaults (also harness's), spelled out for SB3.
ZOO_CARTPOLE_PPO: dict[str, Any] = {
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
}


class Linear:
    """SB3 schedule: ``value * progress_remaining``, clamped at 0 like harness's anneal."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, progress_remaining: float) -> float:
        return self.value * min(max(progress_remaining, 0.0), 1.0)


def sb3_ppo_kwargs(
    h: Mapping[str, Any], seed: int, activation_fn: Any, ortho_init: bool, **policy: Any
) -> dict[str, Any]:
    """SB3 PPO's arguments from ``h`` (harness's names, the pack's values): lr and clip
    annealed linearly to 0 as harness's ``anneal_lr``/``anneal_clip``; separate actor and
    critic networks of ``h["hidden"]`` (``policy``: further policy arguments); on the CPU,
    silent."""
    return {
        "learning_rate": Linear(h["learning_rate"]),
        "n_steps": h["n_steps"],
        "batch_size": h["batch_size"],
        "n_epochs": h["n_epochs"],
        "gamma": h["gamma"],
        "gae_lambda": h["gae_lambda"],
        "clip_range": Linear(h["clip_range"]),
        "ent_coef": h["ent_coef"],
        "vf_coef": h["vf_coef"],
        "max_grad_norm": h["max_grad_norm"],
        "policy_kwargs": {
            "net_arch": {"pi": h["hidden"], "vf": h["hidden"]},
            "activation_fn": activation_fn,
            "ortho_init": ortho_init,
            **policy,
        },
        "seed": seed,
        "device": "cpu",
        "verbose": 0,
    }


def eval_after_update(
    eval_env: Any, spec: RunSpec, t0: float, sync_normalization: bool = False
) -> Any:
    """An SB3 callback following harness's protocol: evaluate after the first update at or
    past every ``every`` steps (i.e. at the start of the next rollout), stop once the mean
    reaches ``threshold`` (its wall-clock from ``t0`` kept), one last evaluation at the end
    when the budget runs out. ``evaluate_policy`` splits the episodes over ``eval_env``'s envs
    as harness's ``evaluate`` does (and passes a recurrent policy its states and episode
    starts); with ``sync_normalization`` the eval VecNormalize takes the training statistics
    first, as SB3's EvalCallback. Its imports are already loaded by the time a child builds it
    (stable_baselines3 imports them), so they add nothing to the clock."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    seed, every, episodes, threshold = spec.seed, spec.every, spec.episodes, spec.threshold

    class EvalAfterUpdate(BaseCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.eval_env = eval_env
            self.next_eval = every
            self.evals: list[tuple[int, float]] = []
            self.stop = False
            self.eval_s = 0.0
            self.threshold_s = math.inf

        def _evaluate(self) -> float:
            t = time.perf_counter()
            if sync_normalization:
                sync_envs_normalization(self.training_env, self.eval_env)
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

    return EvalAfterUpdate()


def sb3_learn(
    model: Any,
    env: Any,
    eval_env: Any,
    spec: RunSpec,
    clock: tuple[float, float],
    sync_normalization: bool = False,
) -> dict[str, Any]:
    """Train ``model`` for ``spec.budget`` steps under ``eval_after_update``'s protocol,
    stop the clock started at ``clock`` (``time.perf_counter()``, ``time.process_time()``),
    close both envs; the child's result."""
    import torch

    t0, cpu0 = clock
    callback = eval_after_update(eval_env, spec, t0, sync_normalization)
    model.learn(total_timesteps=spec.budget, callback=callback)
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


# ------------------------------------------------------------------------------------------
# Tables


def fmt(x: float | None, spec: str = ".1f") -> str:
    """``x`` formatted, ``never`` for None, ``inf`` for infinity (a run that failed)."""
    if x is None:
        return "never"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def fmt_load(load: Sequence[float]) -> str:
    """A load average triple as ``1.0/0.9/0.9``."""
    return "/".join(f"{x:.1f}" for x in load)


def median(xs: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(xs) if xs else math.nan


def ratio(a: float, b: float | None) -> str:
    """``a / b`` as ``0.15x``, ``-`` when either is missing, infinite or NaN (a failed run)."""
    if b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def present(order: Sequence[str], results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The configs of ``order`` that have results, in that order."""
    return [c for c in order if any(r["config"] == c for r in results)]


def run_table(
    results: Sequence[Mapping[str, Any]],
    configs: Sequence[str],
    first: str,
    label: str,
    threads: bool,
) -> list[str]:
    """The per-run table: a row per config and seed; ``first`` names the first column,
    ``label`` the threshold in the headings, ``threads`` adds torch's thread count."""
    head = f"| {first} | seed | wall-clock to {label} s | whole run s | steps to threshold "
    head += "| final eval | evals (step: mean) | eval s | s/100k steps | CPU s |"
    lines = [head + (" threads |" if threads else ""), "|---|" + "---:|" * 5 + "---|"]
    lines[1] += "---:|" * (4 if threads else 3)
    for c in configs:
        for r in sorted((r for r in results if r["config"] == c), key=lambda r: r["seed"]):
            evals = ", ".join(f"{s // 1000}k: {m:.0f}" for s, m in r["evals"])
            wall = fmt(r["wall_s"], ".2f") + ("" if r["reached_at"] else " (failed)")
            row = (
                f"| {c} | {r['seed']} | {fmt(r['to_threshold_s'], '.2f')} | {wall} "
                f"| {r['reached_at'] or 'never'} | {r['final_eval']:.1f} | {evals} "
                f"| {r['eval_s']:.2f} | {r['wall_s'] / r['steps'] * 1e5:.1f} | {r['cpu_s']:.1f} |"
            )
            lines.append(row + (f" {r['torch_threads']} |" if threads else ""))
    return lines


def medians(
    results: Sequence[Mapping[str, Any]], configs: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per config: medians of the wall-clock to threshold (``to``; infinite when most runs
    failed), of the whole run (``all``), of the steps to threshold over the runs that got
    there (``steps``) and of s/100k steps (``per100k``); runs (``n``) and successes (``ok``)."""
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
    return med


def summary_table(
    med: Mapping[str, Mapping[str, float]], first: str, columns: Sequence[str], bases: Sequence[str]
) -> list[str]:
    """The medians table under the heading ``first`` + ``columns``: successes, the four
    medians, then for each baseline of ``bases`` the ratios of the wall-clock to threshold and
    of s/100k steps (``-`` for a baseline without runs)."""
    lines = ["| " + " | ".join([first, *columns]) + " |", "|---|" + "---:|" * len(columns)]
    for c, m in med.items():
        steps = "never" if math.isnan(m["steps"]) else f"{m['steps']:.0f}"
        cells = [f"{m['ok']:.0f}/{m['n']:.0f}", fmt(m["to"], ".2f"), f"{m['all']:.2f}", steps]
        cells.append(f"{m['per100k']:.1f}")
        for b in bases:
            base = med.get(b)
            cells += [
                ratio(m["to"], base["to"] if base else None),
                ratio(m["per100k"], base["per100k"] if base else None),
            ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def start_together(go: Any, start: Any, out: Any) -> None:
    """In a worker of :func:`together_rate`: say it is ready (its load is built and warm), then
    wait for the common start."""
    out.put(("ready", 0.0))
    go.wait()
    time.sleep(max(0.0, start.value - time.time()))


def together_rate(
    worker: Callable[..., None],
    worker_args: Sequence[tuple[Any, ...]],
    seconds: float,
    method: str = "spawn",
) -> float:
    """Summed rate of one process per entry of ``worker_args``, all stepping from the same
    moment: what the cores give a load with nothing else of ours running. Each
    ``worker(*args, go, start, out)`` builds its load, calls :func:`start_together`, then puts
    ``("rate", steps_per_s)`` on ``out``."""
    import multiprocessing as mp

    ctx: Any = mp.get_context(method)
    out, go, start = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=worker, args=(*args, go, start, out), daemon=True)
        for args in worker_args
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        out.get(timeout=300)
    start.value = time.time() + 0.5
    go.set()
    total = sum(out.get(timeout=seconds + 300)[1] for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return float(total)
