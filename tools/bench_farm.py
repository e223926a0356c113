"""Actor-farm overhead at scale: how much of the ideal env throughput reaches the learner.

N actors (default 256) each step one ``harness/Delay-v0`` env whose step sleeps 20 ms, so the
ideal is N x 50 steps/s (12,800 for 256) and sleeping actors fit on two cores. The learner runs
the real runner (``harness.runtime.train`` with ``run.actors = N`` on an embedded
ZeroMQ farm): actors sample actions with their copy of the policy, stream rollouts, receive
weights after every update. Measured after the farm is up (actor start-up is reported apart):

- steps/s delivered to the learner (observed by the agent) over the measuring window, and its
  ratio to the ideal (target >= 90%);
- the physical limit of this machine for the same load, measured in the same run: N plain
  processes (forked, no harness, no sockets) each stepping one ``harness/Delay-v0`` env made
  by ``gymnasium.make`` with uniformly random actions for ``--bare-seconds``; harness's
  delivered steps/s are reported as a ratio to it as well as to the ideal;
- memory: the learner's RSS and the actors' summed PSS (proportional set size, which counts
  pages shared by the fork server once) at the start and the end of the window ("flat": the
  end is within a few percent of the start).

    .venv/bin/python tools/bench_farm.py                     # 256 actors, 60 s window
    .venv/bin/python tools/bench_farm.py --actors 32 --seconds 15   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import hookimpl

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(this process's CPU seconds, summed CPU seconds of ``pids``): user + system."""
    import psutil

    def total(proc: Any) -> float:
        t = proc.cpu_times()
        return float(t.user + t.system)

    actors = 0.0
    for pid in pids:
        try:
            actors += total(psutil.Process(pid))
        except psutil.Error:
            continue
    return total(psutil.Process()), actors


def machine_cpu() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)


def memory(pids: list[int]) -> tuple[float, float]:
    """(learner RSS MiB, summed PSS MiB of ``pids``)."""
    import psutil

    me = psutil.Process().memory_info().rss / 2**20
    total = 0.0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss / 2**20
        except (psutil.Error, AttributeError):
            continue
    return me, total


def _bare_actor(step_s: float, seconds: float, ready: Any, go: Any, start: Any, out: Any) -> None:
    """One plain process: steps a gymnasium Delay env with random actions for ``seconds`` from
    the common start and counts the steps that finish in that window."""
    import random

    import numpy as np

    from harness_gymnasium.plugin import _gym

    env = _gym().make("harness/Delay-v0", step_seconds=step_s)
    env.reset(seed=os.getpid())
    rng = np.random.default_rng(os.getpid())
    ready.put(os.getpid())
    go.wait()
    end = start.value + seconds
    time.sleep(max(0.0, start.value - time.time()) + random.random() * step_s)  # random phase
    count = 0
    while True:
        _, _, terminated, truncated, _ = env.step(int(rng.integers(0, 2)))
        if terminated or truncated:
            env.reset()
        if time.time() >= end:
            break
        count += 1
    out.put(count)


def bare_reference(n: int, step_ms: float, seconds: float) -> float:
    """Steps/s of ``n`` plain processes stepping the env (see the module docstring). The
    imports happen once before the forks and the window opens when every process is ready,
    as the farm's window opens when every actor is up."""
    import multiprocessing as mp

    from harness_gymnasium.plugin import _gym

    _gym().make("harness/Delay-v0").close()  # gymnasium and the env imported before forking
    ctx = mp.get_context("fork")
    ready, out, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(
            target=_bare_actor, args=(step_ms / 1000, seconds, ready, go, start, out), daemon=True
        )
        for _ in range(n)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=300)
    start.value = time.time() + 1.0
    go.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return total / seconds


