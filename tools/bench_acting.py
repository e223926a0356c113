"""What acting costs: CPU seconds per env step of a 2-actor farm (or a serial run), before and
after a change.

Each measurement is one ``harness run`` of the cartpole pack in a fresh process with
``run.actors = 2`` (``--actors``; 0: a serial run, the envs stepped in the learner) and a
fixed step budget (no evaluations, no checkpoints, no early stop):
CPU time of the whole process tree (the learner, its launcher and the actors, through
``RUSAGE_CHILDREN`` once everything is reaped) divided by the env steps trained, and the
wall-clock. CartPole steps in microseconds, so the figure is the harness's own cost per step:
acting, stepping bookkeeping, rollout transfer and learning. Beside it, a farm actor's own
memory: the largest USS (private pages, ``/proc/PID/smaps_rollup``) an actor process had,
sampled every 0.5 s; the pages an actor shares with its fork server (the framework, the
plugins) are not its own and are left out. Configurations:

- ``ppo``: PPO with its MLP policy (the pack's recipe);
- ``ppo-lstm``: the same with ``algo.recurrent = "lstm"`` (per-env state);
- ``dqn``: DQN (epsilon-greedy, replay, one update per step);
- ``r2d2``, ``es``: recurrent DQN (sequence replay) and evolution strategies, defaults.

``--trees A,B`` runs each configuration on the working trees A and B (each put first on
PYTHONPATH with its ``plugins``), alternating A B B A ... for ``--rounds`` rounds, and prints
the medians and the ratio B / A::

    git worktree add -f /tmp/before HEAD~3
    .venv/bin/python tools/bench_acting.py --trees /tmp/before,. --rounds 3

The run's plugins come from the installed entry points, which name modules, so the tree first
on PYTHONPATH provides them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import cpus_and_model

REPO = Path(__file__).resolve().parent.parent

CONFIGS = {
    "ppo": ["algo=ppo"],
    "ppo-lstm": ["algo=ppo", "algo.recurrent='lstm'", "algo.rnn_hidden=64"],
    "dqn": ["algo=dqn"],
    "r2d2": ["algo=r2d2"],
    "es": ["algo=es"],
}


def measure(tree: Path, config: str, steps: int, actors: int = 2) -> dict[str, float]:
    """One run of ``config`` on ``tree``: CPU seconds (whole tree) and wall seconds."""
    settings = [
        *CONFIGS[config],
        f"run.actors={actors}",
        f"run.total_steps={steps}",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.stop_at_return=0",
        "run.progress=false",
        "run.trackers=['csv']",
        "run.seed=1",
    ]
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'plugins'}", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory() as out:
        env["HARNESS_STATE_DIR"] = str(Path(out) / "state")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "harness.cli", "run", str(REPO / "competitions" / "cartpole")]
        cmd += ["--out", out, *(f"--set={s}" for s in settings)]
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=log, text=True)
            uss = 0.0
            while proc.poll() is None:
                uss = max(uss, *actor_uss_mb(proc.pid), 0.0)
                time.sleep(0.5)
            log.seek(0)
            stderr = log.read()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{config} on {tree} failed:\n{stderr[-3000:]}")
        (run_dir,) = [p for p in Path(out).iterdir() if p.is_dir() and p.name != "state"]
        summary = json.loads((run_dir / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    trained = float(summary["steps"])
    return {"cpu_us_per_step": 1e6 * cpu / trained, "wall_s": wall, "steps": trained, "uss": uss}


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return kids


def actor_uss_mb(root: int) -> list[float]:
    """The USS (MB) of every farm actor under process ``root``: a fork server's children
    (processes of the fork server's command line whose parent has it too)."""

    def cmdline(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                return f.read()
        except OSError:
            return ""

    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = _children(pid)
        todo += kids
        if "zygote" in cmdline(pid):
            for kid in kids:
                try:
                    with open(f"/proc/{kid}/smaps_rollup") as f:
                        fields = dict(line.split()[:2] for line in f if line.endswith("kB\n"))
                except OSError:
                    continue
                private = int(fields["Private_Clean:"]) + int(fields["Private_Dirty:"])
                out.append(private / 1024)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=".", help="comma-separated working trees (A,B)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=2, help="farm actors (0: a serial run)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    configs = args.configs.split(",")
    print(
        f"# {cpus_and_model()}; {args.steps} steps per run, {args.rounds} rounds, "
        f"{args.actors} actors"
    )
    results: dict[tuple[str, Path], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]  # A B, B A, ...: drift hits both alike
        for config in configs:
            for tree in order:
                m = measure(tree, config, args.steps, args.actors)
                results.setdefault((config, tree), []).append(m)
                print(
                    f"round {r + 1} {config:9s} {tree}: {m['cpu_us_per_step']:.1f} us CPU "
                    f"per step, {m['wall_s']:.1f} s wall, actor USS {m['uss']:.1f} MB",
                    flush=True,
                )
    for key, label in (("cpu_us_per_step", "CPU us/step"), ("uss", "actor USS MB")):
        print("| config | " + " | ".join(f"{label} {t.name}" for t in trees) + " | ratio |")
        print("| --- |" + " --- |" * (len(trees) + 1))
        for config in configs:
            medians = [statistics.median(m[key] for m in results[config, t]) for t in trees]
            ratio = medians[-1] / medians[0] if medians[0] else float("nan")
            cells = " | ".join(f"{m:.1f}" for m in medians)
            print(f"| {config} | {cells} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
