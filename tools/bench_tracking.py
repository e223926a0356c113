"""Tracking overhead: the same run without trackers vs with CSV + TensorBoard + W&B (offline).

Each measurement is a fresh ``harness run`` process (``python -m harness.cli run``) on the
CartPole pack with the same seed, so both sides train identically (``stop_at_return`` is lifted
so no run stops early; the script checks that both sides reach the same final evaluation). The
two configurations alternate (A B, B A, ...) so drift in machine load hits both alike. Two
numbers per configuration, each the median over the repeats:

- process wall-clock: from process start to exit, including imports (wandb, tensorboard),
  tracker start-up and W&B finish (learning-curve upload, checkpoint artifact);
- train wall-clock: the run's own ``wall_time`` from ``summary.json`` (the training loop,
  evaluations and checkpoints, with every ``record`` call), i.e. the per-step overhead;
- CPU seconds (user + system) of the process and the children it reaped (wandb's service),
  which varies less than wall-clock on a shared machine.

    .venv/bin/python tools/bench_tracking.py                          # 100k steps, 5 repeats
    .venv/bin/python tools/bench_tracking.py --steps 20000 --repeats 3  # quick

W&B runs with ``WANDB_MODE=offline`` (its system monitor on, as in a real run); every wandb
directory is inside a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "competitions" / "cartpole"
CONFIGS = {"none": [], "csv+tensorboard+wandb": ["csv", "tensorboard", "wandb"]}


def one_run(tmp: Path, name: str, trackers: list[str], steps: int, seed: int) -> dict[str, float]:
    out = tmp / "runs"
    env = dict(os.environ)
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        env[var] = str(tmp / "wandb-home" / var.lower())
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", NETRC=str(tmp / "no-netrc"))
    env.pop("WANDB_API_KEY", None)
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(PACK),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--no-progress",
        "--set",
        f"name={name}",
        "--set",
        f"trackers={json.dumps(trackers)}",
        "--set",
        "stop_at_return=1e9",
    ]
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / name / "summary.json").read_text())
    return {
        "process": wall,
        "cpu": cpu,
        "train": float(summary["wall_time"]),
        "steps": float(summary["steps"]),
        "final_eval": float(summary["final_eval"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per run (100000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration (5)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every run (1)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench_tracking_") as tmp:
        for i in range(args.repeats):
            order = list(CONFIGS) if i % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                label = f"{name.replace('+', '_')}_{i}"
                r = one_run(Path(tmp), label, CONFIGS[name], args.steps, args.seed)
                results[name].append(r)
                print(
                    f"# {name:>22} repeat {i}: process {r['process']:.2f} s, "
                    f"train {r['train']:.2f} s, cpu {r['cpu']:.2f} s, "
                    f"final eval {r['final_eval']:.1f}",
                    file=sys.stderr,
                )
    evals = {r["final_eval"] for rs in results.values() for r in rs}
    base = {
        k: statistics.median(r[k] for r in results["none"]) for k in ("process", "train", "cpu")
    }
    command = f"{Path(sys.executable).name} tools/bench_tracking.py " + " ".join(sys.argv[1:])
    print(f"Command: `{command.strip()}`  ")
    print(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; CartPole PPO pack, {args.steps} steps, seed "
        f"{args.seed}, {args.repeats} repeats (median). Identical training on both sides: "
        f"{'yes' if len(evals) == 1 else 'NO, final evals ' + str(sorted(evals))}.\n"
    )
    head = ("process wall", "train wall", "CPU")
    print("| trackers | " + " | ".join(f"{h} (s) | overhead" for h in head) + " |")
    print("|---|" + "---:|---:|" * len(head))
    for name, rs in results.items():
        cells = []
        for key in ("process", "train", "cpu"):
            value = statistics.median(r[key] for r in rs)
            cells.append(f"{value:.2f} | {100 * (value / base[key] - 1):+.1f}%")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
