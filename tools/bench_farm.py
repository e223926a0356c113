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

``--inference actor,central`` measures the farm once per ``run.inference`` mode, side by side
in the same run (one row each): ``actor`` (every actor acts with its own copy of the
policy) and ``central`` (actors only step envs; the learner's policy server acts for all
of them in batches, ``harness.runtime.inference``). With ``--algo dqn`` that is the Q-network
forward on every actor against one batched forward:

    .venv/bin/python tools/bench_farm.py --algo dqn --inference actor,central

``central@MS`` is central with ``run.inference_wait_ms = MS`` (the server waits up to MS
milliseconds for more actors' requests before a batch; ~3 ms paid best with 256 actors):

    .venv/bin/python tools/bench_farm.py --algo dqn --inference actor,central,central@3

Ray mode (``--impls`` with ``ray`` or ``raw-ray``): the same load on several implementations in
one run, each run in a fresh subprocess, in a private loopback-only network namespace (Ray
binds every interface; ``unshare -n``, as root), ``--rounds`` times in alternating order (ABBA,
so the machine's drift hits neighbours alike), the plain-process reference once before them:

- ``zmq``: the harness farm above (``run.transport = "zmq"``);
- ``ray``: the same harness farm with ``run.transport = "ray"`` (a local Ray with one CPU per
  actor, ``ray.init(num_cpus=N, include_dashboard=False)``, started by the transport);
- ``raw-ray``: what one writes with Ray alone: N ``@ray.remote`` actors, each stepping one
  ``harness/Delay-v0`` env (``gymnasium.make``) with uniformly random actions and returning
  ``--rollout``-step rollouts as time-major numpy arrays; a driver loop keeps ``--lag``
  rollouts in flight per actor (as the farm does) and takes them with
  ``ray.wait(num_returns=1)``, asking the actor for the next one at once. Same ``ray.init``.

    .venv/bin/python tools/bench_farm.py --impls zmq,ray,raw-ray --actors 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import hookimpl

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("zmq", "ray", "raw-ray")
HOST_NETNS_VARIABLE = "BENCH_FARM_HOST_NETNS"
"""Set by the orchestrator for its runs: its own network namespace."""
LABELS = {
    "zmq": "harness farm, zmq transport",
    "ray": "**harness farm, ray transport**",
    "raw-ray": "raw Ray actors + `ray.wait`",
}


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


def namespace_pss() -> float | None:
    """Summed PSS MiB of every process in this process's network namespace when that is a
    private one (Ray mode: the learner or driver, the actors and, on Ray, its daemons and idle
    workers); None when it is the orchestrator's (``HOST_NETNS_VARIABLE``) or unknown."""
    import psutil

    own = os.readlink("/proc/self/ns/net")
    if os.environ.get(HOST_NETNS_VARIABLE, own) == own:
        return None
    total = 0.0
    for proc in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") == own:
                total += proc.memory_full_info().pss / 2**20
        except (OSError, psutil.Error):
            continue
    return total


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
    return float(total) / seconds


def inference_overrides(mode: str) -> list[str]:
    """Config overrides of an ``--inference`` mode: ``actor``, ``central``, ``auto``, or
    ``central@MS`` (central with ``run.inference_wait_ms = MS``: the server waits up to MS
    milliseconds for more actors' requests before each batch)."""
    name, _, wait = mode.partition("@")
    return [f"inference='{name}'", f"inference_wait_ms={float(wait or 0)}"]


class Probe:
    """A plugin: marks the farm up once every actor delivered a rollout, opens the window
    ``warmup`` seconds later (actors reach their steady pace over ~10 s: first-touch page
    faults of hundreds of fresh processes), samples memory, counts the steps in the window.

    The start sample of the actors' memory is taken a third of the warm-up before the window
    opens (reading hundreds of processes' page maps stalls the learner for a moment, which
    the window then does not see); the end sample right after it closes."""

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
        self.warm_until = self.memory_at = 0.0
        self.all_pss_end: float | None = None
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
            self.memory_at = self.warm_until - self.warmup / 3
            return
        if self.mem_start is None and now >= self.memory_at:
            self.mem_start = memory(self.pids)
        elif self.t0 is None and now >= self.warm_until:
            self.t0, self.step0 = now, run.step
            self.slot_steps0 = [slot.received_steps for slot in run.collector.slots]
            self.cpu_start = cpu_seconds(self.pids)
            self.machine_start = machine_cpu()
        elif self.t0 is not None and self.t_end is None and now >= self.t0 + self.window:
            self.t_end, self.step_end = now, run.step
            self.slot_steps = [
                s.received_steps - s0
                for s, s0 in zip(run.collector.slots, self.slot_steps0, strict=True)
            ]
            self.cpu_end = cpu_seconds(self.pids)
            self.machine_end = machine_cpu()
            self.mem_end = memory(self.pids)
            self.all_pss_end = namespace_pss()
            run.stop_requested = True


def harness_farm(
    args: argparse.Namespace, transport: str = "zmq", inference: str = "actor"
) -> dict[str, Any]:
    """One run of the real runner over an actor farm on ``transport``; the measured result."""
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
        f"transport='{transport}'",
        *inference_overrides(inference),
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
    t = time.monotonic()
    train(config, registry, pm)
    total = time.monotonic() - t
    if probe.t0 is None or probe.t_end is None or probe.mem_start is None:
        sys.exit("the run ended before the measuring window closed")
    return _result(
        args,
        steps=probe.step_end - probe.step0,
        window=probe.t_end - probe.t0,
        farm_up=probe.farm_up or 0.0,
        per_actor=probe.slot_steps,
        mem=(probe.mem_start, probe.mem_end or (0.0, 0.0)),
        cpu=(probe.cpu_start, probe.cpu_end),
        machine=(probe.machine_start, probe.machine_end),
        all_pss=probe.all_pss_end,
        extra={"farm_metrics": probe.last, "total_s": round(total, 1)},
    )


def _result(
    args: argparse.Namespace,
    *,
    steps: int,
    window: float,
    farm_up: float,
    per_actor: list[int],
    mem: tuple[tuple[float, float], tuple[float, float]],
    cpu: tuple[tuple[float, float], tuple[float, float]],
    machine: tuple[tuple[int, int], tuple[int, int]],
    all_pss: float | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The JSON result of one farm run (harness's or raw Ray's)."""
    ideal = args.actors * 1000.0 / args.step_ms
    sps = steps / window
    idle = (machine[1][0] - machine[0][0]) / max(1, machine[1][1] - machine[0][1])
    rates = sorted(k / window for k in per_actor)
    return {
        "algo": args.algo,
        "actors": args.actors,
        "step_ms": args.step_ms,
        "rollout": args.rollout,
        "max_policy_lag": args.lag,
        "window_s": round(window, 1),
        "farm_startup_s": round(farm_up, 1),
        "steps_per_s": round(sps, 1),
        "ideal_steps_per_s": ideal,
        "fraction_of_ideal": round(sps / ideal, 4),
        "learner_cores": round((cpu[1][0] - cpu[0][0]) / window, 3),
        "actors_cores": round((cpu[1][1] - cpu[0][1]) / window, 3),
        "machine_idle": round(idle, 3),
        "learner_rss_mib": [round(mem[0][0], 1), round(mem[1][0], 1)],
        "actors_pss_mib": [round(mem[0][1], 1), round(mem[1][1], 1)],
        "all_pss_mib": None if all_pss is None else round(all_pss, 1),
        "actor_sps": [round(rates[0], 2), round(rates[len(rates) // 2], 2), round(rates[-1], 2)],
        "loadavg": os.getloadavg(),
        **extra,
    }


# ------------------------------------------------------------------------------------------
# raw Ray: the same load written with Ray alone


class RawRayRollout:
    """A plain Ray actor: one ``harness/Delay-v0`` env made by ``gymnasium.make``, uniformly
    random actions, rollouts of ``steps`` steps as time-major numpy arrays ``(steps, 1, ...)``
    (the layout harness's actors return for their one env), finished episodes beside them."""

    def __init__(self, step_seconds: float, steps: int, seed: int) -> None:
        import gymnasium as gym
        import numpy as np

        if "harness/Delay-v0" not in gym.registry:
            gym.register("harness/Delay-v0", entry_point="harness_gymnasium.delay:DelayEnv")
        self.np = np
        self.env = gym.make("harness/Delay-v0", step_seconds=step_seconds)
        self.obs, _ = self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.steps = steps
        self.episode_return = 0.0
        self.episode_length = 0

    def rollout(self) -> dict[str, Any]:
        np, n = self.np, self.steps
        obs = np.empty((n, 1, *self.obs.shape), self.obs.dtype)
        next_obs = np.empty_like(obs)
        actions = np.empty((n, 1), np.int64)
        rewards = np.empty((n, 1), np.float64)
        terminated = np.empty((n, 1), bool)
        truncated = np.empty((n, 1), bool)
        episodes: list[tuple[float, int]] = []
        for t in range(n):
            action = int(self.rng.random() * 2)
            after, reward, term, trunc, _ = self.env.step(action)
            obs[t, 0], next_obs[t, 0], actions[t, 0] = self.obs, after, action
            rewards[t, 0], terminated[t, 0], truncated[t, 0] = reward, term, trunc
            self.episode_return += float(reward)
            self.episode_length += 1
            if term or trunc:
                episodes.append((self.episode_return, self.episode_length))
                self.episode_return, self.episode_length = 0.0, 0
                after, _ = self.env.reset()
            self.obs = after
        return {
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "next_obs": next_obs,
            "terminated": terminated,
            "truncated": truncated,
            "episodes": episodes,
        }

    def pid(self) -> int:
        return os.getpid()


def raw_ray_farm(args: argparse.Namespace) -> dict[str, Any]:
    """N raw Ray actors and a driver loop (see the module docstring), measured like the farm:
    up when every actor delivered a rollout, the window ``--warmup`` s later."""
    import ray

    n, depth = args.actors, max(1, args.lag)
    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
    try:
        remote_cls: Any = ray.remote(num_cpus=1, max_restarts=0)(RawRayRollout)
        started = time.monotonic()
        actors: list[Any] = [
            remote_cls.remote(args.step_ms / 1000, args.rollout, 7919 * i + 1) for i in range(n)
        ]
        pids: list[int] = ray.get([a.pid.remote() for a in actors])
        owner: dict[Any, int] = {}
        for i, actor in enumerate(actors):
            for _ in range(depth):
                owner[actor.rollout.remote()] = i
        pending = list(owner)
        delivered = [0] * n
        steps = 0
        farm_up: float | None = None
        warm_until = memory_at = 0.0
        mem_start: tuple[float, float] | None = None
        t0: float | None = None
        step0, delivered0 = 0, [0] * n
        cpu_start, machine_start = (0.0, 0.0), (0, 1)
        while True:
            ready, pending = ray.wait(pending, num_returns=1)
            i = owner.pop(ready[0])
            chunk = ray.get(ready[0])
            following = actors[i].rollout.remote()  # the actor steps on at once
            owner[following] = i
            pending.append(following)
            rows = int(chunk["obs"].shape[0] * chunk["obs"].shape[1])
            steps += rows
            delivered[i] += rows
            now = time.monotonic()
            if farm_up is None:
                if all(delivered):
                    farm_up = now - started
                    warm_until = now + args.warmup
                    memory_at = warm_until - args.warmup / 3
                continue
            if mem_start is None and now >= memory_at:
                mem_start = memory(pids)
            elif t0 is None and now >= warm_until:
                t0, step0, delivered0 = now, steps, list(delivered)
                cpu_start, machine_start = cpu_seconds(pids), machine_cpu()
            elif t0 is not None and now >= t0 + args.seconds:
                cpu_end, machine_end = cpu_seconds(pids), machine_cpu()
                mem_end = memory(pids)
                all_pss = namespace_pss()
                break
        assert mem_start is not None
        return _result(
            args,
            steps=steps - step0,
            window=now - t0,
            farm_up=farm_up,
            per_actor=[d - d0 for d, d0 in zip(delivered, delivered0, strict=True)],
            mem=(mem_start, mem_end),
            cpu=(cpu_start, cpu_end),
            machine=(machine_start, machine_end),
            all_pss=all_pss,
            extra={"total_s": round(time.monotonic() - started, 1)},
        )
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------------------
# several implementations in one run (Ray mode)


def run_worker(
    impl: str, args: argparse.Namespace, tmp: Path, label: str, use_netns: bool
) -> dict[str, Any]:
    """One farm run of ``impl`` in a fresh subprocess and session (in a private loopback-only
    network namespace when ``use_netns``); whatever it leaves behind is killed by PID."""
    from bench_remote import NETNS_SETUP, _sweep

    work = tmp / label  # short: Ray's unix sockets live below it
    work.mkdir()
    (work / "home").mkdir()
    out = work / "result.json"
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--json", str(out),
        "--actors", str(args.actors), "--step-ms", str(args.step_ms),
        "--seconds", str(args.seconds), "--warmup", str(args.warmup),
        "--rollout", str(args.rollout), "--lag", str(args.lag), "--algo", args.algo,
    ]  # fmt: skip
    if use_netns:
        cmd = ["unshare", "-n", "sh", "-c", NETNS_SETUP + ' && exec "$@"', "sh", *cmd]
    env = dict(
        os.environ,
        HOME=str(work / "home"),  # Ray's ~/.ray (its auth token)
        RAY_TMPDIR=str(work),  # Ray's session directory
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        **{HOST_NETNS_VARIABLE: os.readlink("/proc/self/ns/net")},
    )
    started = time.monotonic()
    netns_file = work / "netns"
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            rc: int | None = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also on Ctrl-C / SIGTERM: nothing a run started may outlive it
            _sweep(proc.pid, netns_file.read_text() if netns_file.exists() else None)
            proc.wait(timeout=10)
    seconds = time.monotonic() - started
    if rc == 0 and out.exists():
        result: dict[str, Any] = json.loads(out.read_text())
        return dict(result, impl=impl, ok=True, seconds=round(seconds, 1))
    tail = (work / "log.txt").read_text(errors="replace").strip().splitlines()[-12:]
    why = f"timed out after {args.run_timeout:.0f} s" if rc is None else f"exit {rc}"
    return {"impl": impl, "ok": False, "reason": why, "log_tail": tail}


def compare(args: argparse.Namespace, impls: list[str]) -> dict[str, Any]:
    """The plain-process reference, then ``--rounds`` rounds of every implementation in
    alternating order; returns the header and the runs."""
    from bench_remote import _netns_works

    use_netns = _netns_works()
    if not use_netns and any("ray" in i for i in impls) and not args.no_netns:
        sys.exit(
            "Ray binds every interface: run as root (unshare -n) for a private loopback-only "
            "network namespace, or pass --no-netns to let it use the host's addresses"
        )
    load0 = os.getloadavg()
    header = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python tools/bench_farm.py " + shlex.join(sys.argv[1:]),
        "machine": _machine(),
        "loadavg_start": load0,
        "netns": use_netns,
        "versions": _versions(),
    }
    print(f"bench_farm: {header['machine']}; load {load0[0]:.2f}", file=sys.stderr)
    bare = 0.0
    if args.bare_seconds:
        bare = bare_reference(args.actors, args.step_ms, args.bare_seconds)
        print(f"  plain processes: {bare:,.0f} steps/s", file=sys.stderr)
    header["bare_steps_per_s"] = round(bare, 1)
    runs: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bf_", dir="/tmp") as tmp:
        for round_no in range(args.rounds):
            for impl in impls if round_no % 2 == 0 else impls[::-1]:
                result = run_worker(impl, args, Path(tmp), f"{round_no}{impl}", use_netns)
                result["round"] = round_no
                runs.append(result)
                if result["ok"]:
                    print(
                        f"  round {round_no + 1} {impl:8s} {result['steps_per_s']:,.0f} steps/s "
                        f"({result['fraction_of_ideal']:.1%} of ideal; start-up "
                        f"{result['farm_startup_s']} s; {result['seconds']:.0f} s)",
                        file=sys.stderr,
                    )
                else:
                    print(f"  round {round_no + 1} {impl:8s} not run: {result['reason']}\n    "
                          + "\n    ".join(result["log_tail"]), file=sys.stderr)  # fmt: skip
    header["loadavg_end"] = os.getloadavg()
    return {"header": header, "runs": runs}


def _machine() -> str:
    from benchlib import cpus_and_model

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpus_and_model()}, {mem:.0f} GiB RAM, Python {platform.python_version()}"


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("harness", "ray", "pyzmq", "numpy", "gymnasium"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def compare_report(saved: dict[str, Any]) -> str:
    """Markdown: every run, then each implementation's median and harness-on-Ray / raw Ray."""
    header, runs = saved["header"], saved["runs"]
    bare = header.get("bare_steps_per_s") or 0.0
    good = [r for r in runs if r.get("ok")]
    n = good[0]["actors"] if good else 0
    load0, load1 = header["loadavg_start"], header.get("loadavg_end", header["loadavg_start"])
    lines = [
        f"Date: {header['date']}; command: `{header['command']}`",
        "",
        f"Machine: {header['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in header["versions"].items())
        + "; each run in a fresh subprocess"
        + (" and a private loopback-only network namespace" if header["netns"] else "")
        + f"; load average (1/5/15 min) {', '.join(f'{x:.2f}' for x in load0)} at start, "
        f"{', '.join(f'{x:.2f}' for x in load1)} at end.",
        "",
        "| round | implementation | actors | ideal steps/s | delivered steps/s | of ideal | "
        "of plain processes | start-up s | per-actor steps/s (min/median/max) | machine idle "
        "| learner RSS MiB | actors PSS MiB (start -> end) | all processes PSS MiB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if not r.get("ok"):
            lines.append(f"| {r['round'] + 1} | {LABELS[r['impl']]} | not run ({r['reason']}) |"
                         + " |" * 10)  # fmt: skip
            continue
        of_bare = f"{r['steps_per_s'] / bare:.1%}" if bare else "-"
        lo, mid, hi = r["actor_sps"]
        all_pss = "-" if r.get("all_pss_mib") is None else f"{r['all_pss_mib']:,.0f}"
        lines.append(
            f"| {r['round'] + 1} | {LABELS[r['impl']]} | {r['actors']} | "
            f"{r['ideal_steps_per_s']:,.0f} | {r['steps_per_s']:,.0f} | "
            f"**{r['fraction_of_ideal']:.1%}** | {of_bare} | {r['farm_startup_s']} | "
            f"{lo:.1f} / {mid:.1f} / {hi:.1f} | {r['machine_idle']:.0%} | "
            f"{r['learner_rss_mib'][1]:,.0f} | {r['actors_pss_mib'][0]:,.0f} -> "
            f"{r['actors_pss_mib'][1]:,.0f} | {all_pss} |"
        )
    lines.append("")
    if bare:
        lines += [f"Plain processes (no harness, no Ray): {bare:,.0f} steps/s, "
                  f"{bare / (n * 50 * 20 / good[0]['step_ms']):.1%} of the ideal."
                  if good else "", ""]  # fmt: skip
    by: dict[str, dict[int, float]] = {}
    for r in good:
        by.setdefault(r["impl"], {})[r["round"]] = r["fraction_of_ideal"]
    if "ray" in by and "raw-ray" in by:
        rounds = sorted(set(by["ray"]) & set(by["raw-ray"]))
        ratios = [by["ray"][k] / by["raw-ray"][k] for k in rounds]
        ray_med = statistics.median(by["ray"].values())
        raw_med = statistics.median(by["raw-ray"].values())
        value = ray_med / raw_med
        verdict = "**yes**" if value >= 0.87 else "**no**"
        lines += [
            "| measure | value | per round | target | met |",
            "|---|---:|---:|---:|:---:|",
            f"| harness farm on Ray / raw Ray actors, delivered steps/s (median of rounds) | "
            f"{value:.3f}x ({ray_med:.1%} / {raw_med:.1%} of ideal) | "
            f"{', '.join(f'{x:.3f}x' for x in ratios)} | >= 0.87x | {verdict} |",
        ]
        if "zmq" in by:
            zmq_med = statistics.median(by["zmq"].values())
            lines.append(
                f"| harness farm on ZeroMQ / raw Ray actors (information) | "
                f"{zmq_med / raw_med:.3f}x ({zmq_med:.1%} of ideal) | "
                + ", ".join(
                    f"{by['zmq'][k] / by['raw-ray'][k]:.3f}x"
                    for k in sorted(set(by["zmq"]) & set(by["raw-ray"]))
                )
                + " | — | — |"
            )
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------


def print_single(
    args: argparse.Namespace, results: dict[str, dict[str, Any]], bare: float, load0: Any
) -> None:
    """The report of the in-process zmq runs (the default mode), one per inference mode."""
    header = (
        f"bench_farm {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
        f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f} at start"
    )
    print(header)
    print(f"command: python tools/bench_farm.py {shlex.join(sys.argv[1:])}".rstrip())
    print()
    print(
        "| policy | inference | actors | env step | ideal steps/s | plain processes steps/s "
        "| delivered steps/s | of ideal | of plain | farm start-up s "
        "| learner RSS MiB (start -> end) | actors PSS MiB (start -> end) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, result in results.items():
        n, sps, ideal = result["actors"], result["steps_per_s"], result["ideal_steps_per_s"]
        of_bare = f"{sps / bare:.1%}" if bare else "-"
        rss, pss = result["learner_rss_mib"], result["actors_pss_mib"]
        print(
            f"| {args.algo} | {mode} | {n} | {args.step_ms:g} ms | {ideal:,.0f} | {bare:,.0f} | "
            f"{sps:,.0f} | **{sps / ideal:.1%}** | {of_bare} | "
            f"{result['farm_startup_s']} | {rss[0]:.0f} -> {rss[1]:.0f} | "
            f"{pss[0]:.0f} -> {pss[1]:.0f} |"
        )
    for mode, result in results.items():
        print()
        print(
            f"{mode}: CPU over the window as the kernel accounts it (tick-sampled, so only "
            f"indicative): learner {result['learner_cores']:.2f} cores, actors "
            f"{result['actors_cores']:.2f} cores; machine idle {result['machine_idle']:.0%}"
        )
        low, mid, high = result["actor_sps"]
        print(f"steps/s per actor over the window: min {low:.1f}, median {mid:.1f}, max {high:.1f}")
        print("farm metrics at the end:", json.dumps(result.get("farm_metrics", {})))


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
    p.add_argument(
        "--impls",
        default="zmq",
        help=f"comma list of {', '.join(IMPLS)}; more than zmq alone: Ray mode (each run in "
        "a subprocess and a private network namespace, --rounds rounds)",
    )
    p.add_argument("--rounds", type=int, default=2, help="Ray mode: rounds, order alternating")
    p.add_argument("--run-timeout", type=float, default=1200.0, help="Ray mode: seconds per run")
    p.add_argument(
        "--no-netns", action="store_true", help="Ray mode: run Ray on the host's network"
    )
    p.add_argument(
        "--inference",
        default="actor",
        help="comma list of run.inference modes (actor, central, auto; central@MS: central with "
        "run.inference_wait_ms = MS), each measured in turn",
    )
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--from-json", metavar="FILE", help="Ray mode: re-print a saved run")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.from_json:
        print(compare_report(json.loads(Path(args.from_json).read_text())))
        return
    if args.worker:  # one run of a Ray-mode comparison, in its own subprocess
        out = Path(args.json)
        Path(out.parent / "netns").write_text(os.readlink("/proc/self/ns/net"))
        result = raw_ray_farm(args) if args.worker == "raw-ray" else harness_farm(args, args.worker)
        out.write_text(json.dumps(result, indent=1))
        return
    impls = [x.strip() for x in args.impls.split(",") if x.strip()]
    bad = [x for x in impls if x not in IMPLS]
    if bad:
        sys.exit(f"unknown implementation(s): {', '.join(bad)}")
    if impls != ["zmq"]:
        saved = compare(args, impls)
        text = compare_report(saved)
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1))
        return

    bare = 0.0
    if args.bare_seconds:
        bare = bare_reference(args.actors, args.step_ms, args.bare_seconds)
    load0 = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    for mode in [m.strip() for m in args.inference.split(",") if m.strip()]:
        result = results[mode] = harness_farm(args, inference=mode)
        result.update(
            bare_steps_per_s=round(bare, 1),
            fraction_of_bare=round(result["steps_per_s"] / bare, 4) if bare else None,
        )
    print_single(args, results, bare, load0)
    if args.json:
        saved = next(iter(results.values())) if len(results) == 1 else results
        Path(args.json).write_text(json.dumps(saved, indent=2))


if __name__ == "__main__":
    main()
