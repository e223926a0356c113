"""Parallel tuning benchmark: a fixed 8-trial study with --jobs 1 vs --jobs 2.

Each study runs the same 8 trials of fixed length (no pruner, no early stop, seeded sampler:
TPE's first 10 trials are seeded random draws, so both studies sample the same values) through
the real `harness tune` command in a subprocess, and the wall-clock of the whole command is
timed (start-up, the embedded farm for J=2, every trial, the plots). Target: J=2 <= 0.6x J=1
on 2 cores.

    .venv/bin/python tools/bench_tune.py [--trials 8] [--steps 16384] [--jobs 1 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(out: Path, trials: int, steps: int, jobs: int) -> list[str]:
    sets = [
        f"run.total_steps={steps}",
        f"run.eval_every={steps // 4}",
        "run.eval_episodes=5",
        "run.stop_at_return=1e9",
        "run.checkpoint_every=0",
        "run.trackers=['csv']",
    ]
    cmd = ["harness", "tune", "competitions/cartpole", "--trials", str(trials)]
    cmd += ["--jobs", str(jobs), "--pruner", "none", "--seed", "0", "--study", f"bench-j{jobs}"]
    cmd += ["--out", str(out)]
    for text in sets:
        cmd += ["--set", text]
    return cmd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16384, help="env steps per trial")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as tmp:
        for jobs in args.jobs:
            cmd = command(Path(tmp), args.trials, args.steps, jobs)
            argv = [sys.executable, "-m", "harness.cli", *cmd[1:]]
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            rows.append((jobs, wall, load0, shlex.join(cmd)))
    base = rows[0][1]
    print(f"| jobs | wall-clock (s) | ratio vs J={rows[0][0]} | load avg at start |")
    print("|---:|---:|---:|---:|")
    for jobs, wall, load, _ in rows:
        print(f"| {jobs} | {wall:.1f} | {wall / base:.2f}x | {load:.2f} |")
    print()
    print(f"cpus: {os.cpu_count()}; commands:")
    for *_, cmd in rows:
        print(f"    {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
