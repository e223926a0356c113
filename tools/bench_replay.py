"""Replay memory throughput: harness ReplayMemory / PrioritizedReplay vs Stable-Baselines3.

Run in the benchmark venv (it needs torch and stable-baselines3, which harness itself does not):

    bash tools/bench_env.sh
    .venv-bench/bin/python tools/bench_replay.py            # full run (a few minutes)
    .venv-bench/bin/python tools/bench_replay.py --quick    # smoke run (seconds)

What is measured, per case (CartPole-like and Atari-like observations), batch size 256:

* ``add``: one call storing one vector step of ``n_envs`` transitions (1 and 8), inputs shaped
  ``(n_envs, ...)`` for every implementation, exactly as a vectorised env returns them.  SB3 gets
  the ``infos`` list its DQN passes (default ``handle_timeout_termination=True``).
* ``sample``: SB3 returns torch tensors (it copies with ``th.tensor``), so harness is reported
  both with its numpy output and with ``torch.as_tensor`` applied to the same five fields (six
  for PrioritizedReplay: its importance weights are needed for the loss too).  Ratios use the
  torch numbers.
* ``add + sample``: one add of a vector step followed by one sample-to-torch: the per-step
  cost of DQN with ``train_freq=1``.

Every buffer is completely filled with non-constant data before timing (untouched zero pages
would make gathers unrealistically cache friendly), so adds overwrite old data as in a long run.
Each number is the median over ``--repeats`` timed runs (after a warm-up); ratios are medians
of harness divided by medians of SB3.  Repeats are interleaved across implementations so that
background load hits all of them alike; ``--timer cpu`` measures the process's CPU time instead
of wall time, which is far less sensitive to other processes on a shared machine.  torch runs
with one intra-op thread (see ``main``), so the whole benchmark is single-threaded, and each case
runs in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import stable_baselines3
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer

from harness.data import PrioritizedReplay, ReplayMemory

logger = logging.getLogger("bench_replay")

BATCH = 256
POOL = 16  # distinct pre-generated vector steps cycled through by the add loops
IMPLS = ("harness ReplayMemory", "harness PrioritizedReplay", "SB3 ReplayBuffer")


@dataclass(frozen=True)
class Case:
    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: type[np.generic]
    n_actions: int
    capacity: int
    add_iters: int
    sample_iters: int
    loop_iters: int


def cases(quick: bool) -> list[Case]:
    scale = 20 if quick else 1
    return [
        Case(
            "CartPole-like: obs (4,) float32, Discrete(2)",
            (4,),
            np.float32,
            2,
            10_000 if quick else 100_000,
            20_000 // scale,
            4_000 // scale,
            4_000 // scale,
        ),
        Case(
            "Atari-like: obs (4, 84, 84) uint8, Discrete(6)",
            (4, 84, 84),
            np.uint8,
            6,
            2_000 if quick else 50_000,
            4_000 // scale,
            200 // scale,
            200 // scale,
        ),
    ]


@dataclass
class Step:
    """One vector step of `n` transitions in the shapes a vectorised env produces."""

    obs: np.ndarray
    next_obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    infos: list[dict[str, Any]]


def make_pool(case: Case, n_envs: int, rng: np.random.Generator) -> list[Step]:
    def obs() -> np.ndarray:
        shape = (n_envs, *case.obs_shape)
        if case.obs_dtype == np.uint8:
            return rng.integers(0, 256, size=shape, dtype=np.uint8)
        return rng.standard_normal(shape).astype(case.obs_dtype)

    return [
        Step(
            obs=obs(),
            next_obs=obs(),
            actions=rng.integers(0, case.n_actions, size=n_envs).astype(np.int64),
            rewards=rng.standard_normal(n_envs).astype(np.float32),
            dones=(rng.random(n_envs) < 0.01).astype(np.float32),
            infos=[{} for _ in range(n_envs)],
        )
        for _ in range(POOL)
    ]


def fill_rows(case: Case, rows: int, rng: np.random.Generator) -> Iterator[tuple[int, np.ndarray]]:
    """Non-constant observation data for prefilling, in chunks (start row, block)."""
    chunk = max(1, min(rows, (64 << 20) // max(1, int(np.prod(case.obs_shape)))))
    if case.obs_dtype == np.uint8:
        block = rng.integers(0, 256, size=(chunk, *case.obs_shape), dtype=np.uint8)
    else:
        block = rng.standard_normal((chunk, *case.obs_shape)).astype(case.obs_dtype)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        yield start, np.roll(block, start // chunk, axis=0)[:n]


# ----------------------------------------------------------------------------- adapters
class HarnessAdapter:
    def __init__(self, case: Case, prioritized: bool, rng: np.random.Generator) -> None:
        cls = PrioritizedReplay if prioritized else ReplayMemory
        self.prioritized = prioritized
        self.mem = cls(case.capacity, case.obs_shape, obs_dtype=case.obs_dtype, seed=0)
        for _, block in fill_rows(case, case.capacity, rng):
            n = len(block)
            self.mem.add(
                block,
                rng.integers(0, case.n_actions, size=n),
                rng.standard_normal(n).astype(np.float32),
                block[::-1],
                np.zeros(n, dtype=np.float32),
            )
        assert len(self.mem) == case.capacity

    def add(self, step: Step) -> None:
        self.mem.add(step.obs, step.actions, step.rewards, step.next_obs, step.dones)

    def add_single(self, step: Step) -> None:
        self.mem.add(step.obs[0], step.actions[0], step.rewards[0], step.next_obs[0], step.dones[0])

    def sample_numpy(self) -> Any:
        return self.mem.sample(BATCH)

    def sample_torch(self) -> Any:
        b = self.mem.sample(BATCH)
        out = (
            torch.as_tensor(b.obs),
            torch.as_tensor(b.actions),
            torch.as_tensor(b.next_obs),
            torch.as_tensor(b.dones),
            torch.as_tensor(b.rewards),
        )
        if self.prioritized:
            return (*out, torch.as_tensor(b.weights), b.indices)
        return out


class SB3Adapter:
    def __init__(self, case: Case, n_envs: int, rng: np.random.Generator) -> None:
        obs_space: spaces.Space[Any]
        if case.obs_dtype == np.uint8:
            obs_space = spaces.Box(0, 255, case.obs_shape, dtype=np.uint8)
        else:
            obs_space = spaces.Box(-np.inf, np.inf, case.obs_shape, dtype=case.obs_dtype)
        self.rb = ReplayBuffer(
            case.capacity, obs_space, spaces.Discrete(case.n_actions), device="cpu", n_envs=n_envs
        )
        rb = self.rb
        flat_obs = rb.observations.reshape(-1, *case.obs_shape)
        flat_next = rb.next_observations.reshape(-1, *case.obs_shape)
        rows = flat_obs.shape[0]
        for start, block in fill_rows(case, rows, rng):
            flat_obs[start : start + len(block)] = block
            flat_next[start : start + len(block)] = block[::-1]
        rb.actions[...] = rng.integers(0, case.n_actions, size=rb.actions.shape)
        rb.rewards[...] = rng.standard_normal(rb.rewards.shape)
        rb.full, rb.pos = True, 0

    def add(self, step: Step) -> None:
        self.rb.add(step.obs, step.next_obs, step.actions, step.rewards, step.dones, step.infos)

    def sample_torch(self) -> Any:
        return self.rb.sample(BATCH)


# ------------------------------------------------------------------------------ timing
CLOCK: Callable[[], float] = time.perf_counter


def timed_rate(fn: Callable[[int], Any], iters: int) -> float:
    """Calls per second of one timed loop of ``iters`` calls ``fn(i)`` (GC paused)."""
    gc.collect()
    gc.disable()
    try:
        t0 = CLOCK()
        for i in range(iters):
            fn(i)
        elapsed = CLOCK() - t0
    finally:
        gc.enable()
    return iters / elapsed


OPS = (
    "add, n_envs=1",
    "add, n_envs=8",
    "sample 256 -> numpy",
    "sample 256 -> torch",
    "add (n_envs=1) + sample 256 -> torch",
    "add (n_envs=8) + sample 256 -> torch",
    "add, 1 transition unbatched (harness API)",
)


def measurements(case: Case) -> dict[tuple[str, str], tuple[Callable[[int], Any], int]]:
    """Build every buffer for ``case`` and the (impl, op) -> (loop body, iterations) table."""
    rng = np.random.default_rng(1)
    np.random.seed(0)  # SB3 samples with the global numpy RNG
    p1, p8 = make_pool(case, 1, rng), make_pool(case, 8, rng)
    table: dict[tuple[str, str], tuple[Callable[[int], Any], int]] = {}
    for impl, prioritized in ((IMPLS[0], False), (IMPLS[1], True)):
        logger.info("%s: building and filling %s", case.name, impl)
        h = HarnessAdapter(case, prioritized, rng)
        table[impl, OPS[0]] = (lambda i, h=h: h.add(p1[i % POOL]), case.add_iters)
        table[impl, OPS[1]] = (lambda i, h=h: h.add(p8[i % POOL]), case.add_iters)
        table[impl, OPS[2]] = (lambda i, h=h: h.sample_numpy(), case.sample_iters)
        table[impl, OPS[3]] = (lambda i, h=h: h.sample_torch(), case.sample_iters)
        table[impl, OPS[4]] = (
            lambda i, h=h: (h.add(p1[i % POOL]), h.sample_torch()),
            case.loop_iters,
        )
        table[impl, OPS[5]] = (
            lambda i, h=h: (h.add(p8[i % POOL]), h.sample_torch()),
            case.loop_iters,
        )
        table[impl, OPS[6]] = (lambda i, h=h: h.add_single(p1[i % POOL]), case.add_iters)
    for n_envs, pool in ((1, p1), (8, p8)):
        logger.info("%s: building and filling SB3 ReplayBuffer, n_envs=%d", case.name, n_envs)
        s = SB3Adapter(case, n_envs, rng)
        table[IMPLS[2], f"add, n_envs={n_envs}"] = (
            lambda i, s=s, pool=pool: s.add(pool[i % POOL]),
            case.add_iters,
        )
        if n_envs == 1:
            table[IMPLS[2], OPS[3]] = (lambda i, s=s: s.sample_torch(), case.sample_iters)
        table[IMPLS[2], f"add (n_envs={n_envs}) + sample 256 -> torch"] = (
            lambda i, s=s, pool=pool: (s.add(pool[i % POOL]), s.sample_torch()),
            case.loop_iters,
        )
    return table


def run_case(case: Case, repeats: int) -> dict[str, dict[str, float]]:
    """Median calls/s per (impl, op).

    Repeats are interleaved (every measurement once, then again ...) so that load from other
    processes on the machine affects all implementations alike instead of whichever happened to
    run at a busy moment.
    """
    table = measurements(case)
    for fn, iters in table.values():  # warm-up: caches, allocator, lazy imports
        for i in range(max(1, iters // 10)):
            fn(i)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in table}
    for r in range(repeats):
        logger.info("%s: repeat %d/%d", case.name, r + 1, repeats)
        for key, (fn, iters) in table.items():
            samples[key].append(timed_rate(fn, iters))
    results: dict[str, dict[str, float]] = {impl: {} for impl in IMPLS}
    for (impl, op), values in samples.items():
        results[impl][op] = statistics.median(values)
    table.clear()
    gc.collect()
    return results


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "—"
    return f"**{a / b:.2f}x**"


def table(case: Case, results: dict[str, dict[str, float]]) -> str:
    rm, per, sb3 = (results[k] for k in IMPLS)
    lines = [
        f"**{case.name}**, capacity {case.capacity:,}, batch {BATCH} (calls/s, median)",
        "",
        "| operation | harness ReplayMemory | harness PrioritizedReplay | SB3 ReplayBuffer "
        "| ReplayMemory / SB3 | PrioritizedReplay / SB3 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        a, b, c = rm.get(op), per.get(op), sb3.get(op)
        lines.append(
            f"| {op} | {fmt_rate(a)} | {fmt_rate(b)} | {fmt_rate(c)} "
            f"| {fmt_ratio(a, c)} | {fmt_ratio(b, c)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (seconds)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per number (5)")
    parser.add_argument(
        "--case", choices=("all", "cartpole", "atari"), default="all", help="which cases to run"
    )
    parser.add_argument(
        "--timer",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter (default). cpu: time.process_time, i.e. CPU seconds of"
        " this (single-threaded) process; use it when other processes load the machine",
    )
    parser.add_argument(
        "--malloc-reuse",
        action="store_true",
        help="run the cases with glibc's malloc told to keep and reuse freed memory"
        " (MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_); this spares SB3's fresh per-sample"
        " allocations their page faults, i.e. its best case",
    )
    parser.add_argument("--table-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table_only and args.case == "all":
        parser.error("--table-only needs a single --case")
    global CLOCK
    if args.timer == "cpu":
        CLOCK = time.process_time
    # One intra-op thread: the only torch work here is SB3's th.tensor copies (harness's
    # as_tensor is zero-copy).  With two threads on a 2-core machine that also runs other
    # processes, OpenMP oversubscription made those copies 10x slower in wall time, which
    # would flatter harness; one thread is the conservative choice.
    torch.set_num_threads(1)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    if repeats < 1:
        parser.error("--repeats must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    names = ("cartpole", "atari")
    selected = dict(zip(names, cases(args.quick), strict=True))

    if args.table_only:  # child process: one case, table only
        sys.stdout.write(table(selected[args.case], run_case(selected[args.case], repeats)))
        return 0

    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    out = [
        f"Date: {dt.date.today().isoformat()}; command: `{command}`"
        if argv is None
        else f"Date: {dt.date.today().isoformat()}",
        f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}"
        f" ({torch.get_num_threads()} threads), stable-baselines3 {stable_baselines3.__version__};"
        f" {platform.machine()}, {os.cpu_count()} CPUs; repeats={repeats}; timer={args.timer}"
        + (" (--quick)" if args.quick else "")
        + ("; glibc malloc: reuse freed memory" if args.malloc_reuse else "")
        + "; load average at start {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()),
        "",
    ]
    # Each case runs in a fresh interpreter: the cost of large allocations depends on the
    # allocator's history (heap trimming, transparent huge pages), so running the Atari case
    # after the CartPole one in the same process would measure leftovers of the latter.
    for name in names if args.case == "all" else (args.case,):
        child = [sys.executable, os.path.abspath(__file__), "--case", name, "--table-only"]
        child += ["--repeats", str(repeats), "--timer", args.timer]
        child += ["--quick"] if args.quick else []
        env = dict(os.environ)
        if args.malloc_reuse:
            env.update(MALLOC_MMAP_THRESHOLD_=str(256 << 20), MALLOC_TRIM_THRESHOLD_=str(1 << 30))
        result = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=True, env=env)
        out += [result.stdout, ""]
    sys.stdout.write("\n".join(out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
