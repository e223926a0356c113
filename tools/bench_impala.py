"""IMPALA's sampling throughput on Atari: how much of this machine's env throughput reaches the
learner through a farm of 2 actors (``--actors``).

Three measurements of the same envs (an ALE id with harness's DeepMind preprocessing, ``k``
envs per process), each over a window that opens once every process is stepping:

- **plain envs** (the physical limit): 2 forked processes (as many as actors), each stepping
  its vector env with uniformly random actions, at the same time; their summed frames/s;
- **envs + policy**: as many processes, acting with IMPALA's ``sample()`` (the CNN forward
  on the CPU, one torch thread each), as a farm actor does, without the farm;
- **IMPALA farm**: ``harness.runtime.train`` with ``algo = impala``, ``run.actors = 2`` on an
  embedded ZeroMQ farm, ``run.num_envs = 2k``: frames/s observed by the learner's agent. With
  ``--learner skip`` (default) the learner's update is replaced by a no-op that still versions
  and broadcasts the weights every iteration, which isolates sampling (a learner on an
  accelerator keeps up); ``--learner update`` runs the real V-trace updates (on this
  machine's CPUs they compete with the actors for the cores; ``device = auto`` puts them on a
  GPU where there is one).

The farm runs once per ``--inference`` mode, side by side in the same run: ``actor`` (each
actor acts with its own CNN copy) and ``central`` (actors only step envs; the learner's
policy server batches every waiting actor's observations through one forward,
``harness.runtime.inference``). For central the limit is printed beside it: the plain envs
plus the CNN forward at the mean batch size the server reached, spread over the CPUs
(``1 / (1 / plain + forward_per_obs / cpus)``), measured in this run.

Frames are emulator frames (agent steps x the frame skip of 4). Reported: each rate and the
farm's ratio to the plain envs (measured before and after the others, averaged; target
>= 85%) and to envs + policy; then the CPU microseconds per agent step of every process of
each mode over its window (the plain and acting processes; the farm's actors and learner
process, and of it the policy server thread): on a machine shared with other jobs the rates
follow the share of the cores each mode got, the CPU per step much less, and
``plain / total`` is what the farm would reach with the cores to itself. ``central@MS`` in
``--inference`` is central with ``run.inference_wait_ms = MS``.

``--policy-cost`` measures instead what bounds the ratio on a CPU-only machine: one env
process alone (microseconds per agent step) against the CNN's forward per observation at
batch 4-32, in torch's NCHW layout and in the channels-last layout the CPU backend uses, and
one learner forward + backward at batch 128, and the int8 copy ``[backend] int8_acting`` acts
with (``--int8`` runs the farm with it) and its cost per weights refresh. An actor that steps
its envs and runs the policy on the same core can deliver at most ``env / (env + forward)`` of
the plain envs.

    .venv/bin/python tools/bench_impala.py                          # Pong, 4 envs/actor, 20 s
    .venv/bin/python tools/bench_impala.py --learner update --seconds 30
    .venv/bin/python tools/bench_impala.py --envs-per-actor 32 --int8
    .venv/bin/python tools/bench_impala.py --policy-cost
    .venv/bin/python tools/bench_impala.py --inference central --seconds 5 --warmup 2  # smoke
    .venv/bin/python tools/bench_impala.py --inference central,central+cluster,actor+cluster
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench_farm import cpu_seconds  # (a sibling in tools/: the script's folder is on sys.path)

from harness import hookimpl

ROOT = Path(__file__).resolve().parents[1]
FRAME_SKIP = 4


def build_config(
    args: argparse.Namespace, out: str, overrides: Sequence[str] = ()
) -> tuple[Any, Any]:
    """The run's config (no pack: every key is given here) and the plugin registry."""
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    base = [
        f"env='{args.env}'",
        "algo='impala'",
        f"algo.cnn='{args.cnn}'",
        f"algo.rollout_len={args.rollout}",
        f"max_policy_lag={args.lag}",
        "eval_every=0",
        "eval_episodes=1",
        "checkpoint_every=0",
        "trackers=[]",
        "progress=false",
        "backend.threads=1",
        f"backend.int8_acting={str(args.int8).lower()}",
        f"out='{out}'",
    ]
    return resolve(layer(None, [], base + list(overrides), environ={}), registry), registry


