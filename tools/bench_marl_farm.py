"""Multi-agent sampling throughput over the actor farm, per core, against a one-process loop.

The limit: one process stepping the PettingZoo adapter (harness_pettingzoo's multi-agent
vector env of ``--envs-per-actor`` copies) with uniformly random actions as fast as it can, no
runner, no sockets: env steps/s (a vector step of n copies counts n, as harness's run.step
does). The farm: the real runner (``harness.runtime.train``) with the ``random`` policy and
``run.actors = --actors`` on an embedded ZeroMQ farm, each actor stepping the same vector env;
env steps/s delivered to the learner over a window that opens ``--warmup`` seconds after every
actor delivered its first rollout. Reported per core:

    per-core efficiency = farm steps/s / (actors x one-process steps/s)    (target >= 0.85)

The actors get one core each; the learner (which only receives rollouts here) shares them, so
the farm needs ``--actors`` free cores for a fair number. The two measurements are interleaved
``--repeats`` times (the machine's drift hits both alike) and the medians are reported.

    .venv/bin/python tools/bench_marl_farm.py                            # mpe2/simple_spread_v3
    .venv/bin/python tools/bench_marl_farm.py --seconds 5 --repeats 1   # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness import hookimpl


def single_process(env_id: str, num_envs: int, seconds: float, options: dict[str, Any]) -> float:
    """Env steps/s of the adapter stepped with uniformly random actions in this process."""
    from harness_pettingzoo.plugin import PettingZooConfig, make_env

    envs = make_env(env_id, num_envs=num_envs, seed=0, options=PettingZooConfig(**options))
    rng = np.random.default_rng(0)
    discrete = {a: getattr(s, "n", None) for a, s in envs.single_action_spaces.items()}
    boxes = {a: s for a, s in envs.single_action_spaces.items() if discrete[a] is None}

    def actions() -> dict[str, np.ndarray]:
        out = {}
        for agent, n in discrete.items():
            if n is not None:
                out[agent] = (rng.random(num_envs) * n).astype(np.int64)
            else:
                space = boxes[agent]
                u = rng.random((num_envs, *space.shape), dtype=np.float32)
                out[agent] = space.low + u * (space.high - space.low)
        return out

    try:
        for _ in range(50):  # warm caches and the allocator
            envs.step(actions())
        steps = 0
        start = time.perf_counter()
        end = start + seconds
        while True:
            for _ in range(20):
                envs.step(actions())
            steps += 20
            now = time.perf_counter()
            if now >= end:
                return steps * num_envs / (now - start)
    finally:
        envs.close()


class Probe:
    """A plugin: opens the window ``warmup`` seconds after every actor delivered a rollout,
    counts the steps the learner observed in it, then stops the run."""

    def __init__(self, warmup: float, window: float) -> None:
        self.warmup, self.window = warmup, window
        self.started = time.monotonic()
        self.farm_up: float | None = None
        self.t0: float | None = None
        self.step0 = 0
        self.sps: float | None = None

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        now = time.monotonic()
        if self.farm_up is None:
            if all(slot.received_steps for slot in run.collector.slots):
                self.farm_up = now - self.started
            return
        if self.t0 is None:
            if now >= self.started + self.farm_up + self.warmup:
                self.t0, self.step0 = now, run.step
        elif now >= self.t0 + self.window:
            self.sps = (run.step - self.step0) / (now - self.t0)
            run.stop_requested = True


def farm(args: argparse.Namespace) -> tuple[float, float]:
    """(env steps/s delivered to the learner, farm start-up seconds) of one farm run."""
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    pm = make_plugin_manager()
    probe = Probe(args.warmup, args.seconds)
    pm.register(probe, name="bench-probe")
    registry = collect_registry(pm)
    with tempfile.TemporaryDirectory(prefix="bench_marl_") as out:
        overrides = [
            f"env='{args.env}'",
            "algo='random'",
            f"algo.rollout_len={args.rollout}",
            f"actors={args.actors}",
            f"num_envs={args.actors * args.envs_per_actor}",
            "total_steps=1_000_000_000",
            f"max_seconds={args.seconds * 10 + 300}",
            "eval_every=0",
            "eval_episodes=1",
            "checkpoint_every=0",
            "trackers=[]",
            "progress=false",
            f"out='{out}'",
            *(f"env.{k}={json.dumps(v)}" for k, v in _env_options(args).items()),
        ]
        config = resolve(layer(None, [], overrides, environ={}), registry)
        train(config, registry, pm)
    if probe.sps is None:
        sys.exit("the farm run ended before the measuring window closed")
    return probe.sps, probe.farm_up or 0.0


def _env_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"api": args.api, **({"max_cycles": args.max_cycles} if args.max_cycles else {})}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--env", default="mpe2/simple_spread_v3")
    p.add_argument("--api", choices=["parallel", "aec"], default="parallel")
    p.add_argument("--max-cycles", type=int, default=0, help="[env] max_cycles (0: default)")
    p.add_argument("--actors", type=int, default=2, help="actors = cores for the farm")
    p.add_argument("--envs-per-actor", type=int, default=4)
    p.add_argument("--rollout", type=int, default=32, help="vector steps per actor rollout")
    p.add_argument("--seconds", type=float, default=15.0, help="measuring window of each run")
    p.add_argument("--warmup", type=float, default=3.0, help="farm: seconds after it is up")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    load0 = os.getloadavg()
    singles: list[float] = []
    farms: list[float] = []
    startups: list[float] = []
    for round_no in range(args.repeats):
        for what in ("single", "farm") if round_no % 2 == 0 else ("farm", "single"):
            if what == "single":
                singles.append(
                    single_process(args.env, args.envs_per_actor, args.seconds, _env_options(args))
                )
            else:
                sps, up = farm(args)
                farms.append(sps)
                startups.append(up)
        print(
            f"  round {round_no + 1}: one process {singles[-1]:,.0f} steps/s, farm "
            f"{farms[-1]:,.0f} steps/s",
            file=sys.stderr,
        )
    single, farm_sps = statistics.median(singles), statistics.median(farms)
    efficiency = farm_sps / (args.actors * single)
    from benchlib import cpus_and_model

    print(
        f"bench_marl_farm {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{cpus_and_model()}, Python {platform.python_version()}; load average "
        f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} at start, "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} at end"
    )
    print(f"command: python tools/bench_marl_farm.py {shlex.join(sys.argv[1:])}".rstrip())
    print()
    print(
        "| env | api | envs per actor | one process steps/s (limit per core) | actors (cores) "
        "| farm steps/s | per-core efficiency | target | farm start-up s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {args.env} | {args.api} | {args.envs_per_actor} | {single:,.0f} | {args.actors} | "
        f"{farm_sps:,.0f} | **{efficiency:.3f}** | >= 0.85 | "
        f"{statistics.median(startups):.1f} |"
    )
    print()
    print(
        f"{args.repeats} interleaved rounds of {args.seconds:g} s windows, medians; per round: "
        f"one process {', '.join(f'{x:,.0f}' for x in singles)}; farm "
        f"{', '.join(f'{x:,.0f}' for x in farms)} steps/s."
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": shlex.join(sys.argv),
                    "single_steps_per_s": singles,
                    "farm_steps_per_s": farms,
                    "farm_startup_s": startups,
                    "per_core_efficiency": efficiency,
                    "loadavg_start": load0,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
