"""Offline training updates/s against the online learner's, for the same network and batch.

* **online**: SAC's learner as an online run drives it: ``OffPolicyAgent.learn()`` paying the
  updates the env steps earned (a replay sample, then ``SAC.learn``, per update; the last one
  of each call with diagnostics), from a replay memory holding ``--transitions`` transitions.
* **offline**: the same SAC update learned from a Minari dataset: ``algo = "cql"`` with
  ``cql_alpha = 0`` (no penalty: exactly SAC's update), ``OfflineAgent.learn()`` taking
  ``updates_per_iteration`` updates from the replay memory its dataset filled. The dataset is a
  real one, written with Minari's API into a temporary directory and read by ``load_data`` as a
  run reads it.

Both: actor and twin critics of the given widths (default 256x256 ReLU, SACConfig's), batch
256, one torch thread, a Pendulum-sized task (3 observations, 1 action) unless --obs/--act say
otherwise. Target: offline / online >= 0.90 (the offline path adds nothing per update).

For information (not part of the ratio) it also times CQL with its penalty (cql_alpha 5, 10
sampled actions per source: 30 extra critic evaluations per state) and BCQ (VAE 750x750).

Timing: after a warm-up, the agents take turns in ``--blocks`` blocks of ``--updates`` updates
each, in ABBA order within a block (online first in even blocks, offline first in odd ones), so
a drift of the machine's speed within a block cancels to first order. Rates are medians over
blocks; the ratio is taken block by block (median and min-max).

    .venv/bin/python tools/bench_offline.py                 # ~6 min on 2 cores (CQL, BCQ: ~4)
    .venv/bin/python tools/bench_offline.py --no-extra      # ~1.5 min: the ratio only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import cpus_and_model

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.plugins import collect_registry, make_plugin_manager

TARGET = 0.90


def env_info(obs_dim: int, act_dim: int) -> EnvInfo:
    return EnvInfo(
        "bench/offline",
        SpaceInfo("box", (obs_dim,), "float32", low=(-10.0,) * obs_dim, high=(10.0,) * obs_dim),
        SpaceInfo("box", (act_dim,), "float32", low=(-1.0,) * act_dim, high=(1.0,) * act_dim),
        num_envs=1,
    )


def online_agent(backend: Any, info: EnvInfo, args: argparse.Namespace) -> Callable[[int], None]:
    """SAC as an online run drives it; ``run(n)`` takes ``n`` updates."""
    from harness_algos.sac import SACConfig, make_agent

    config = SACConfig(
        hidden=args.hidden,
        batch_size=args.batch,
        learning_starts=0,
        buffer_size=args.transitions,
    )
    agent = make_agent(info, backend, config, seed=0, total_steps=10**9)
    rng = np.random.default_rng(0)
    n, d, a = args.transitions, info.observation.shape[0], info.action.shape[0]
    obs = rng.uniform(-1, 1, (n, d)).astype(np.float32)
    agent.observe(
        Transition(
            obs,
            rng.uniform(-1, 1, (n, a)).astype(np.float32),
            rng.standard_normal(n),
            obs,
            np.zeros(n, bool),
            np.zeros(n, bool),
            {},
        )
    )
    agent.counted = agent.env_steps  # (filling the replay earns no updates here)

    def run(updates: int) -> None:
        agent.env_steps += updates  # n env steps earn n updates (train_freq 1, 1 step each)
        agent.learn()

    run(args.updates)  # warm-up
    return run


def offline_agent(
    backend: Any, info: EnvInfo, args: argparse.Namespace, dataset: Path, name: str
) -> Callable[[int], None]:
    """An offline agent learning from ``dataset``; ``run(n)`` takes ``n`` updates."""
    registry = collect_registry(make_plugin_manager())
    algo = "bcq" if name == "bcq" else "cql"
    spec = registry.algorithms.get(algo)
    options: dict[str, Any] = {"hidden": args.hidden, "batch_size": args.batch}
    if name == "sac-offline":
        options["cql_alpha"] = 0.0
    config = spec.config_cls(dataset=str(dataset), updates_per_iteration=args.updates, **options)
    agent = spec.make_agent(info, backend, config, seed=0, total_steps=10**9)
    agent.load_data()
    agent.learn()  # warm-up

    def run(updates: int) -> None:
        assert updates == agent.rollout_len
        agent.learn()

    return run


def write_dataset(directory: Path, info: EnvInfo, transitions: int) -> Path:
    from harness_offline.testing import random_dataset

    length = 200
    return random_dataset(
        directory / "bench-v0", info, episodes=max(1, transitions // length), length=length
    )


def timed(run: Callable[[int], None], updates: int) -> float:
    start = time.perf_counter()
    run(updates)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--updates", type=int, default=200, help="updates per agent per block")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--obs", type=int, default=3)
    parser.add_argument("--act", type=int, default=1)
    parser.add_argument("--transitions", type=int, default=20_000)
    parser.add_argument("--no-extra", action="store_true", help="skip the CQL and BCQ rates")
    args = parser.parse_args()

    registry = collect_registry(make_plugin_manager())
    spec = registry.backends.get("torch")
    backend = spec.load(spec.config_cls(device="cpu", threads=1))
    backend.seed(0)
    info = env_info(args.obs, args.act)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = write_dataset(Path(tmp), info, args.transitions)
        online = online_agent(backend, info, args)
        offline = offline_agent(backend, info, args, dataset, "sac-offline")
        extra = {}
        if not args.no_extra:
            extra = {n: offline_agent(backend, info, args, dataset, n) for n in ("cql", "bcq")}
        online_rates, offline_rates, ratios = [], [], []
        extra_rates: dict[str, list[float]] = {n: [] for n in extra}
        half = args.updates
        for block in range(args.blocks):
            order = [online, offline, offline, online] if block % 2 == 0 else [
                offline, online, online, offline
            ]  # fmt: skip
            seconds = {id(online): 0.0, id(offline): 0.0}
            for run in order:
                seconds[id(run)] += timed(run, half)
            on = 2 * half / seconds[id(online)]
            off = 2 * half / seconds[id(offline)]
            online_rates.append(on)
            offline_rates.append(off)
            ratios.append(off / on)
            for name, run in extra.items():
                extra_rates[name].append(half / timed(run, half))
            print(
                f"block {block}: online {on:7.1f}/s  offline {off:7.1f}/s  ratio {off / on:.3f}",
                file=sys.stderr,
            )
    ratio = statistics.median(ratios)
    print(f"# Offline vs online updates/s ({cpus_and_model()}, torch, 1 thread)")
    print(
        f"SAC update, {'x'.join(map(str, args.hidden))} ReLU, batch {args.batch}, obs {args.obs}, "
        f"act {args.act}; {args.blocks} blocks x {2 * args.updates} updates each"
    )
    print(f"online SAC learner:             {statistics.median(online_rates):8.1f} updates/s")
    print(f"offline (Minari dataset, SAC):  {statistics.median(offline_rates):8.1f} updates/s")
    print(
        f"ratio offline/online: {ratio:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; "
        f"target >= {TARGET:.2f}: {'met' if ratio >= TARGET else 'NOT met'})"
    )
    for name, rates in extra_rates.items():
        label = "CQL (alpha 5, 10 samples)" if name == "cql" else "BCQ (VAE 750x750)"
        print(f"{label + ':':31} {statistics.median(rates):8.1f} updates/s (information)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