def _loop(args: argparse.Namespace, act: bool, ready: Any, go: Any, start: Any, out: Any) -> None:
    """One plain process: ``k`` envs stepped with random actions, or with IMPALA's sample()
    when ``act``; counts the agent steps that finish inside the common window."""
    import numpy as np

    from harness.runtime import make_agent, make_envs
    from harness.runtime.farm import acting_config
    from harness.runtime.spaces import env_info

    config, registry = build_config(args, tempfile.gettempdir())
    envs = make_envs(config, registry, args.envs_per_actor, seed=None)
    obs, _ = envs.reset(seed=os.getpid())
    agent = None
    if act:
        agent = make_agent(acting_config(config), registry, env_info(config.run.env, envs))
    rng = np.random.default_rng(os.getpid())
    n_actions = envs.single_action_space.n
    ready.put(os.getpid())
    go.wait()
    time.sleep(max(0.0, start.value - time.time()))
    end = start.value + args.seconds
    count = 0
    cpu0 = time.process_time()
    while True:
        if agent is not None:
            actions = agent.sample(obs)[0]
        else:
            actions = rng.integers(0, n_actions, size=args.envs_per_actor)
        obs, *_ = envs.step(actions)
        if time.time() >= end:
            break
        count += args.envs_per_actor
    cpu = time.process_time() - cpu0
    envs.close()
    out.put((count, cpu))


