"""Env frames/s of EnvPool (the ``envpool`` env family) against harness_gymnasium's vector envs
on the same Atari game, the same preprocessing and the same number of envs, in one run.

Each row is one vector env of ``n`` envs (``--envs``, default 8 and 16) stepped with uniformly
random actions for ``--seconds`` in this process, after a warm-up; nothing else of ours runs
meanwhile. Rows are measured in ``--rounds`` interleaved rounds (every row once per round) and
the median is reported, so a slow spell of the machine lands on every engine alike:

- ``envpool``: ``envpool/GAME`` with its thread pool at this process's CPU share (the family's
  default ``[env] num_threads``);
- ``envpool 1 thread``: the same with ``num_threads = 1``, what one farm actor per core gets;
- ``gymnasium sync``: ``ALE/GAME`` through harness's DeepMind preprocessing in
  ``LeanSyncVectorEnv`` (one thread, the serial runner's and farm actors' default);
- ``gymnasium async``: the same in gymnasium's ``AsyncVectorEnv`` (a process per env).

Both families use the defaults of their ``[env]`` sections: 84x84 grey, 4 stacked frames,
frame skip 4 (max-pooled), up to 30 no-ops, episodic life, clipped rewards, sticky actions
0.25, with SAME_STEP autoreset. Frames are emulator frames (agent steps x 4). The ratio
column is each row's rate over ``gymnasium sync`` at the same ``n``.

    .venv/bin/python tools/bench_envpool.py                      # Pong, 8 and 16 envs, 10 s
    .venv/bin/python tools/bench_envpool.py --game Breakout-v5 --envs 16 --seconds 20
    .venv/bin/python tools/bench_envpool.py --seconds 2 --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchlib, when imported)

FRAME_SKIP = 4
ENGINES = ("envpool", "envpool 1 thread", "gymnasium sync", "gymnasium async")


def make(engine: str, game: str, n: int) -> Any:
    """A vector env of ``n`` envs of ``game`` (an ALE game id without prefix) on ``engine``."""
    if engine.startswith("envpool"):
        from harness_envpool.plugin import EnvPoolConfig
        from harness_envpool.plugin import make_env as make_envpool

        threads = 1 if engine == "envpool 1 thread" else 0
        return make_envpool(
            f"envpool/{game}", num_envs=n, options=EnvPoolConfig(num_threads=threads)
        )
    from harness_gymnasium.plugin import make_env as make_gym

    vector = "async" if engine == "gymnasium async" else "sync"
    return make_gym(f"ALE/{game}", num_envs=n, vector=vector)


def rate(envs: Any, seconds: float, seed: int) -> float:
    """Agent steps/s of ``envs`` under random actions over ``seconds`` (after 50 warm-up
    steps)."""
    import numpy as np

    n, actions = envs.num_envs, envs.single_action_space.n
    rng = np.random.default_rng(seed)
    envs.reset(seed=seed)
    batches = [rng.integers(0, actions, n) for _ in range(64)]
    for t in range(50):
        envs.step(batches[t % 64])
    steps, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while True:
        envs.step(batches[steps % 64])
        steps += 1
        if steps % 16 == 0 and time.perf_counter() >= end:
            break
    return steps * n / (time.perf_counter() - t0)


def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[tuple[str, int], float]:
    """Median frames/s per (engine, n) over ``args.rounds`` interleaved rounds."""
    rates: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for n in args.envs:
            for engine in args.engines:
                envs = make(engine, args.game, n)
                try:
                    fps = rate(envs, args.seconds, seed=r) * FRAME_SKIP
                finally:
                    envs.close()
                rates.setdefault((engine, n), []).append(fps)
                log(f"round {r + 1}: {engine:18s} n={n:3d} {fps:10.0f} frames/s")
    return {key: statistics.median(values) for key, values in rates.items()}


def table(args: argparse.Namespace, medians: dict[tuple[str, int], float]) -> list[str]:
    lines = [
        f"| engine | envs | frames/s ({args.game}) | vs gymnasium sync |",
        "| --- | ---: | ---: | ---: |",
    ]
    for n in args.envs:
        base = medians.get(("gymnasium sync", n))
        for engine in args.engines:
            fps = medians[(engine, n)]
            vs = f"{fps / base:.2f}x" if base else "-"
            lines.append(f"| {engine} | {n} | {fps:,.0f} | {vs} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong-v5", help="ALE game id without prefix")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--seconds", type=float, default=10.0, help="per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--engines", nargs="+", default=list(ENGINES), choices=ENGINES, metavar="ENGINE"
    )
    args = parser.parse_args(argv)
    from benchlib import cpus_and_model

    from harness_envpool.plugin import import_envpool

    envpool = import_envpool()
    print(f"# {cpus_and_model()}; envpool {envpool.__version__}", flush=True)
    medians = measure(args, lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(table(args, medians)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
