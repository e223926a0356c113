"""Parallel tuning benchmark: a fixed 8-trial study with --jobs 1 vs --jobs 2.

Each study runs the same 8 trials of fixed length (no pruner, no early stop, seeded sampler:
TPE's first 10 trials are seeded random draws, so both studies sample the same values) through
the real `harness tune` command in a subprocess, and the wall-clock of the whole command is
timed (start-up, the embedded farm for J=2, every trial, the plots). Target: J=2 <= 0.6x J=1
on 2 cores. The default trial is the cartpole pack's own run (100k env steps, ~11 s); with
short trials (--steps 16384, ~2 s) J=2's fixed start-up (~2.5 s more than J=1's: the farm's
fork server imports torch and the plugins before its workers can start) weighs in the ratio.

    .venv/bin/python tools/bench_tune.py [--trials 8] [--steps 100000] [--jobs 1 2] [--repeats R]

With --repeats R the J values take turns (order reversed every repeat) and the ratio is taken
within each repeat; the table also splits each run into time to the first trial, the trials
and what follows the last trial.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def settings(steps: int) -> list[str]:
    """Fixed-length trials: no early stop at the return threshold, no checkpoints, CSV only."""
    return [
        f"run.total_steps={steps}",
        f"run.eval_every={steps // 4}",
        "run.eval_episodes=5",
        "run.stop_at_return=1e9",
        "run.checkpoint_every=0",
        "run.trackers=['csv']",
    ]


def command(out: Path, trials: int, steps: int, jobs: int, study: str) -> list[str]:
    cmd = ["harness", "tune", "competitions/cartpole", "--trials", str(trials)]
    cmd += ["--jobs", str(jobs), "--pruner", "none", "--seed", "0", "--study", study]
    cmd += ["--out", str(out)]
    for text in settings(steps):
        cmd += ["--set", text]
    return cmd


def parallel_limit(out: Path, steps: int) -> tuple[float, float]:
    """The machine's own limit for J=2: one plain ``harness run`` of the pack's trial alone,
    then two at once; returns (alone s, both s). Two trials at a time can at best take
    ``both / (2 * alone)`` of the sequential time (shared caches, memory bandwidth, clocks)."""
    base = [sys.executable, "-m", "harness.cli", "run", "competitions/cartpole", "--no-progress"]
    for text in settings(steps):
        base += ["--set", text]

    def cmd(name: str) -> list[str]:
        return [*base, "--out", str(out), "--set", f"run.name={name}"]

    t0 = time.perf_counter()
    subprocess.run(cmd("alone"), cwd=ROOT, capture_output=True, check=True)
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(cmd(f"p{i}"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(err.decode()[-2000:])
    return alone, time.perf_counter() - t0


def timeline(study_dir: Path, name: str, t0: float, t1: float) -> dict[str, float]:
    """Seconds from the command's start to its first trial's start, the trials' span, and
    from the last trial's end to the command's exit (trial times: the workers' own clocks)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / name / 'study.db'}")
    workers = [t.user_attrs["worker"] for t in study.get_trials() if "worker" in t.user_attrs]
    first = min(w["start"] for w in workers)
    last = max(w["end"] for w in workers)
    return {"to_first": first - t0, "trials": last - first, "tail": t1 - last}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=100_000, help="env steps per trial (the pack's own run)"
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per jobs value, order reversed every repeat"
    )
    parser.add_argument(
        "--no-limit", action="store_true", help="skip the plain one-vs-two-runs limit measurement"
    )
    args = parser.parse_args()
    rows = []
    limits = []
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as tmp:
        for rep in range(args.repeats):
            if not args.no_limit:
                alone, both = parallel_limit(Path(tmp) / f"limit{rep}", args.steps)
                limits.append(both / (2 * alone))
                print(
                    f"  repeat {rep} limit: one run {alone:.1f} s, two at once {both:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            order = args.jobs if rep % 2 == 0 else list(reversed(args.jobs))
            for jobs in order:
                name = f"bench-j{jobs}-r{rep}"
                cmd = command(Path(tmp), args.trials, args.steps, jobs, name)
                argv = [sys.executable, "-m", "harness.cli", *cmd[1:]]
                load0 = os.getloadavg()[0]
                t0, w0 = time.perf_counter(), time.time()
                done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - t0
                if done.returncode != 0:
                    print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                    return done.returncode
                phases = timeline(Path(tmp), name, w0, w0 + wall)
                rows.append((rep, jobs, wall, load0, phases, shlex.join(cmd)))
                print(f"  repeat {rep} J={jobs}: {wall:.1f} s", file=sys.stderr, flush=True)
    base_jobs = args.jobs[0]
    base = {rep: wall for rep, jobs, wall, *_ in rows if jobs == base_jobs}
    print(
        f"| repeat | jobs | wall-clock (s) | ratio vs J={base_jobs}, same repeat "
        "| to first trial (s) | trials (s) | after the last trial (s) | load avg at start |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rep, jobs, wall, load, ph, _ in rows:
        print(
            f"| {rep} | {jobs} | {wall:.1f} | {wall / base[rep]:.2f}x | {ph['to_first']:.1f} "
            f"| {ph['trials']:.1f} | {ph['tail']:.1f} | {load:.2f} |"
        )
    print()
    for jobs in args.jobs[1:]:
        ratios = sorted(wall / base[rep] for rep, j, wall, *_ in rows if j == jobs)
        print(
            f"J={jobs} / J={base_jobs}: median {statistics.median(ratios):.2f}x over "
            f"{len(ratios)} repeat(s), range {ratios[0]:.2f}-{ratios[-1]:.2f}x"
        )
    if limits:
        print(
            "limit (two plain runs of one trial at once / twice one alone, the best a J=2 study's "
            f"trials can do): {', '.join(f'{x:.2f}x' for x in limits)}"
        )
    print(f"cpus: {os.cpu_count()}; commands (one per jobs value, repeat 0):")
    for rep, *_, cmd in rows:
        if rep == 0:
            print(f"    {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