def reference(args: argparse.Namespace, act: bool) -> tuple[float, float]:
    """Summed agent steps/s of ``--actors`` forked processes running :func:`_loop` at the
    same time, and their CPU microseconds per agent step (on a loaded machine the rate
    follows the share of the cores these processes got; the CPU per step does not)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    ready, out, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_loop, args=(args, act, ready, go, start, out), daemon=True)
        for _ in range(args.actors)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=300)
    start.value = time.time() + 1.0
    go.set()
    results = [out.get(timeout=args.seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    seconds: float = args.seconds
    total = sum(count for count, _ in results)
    return float(total) / seconds, 1e6 * sum(cpu for _, cpu in results) / max(total, 1)


CLUSTER = "+cluster"
"""An ``--inference`` mode's suffix: the farm's actors are placed by a ``harness cluster``
on loopback (started for the run, stopped after) instead of an embedded local farm; with
central inference they then reach the policy server over ZeroMQ (harness_zmq.inference)."""


def inference_overrides(mode: str) -> list[str]:
    """Config overrides of an ``--inference`` mode: ``actor``, ``central``, ``auto``, or
    ``central@MS`` (central with ``run.inference_wait_ms = MS``: the server waits up to MS
    milliseconds for more actors' requests before each batch), each optionally with
    ``+cluster`` (:data:`CLUSTER`)."""
    name, _, wait = mode.removesuffix(CLUSTER).partition("@")
    return [f"inference='{name}'", f"inference_wait_ms={float(wait or 0)}"]


@contextlib.contextmanager
def loopback_cluster(cpus: int) -> Iterator[str]:
    """A ``harness cluster`` on 127.0.0.1 with a local worker of ``cpus``; its address."""
    state = tempfile.mkdtemp(prefix="bench_impala_cluster_")
    env = dict(os.environ, HARNESS_STATE_DIR=state)
    harness = [sys.executable, "-m", "harness.cli", "cluster"]
    started = subprocess.run(
        [*harness, "start", "--port", "0", "--cpus", str(cpus)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    found = re.search(r"cluster started at (\S+)", started.stdout)
    if started.returncode != 0 or not found:
        sys.exit(f"could not start a loopback cluster: {started.stderr.strip()}")
    try:
        yield found.group(1)
    finally:
        subprocess.run([*harness, "stop", found.group(1)], env=env, timeout=60, check=False)
        shutil.rmtree(state, ignore_errors=True)


class Probe:
    """A plugin: opens the window ``warmup`` s after every actor delivered a rollout, counts
    the steps observed in it, then stops the run; with ``skip_learning`` the agent's update is
    a no-op (the rollout is dropped; weights are still versioned and broadcast)."""

    def __init__(self, warmup: float, window: float, skip_learning: bool) -> None:
        self.warmup, self.window, self.skip = warmup, window, skip_learning
        self.t0: float | None = None
        self.t_end: float | None = None
        self.step0 = self.step_end = 0
        self.warm_until: float | None = None
        self.last: dict[str, float] = {}
        self.updates = 0
        self.pids: list[int] = []
        self.cpu0 = self.cpu1 = (0.0, 0.0)

    @hookimpl
    def harness_run_start(self, run: Any) -> None:
        if self.skip:
            agent = run.agent

            def no_update() -> dict[str, float]:
                agent.buffer.reset()
                return {}

            agent.learn = no_update

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        now = time.monotonic()
        self.last = {k: v for k, v in metrics.items() if k.startswith(("farm/", "vtrace/"))}
        if self.warm_until is None:
            if all(slot.received_steps for slot in run.collector.slots):
                self.warm_until = now + self.warmup
            return
        if self.t0 is None and now >= self.warm_until:
            self.pids = [slot.proxy.pid() for slot in run.collector.slots]
            self.cpu0 = cpu_seconds(self.pids)
            self.t0, self.step0, self.updates = time.monotonic(), run.step, run.agent.updates
        elif self.t0 is not None and now >= self.t0 + self.window:
            self.t_end, self.step_end = now, run.step
            self.cpu1 = cpu_seconds(self.pids)
            self.updates = run.agent.updates - self.updates
            run.stop_requested = True

    def cpu_us_per_step(self) -> tuple[float, float]:
        """CPU microseconds per agent step delivered in the window: (the learner process,
        the actors)."""
        steps = max(self.step_end - self.step0, 1)
        return tuple(  # type: ignore[return-value]
            1e6 * (b - a) / steps for a, b in zip(self.cpu0, self.cpu1, strict=True)
        )


def farm(args: argparse.Namespace, inference: str = "actor") -> tuple[float, Probe]:
    from harness.plugins import make_plugin_manager
    from harness.runtime import train

    out = tempfile.mkdtemp(prefix="bench_impala_")
    k = args.envs_per_actor
    overrides = [
        f"actors={args.actors}",
        f"num_envs={args.actors * k}",
        "total_steps=1_000_000_000",
        f"max_seconds={args.seconds * 10 + 300}",
        *inference_overrides(inference),
    ]
    pm = make_plugin_manager()
    probe = Probe(args.warmup, args.seconds, args.learner == "skip")
    pm.register(probe, name="bench-probe")
    with contextlib.ExitStack() as stack:
        if inference.endswith(CLUSTER):
            address = stack.enter_context(loopback_cluster(args.actors))
            overrides.append(f"cluster='{address}'")
        config, registry = build_config(args, out, overrides)
        try:
            train(config, registry, pm)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    if probe.t0 is None or probe.t_end is None:
        sys.exit("the run ended before the measuring window closed")
    return (probe.step_end - probe.step0) / (probe.t_end - probe.t0), probe


def forward_per_obs(args: argparse.Namespace, batch: int) -> float:
    """Seconds per observation of the acting agent's ``sample`` at ``batch`` observations,
    in this process, as the central policy server runs it."""
    import dataclasses

    import numpy as np

    from harness.runtime import make_agent, make_envs
    from harness.runtime.farm import acting_config
    from harness.runtime.spaces import env_info

    config, registry = build_config(args, tempfile.gettempdir())
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=batch)
    envs.close()
    agent = make_agent(acting_config(config), registry, info)
    obs = np.random.default_rng(0).integers(0, 256, (batch, *info.observation.shape), np.uint8)
    for _ in range(3):
        agent.sample(obs)
    repeats = 30
    t = time.perf_counter()
    for _ in range(repeats):
        agent.sample(obs)
    return (time.perf_counter() - t) / repeats / batch


def policy_cost(args: argparse.Namespace) -> None:
    """Env step vs the CNN's forward per observation (see the module docstring)."""
    import numpy as np
    import torch

    from harness_algos.impala import CNN_PRESETS
    from harness_torch.backend import TorchBackend
    from harness_torch.int8 import Int8CNN
    from harness_torch.plugin import TorchConfig

    one = argparse.Namespace(**{**vars(args), "actors": 1})
    env_us = 1e6 / reference(one, act=False)[0]  # one process alone: us per agent step
    bk = TorchBackend(TorchConfig(device="cpu", threads=1))
    preset = dict(CNN_PRESETS[args.cnn])  # IMPALA's trunk, as the farm actors build it
    nhwc = bk.cnn((4, 84, 84), preset.pop("out_dim"), **preset)
    nchw = copy.deepcopy(nhwc)  # the same weights in torch's default layout
    nchw.channels_last = False
    nchw.convs.to(memory_format=torch.contiguous_format)
    rng = np.random.default_rng(0)

    def frames(batch: int) -> torch.Tensor:
        return torch.as_tensor(rng.integers(0, 256, (batch, 4, 84, 84), dtype=np.uint8))

    def timed(fn: Any, repeats: int) -> float:
        for _ in range(3):
            fn()
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t) / repeats

    print(
        f"bench_impala --policy-cost {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{args.env}, {args.cnn} CNN, one thread; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"command: .venv/bin/python tools/bench_impala.py --policy-cost --cnn {args.cnn}")
    print(
        f"\none env process, random actions: {env_us:.0f} us per agent step ({FRAME_SKIP} frames)"
    )
    int8 = Int8CNN(nhwc)  # what [backend] int8_acting builds for acting
    print(
        "\n| batch | NCHW us/obs | channels-last us/obs | int8 us/obs "
        "| cap NCHW | cap channels-last | cap int8 |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with torch.no_grad():
        for batch in (4, 8, 16, 32):
            x = frames(batch)
            cost = [timed(lambda m=m, x=x: m(x), 40) / batch * 1e6 for m in (nchw, nhwc)]
            x_np = x.numpy()
            cost.append(timed(lambda x_np=x_np: int8(x_np), 40) / batch * 1e6)
            caps = " | ".join(f"{env_us / (env_us + c):.0%}" for c in cost)
            print(f"| {batch} | {cost[0]:.0f} | {cost[1]:.0f} | {cost[2]:.0f} | {caps} |")
    x_np = frames(16).numpy()

    def refresh() -> None:
        int8.load()  # after new weights: re-quantize, then calibrate on the next batch
        int8(x_np)

    print(
        f"\nint8 refresh (re-quantize the weights, calibrate and run one batch of 16), once per "
        f"weights version: {timed(refresh, 10) * 1e3:.1f} ms"
    )
    x = frames(128)
    train = [timed(lambda m=m, x=x: m(x).square().sum().backward(), 5) * 1e3 for m in (nchw, nhwc)]
    print(
        f"\nlearner forward + backward, batch 128: NCHW {train[0]:.0f} ms, channels-last "
        f"{train[1]:.0f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="ALE/Pong-v5")
    p.add_argument("--actors", type=int, default=2, help="farm actors = reference processes")
    p.add_argument("--envs-per-actor", type=int, default=4, help="k envs per process")
    p.add_argument("--seconds", type=float, default=20.0, help="each measuring window")
    p.add_argument("--warmup", type=float, default=5.0, help="farm: seconds after it is up")
    p.add_argument("--rollout", type=int, default=20, help="algo.rollout_len")
    p.add_argument("--lag", type=int, default=2, help="run.max_policy_lag")
    p.add_argument("--cnn", choices=["nature", "shallow"], default="nature")
    p.add_argument("--learner", choices=["skip", "update"], default="skip")
    p.add_argument(
        "--int8", action="store_true", help="[backend] int8_acting: the actors' CNN in int8"
    )
    p.add_argument(
        "--inference",
        default="actor,central",
        help="comma-separated run.inference modes of the farm (central@MS: central with "
        "run.inference_wait_ms = MS; MODE+cluster: the actors placed by a loopback harness "
        "cluster, central then over ZeroMQ), each measured in turn",
    )
    p.add_argument(
        "--policy-cost",
        action="store_true",
        help="measure env step vs CNN forward per observation instead (what bounds the ratio)",
    )
    args = p.parse_args(argv)
    if args.policy_cost:
        policy_cost(args)
        return

    load0 = os.getloadavg()
    # the plain envs before and after: on a shared machine the load drifts between windows
    plain_before, plain_cpu = reference(args, act=False)
    acting, acting_cpu = reference(args, act=True)
    modes = [m.strip() for m in args.inference.split(",") if m.strip()]
    farms = {mode: farm(args, mode) for mode in modes}
    plain_after, _ = reference(args, act=False)
    plain = (plain_before + plain_after) / 2
    load1 = os.getloadavg()

    def fps(steps_per_s: float) -> str:
        return f"{steps_per_s * FRAME_SKIP:,.0f}"

    print(
        f"bench_impala {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
        f"{load0[0]:.1f} at start, {load1[0]:.1f} at end (a shared machine: other jobs ran)"
    )
    print(f"command: .venv/bin/python tools/bench_impala.py {' '.join(argv or sys.argv[1:])}")
    print()
    print(
        "| env | cnn | processes | envs/process | learner | inference | plain envs frames/s "
        "| envs + policy frames/s "
        "| IMPALA farm frames/s | farm / plain | farm / envs + policy | limit frames/s "
        "| limit / plain |"
    )
    print("|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    cpus = os.cpu_count() or 1
    for mode, (delivered, probe) in farms.items():
        limit = ""
        batch = probe.last.get("farm/inference_batch", 0.0)
        if batch >= 1:
            cost = forward_per_obs(args, max(1, round(batch)))
            rate = 1.0 / (1.0 / plain + cost / cpus)
            limit = f"{fps(rate)} (batch {batch:.1f}, {cost * 1e6:.0f} us/obs) | {rate / plain:.1%}"
        else:
            limit = "- | -"
        print(
            f"| {args.env} | {args.cnn} | {args.actors} | {args.envs_per_actor} | "
            f"{args.learner} | {mode} | "
            f"{fps(plain)} ({fps(plain_before)} before, {fps(plain_after)} after) | "
            f"{fps(acting)} | {fps(delivered)} | **{delivered / plain:.1%}** | "
            f"{delivered / acting:.1%} | {limit} |"
        )
    print()
    print()
    print(
        "CPU microseconds per agent step over each window (user + system, every process of "
        "the mode): on a machine whose cores are all busy (this one's, shared) the rates follow "
        "the share of the cores each mode got; the CPU per step does not. `plain / total` is "
        "the farm's rate over the plain envs' when both have the same cores to themselves."
    )
    print()
    print("| mode | actors | learner process | of it: policy server | total | plain / total |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| plain envs | {plain_cpu:.0f} | - | - | {plain_cpu:.0f} | 100% |")
    print(f"| envs + policy | {acting_cpu:.0f} | - | - | {acting_cpu:.0f} | "
          f"{plain_cpu / acting_cpu:.1%} |")  # fmt: skip
    for mode, (_, probe) in farms.items():
        learner, actors = probe.cpu_us_per_step()
        server = probe.last.get("farm/inference_cpu_us_per_row")
        shown = "-" if server is None else f"{server:.0f} (last iteration)"
        total = learner + actors
        print(
            f"| farm, {mode} | {actors:.0f} | {learner:.0f} | {shown} | {total:.0f} | "
            f"{plain_cpu / total:.1%} |"
        )
    print()
    for mode, (_, probe) in farms.items():
        print(
            f"{mode}: window {args.seconds:g} s; {probe.updates} updates in the window, "
            f"metrics at the end: {probe.last}"
        )


if __name__ == "__main__":
    main()