class Probe:
    """A plugin: marks the farm up once every actor delivered a rollout, opens the window
    ``warmup`` seconds later (actors reach their steady pace over ~10 s: first-touch page
    faults of hundreds of fresh processes), samples memory, counts the steps in the window."""

    def __init__(self, warmup: float, window: float) -> None:
        self.warmup, self.window = warmup, window
        self.t0: float | None = None
        self.step0 = 0
        self.t_end: float | None = None
        self.step_end = 0
        self.mem_start: tuple[float, float] | None = None
        self.mem_end: tuple[float, float] | None = None
        self.cpu_start = (0.0, 0.0)
        self.slot_steps0: list[int] = []
        self.slot_steps: list[int] = []
        self.cpu_end = (0.0, 0.0)
        self.machine_start = self.machine_end = (0, 1)
        self.farm_up: float | None = None
        self.started = time.monotonic()
        self.last: dict[str, float] = {}
        self.pids: list[int] = []

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        now = time.monotonic()
        self.last = {k: v for k, v in metrics.items() if k.startswith("farm/")}
        if self.farm_up is None:
            if not all(slot.received_steps for slot in run.collector.slots):
                return  # (streamed, iterations end before every actor delivered)
            self.farm_up = now - self.started
            self.pids = [slot.proxy.pid() for slot in run.collector.slots]
            self.warm_until = now + self.warmup
            return
        if self.t0 is None and now >= self.warm_until:
            self.t0, self.step0 = now, run.step
            self.slot_steps0 = [slot.received_steps for slot in run.collector.slots]
            self.mem_start = memory(self.pids)
            self.cpu_start = cpu_seconds(self.pids)
            self.machine_start = machine_cpu()
        elif self.t0 is not None and self.t_end is None and now >= self.t0 + self.window:
            self.t_end, self.step_end = now, run.step
            self.slot_steps = [
                s.received_steps - s0
                for s, s0 in zip(run.collector.slots, self.slot_steps0, strict=True)
            ]
            self.mem_end = memory(self.pids)
            self.cpu_end = cpu_seconds(self.pids)
            self.machine_end = machine_cpu()
            run.stop_requested = True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=60.0, help="measuring window")
    p.add_argument("--warmup", type=float, default=15.0, help="seconds after the farm is up")
    p.add_argument("--rollout", type=int, default=16, help="vector steps per actor rollout")
    p.add_argument("--lag", type=int, default=2, help="run.max_policy_lag")
    p.add_argument(
        "--algo",
        choices=["random", "dqn"],
        default="random",
        help="actor policy: random (what the farm itself costs) or dqn (a real agent: "
        "numpy Q-network on the actors, replay and updates on the learner)",
    )
    p.add_argument(
        "--bare-seconds",
        type=float,
        default=30.0,
        help="window of the plain-process reference (0: skip it)",
    )
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)

    bare = 0.0
    if args.bare_seconds:
        bare = bare_reference(args.actors, args.step_ms, args.bare_seconds)

    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    pm = make_plugin_manager()
    probe = Probe(args.warmup, args.seconds)
    pm.register(probe, name="bench-probe")
    registry = collect_registry(pm)
    out = tempfile.mkdtemp(prefix="bench_farm_")
    n = args.actors
    overrides = [
        "env='harness/Delay-v0'",
        f"env.kwargs={{step_seconds={args.step_ms / 1000}}}",
        f"actors={n}",
        f"num_envs={n}",
        "total_steps=1_000_000_000",
        f"max_seconds={args.seconds * 20 + 600}",
        "eval_every=0",
        "eval_episodes=1",
        "checkpoint_every=0",
        "trackers=[]",
        "progress=false",
        f"out='{out}'",
        f"max_policy_lag={args.lag}",
    ]
    files = []
    if args.algo == "dqn":
        files.append(ROOT / "competitions" / "cartpole" / "dqn.toml")
        overrides += [
            f"algo.train_freq={args.rollout * n}",
            "algo.gradient_steps=1",
            "algo.learning_starts=1000",
            "algo.buffer_size=200_000",
        ]
    else:
        overrides += ["algo='random'", f"algo.rollout_len={args.rollout}"]
    config = resolve(
        layer(find_pack_file(ROOT / "competitions" / "cartpole"), files, overrides), registry
    )
    load0 = os.getloadavg()
    t = time.monotonic()
    train(config, registry, pm)
    total = time.monotonic() - t
    if probe.t0 is None or probe.t_end is None or probe.mem_start is None:
        sys.exit("the run ended before the measuring window closed")
    sps = (probe.step_end - probe.step0) / (probe.t_end - probe.t0)
    ideal = n * 1000.0 / args.step_ms
    mem_end = probe.mem_end or (0.0, 0.0)
    window = probe.t_end - probe.t0
    learner_cores = (probe.cpu_end[0] - probe.cpu_start[0]) / window
    actor_cores = (probe.cpu_end[1] - probe.cpu_start[1]) / window
    idle = (probe.machine_end[0] - probe.machine_start[0]) / max(
        1, probe.machine_end[1] - probe.machine_start[1]
    )
    result = {
        "algo": args.algo,
        "actors": n,
        "step_ms": args.step_ms,
        "rollout": args.rollout,
        "max_policy_lag": args.lag,
        "window_s": round(probe.t_end - probe.t0, 1),
        "farm_startup_s": round(probe.farm_up or 0.0, 1),
        "steps_per_s": round(sps, 1),
        "ideal_steps_per_s": ideal,
        "fraction_of_ideal": round(sps / ideal, 4),
        "bare_steps_per_s": round(bare, 1),
        "fraction_of_bare": round(sps / bare, 4) if bare else None,
        "learner_cores": round(learner_cores, 3),
        "actors_cores": round(actor_cores, 3),
        "machine_idle": round(idle, 3),
        "learner_rss_mib": [round(probe.mem_start[0], 1), round(mem_end[0], 1)],
        "actors_pss_mib": [round(probe.mem_start[1], 1), round(mem_end[1], 1)],
        "farm_metrics": probe.last,
        "total_s": round(total, 1),
    }
    header = (
        f"bench_farm {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
        f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f} at start"
    )
    print(header)
    print(f"command: python tools/bench_farm.py {' '.join(argv or sys.argv[1:])}".rstrip())
    print()
    print(
        "| policy | actors | env step | ideal steps/s | plain processes steps/s | delivered "
        "steps/s | of ideal | of plain | farm start-up s | learner RSS MiB (start -> end) "
        "| actors PSS MiB (start -> end) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    of_bare = f"{sps / bare:.1%}" if bare else "-"
    print(
        f"| {args.algo} | {n} | {args.step_ms:g} ms | {ideal:,.0f} | {bare:,.0f} | {sps:,.0f} | "
        f"**{sps / ideal:.1%}** | {of_bare} | "
        f"{result['farm_startup_s']} | {probe.mem_start[0]:.0f} -> {mem_end[0]:.0f} | "
        f"{probe.mem_start[1]:.0f} -> {mem_end[1]:.0f} |"
    )
    print()
    print(
        f"CPU over the window as the kernel accounts it (tick-sampled, so only indicative): "
        f"learner {learner_cores:.2f} cores, actors {actor_cores:.2f} cores; machine idle "
        f"{idle:.0%}"
    )
    per_actor = sorted(n / window for n in probe.slot_steps)
    low, mid, high = per_actor[0], per_actor[len(per_actor) // 2], per_actor[-1]
    print(f"steps/s per actor over the window: min {low:.1f}, median {mid:.1f}, max {high:.1f}")
    print("farm metrics at the end:", json.dumps(probe.last))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
