"""MyoSuite envs through harness against a raw MyoSuite loop: step cost, and a 2-actor farm.

Targets (issue 29, "Speed"): the harness env costs <= 1.05x a raw MyoSuite loop per step, on the
same env and the same actions; a 2-actor farm samples >= 90% of twice the raw single-process
rate. Everything is measured in ONE run, for each id of ``--envs`` (default Die Reorient P1 and
OslRunFixed), each number against a limit measured in the same run:

1. **raw** (the limit of part 1): ``env = gymnasium.make(id)`` (nothing of harness), reset with
   ``--seed``, then ``env.step(a)`` over a fixed pre-drawn action sequence (uniform in the action
   space's bounds, long enough for about ``--seconds`` of raw stepping), ``env.reset()`` on
   terminated/truncated. Reported: steps/s, resets included (a farm's rate includes them too).
2. **harness env**: the same id through harness's env plugin as a run builds it (the registry's
   ``EnvSpec`` for the id, ``make_env(id, num_envs=1, vector="sync")``: the MyoSuite family's
   lean sync vector env, SAME_STEP autoreset, episode metrics and MyoSuite's official scoring),
   reset with the same seed, stepped with the same actions (``(1, dim)`` views of the same
   array). Both start from the same state and take the same actions, so they run the identical
   trajectory: each measurement sums the rewards and counts the episodes, and the tool checks
   that every contender's sums equal raw's (the "same trajectory" column). A second, identical
   raw env runs as one more contender (an A/A control, ``--no-control`` drops it): its ratio to
   raw, ideally 1, is how small a difference this run resolves on this machine. ``--repeats``
   rounds; in a round every contender runs the whole sequence, the contenders taking turns of
   ``--chunk`` steps (A B C, B C A, C A B, ...: the order rotating every turn), so that a load
   burst of the shared machine hits all alike; each round's ratio is taken against that
   round's raw time. Reported: median steps/s, and the median (min-max) over rounds of the
   time per step relative to raw, in wall time and in this process's CPU time (CPU time does
   not count the moments other jobs held our core). ``--breakdown`` adds one more contender,
   the plugin's wrapped env alone (``harness_myo.plugin.make_one``: ``gymnasium.make`` without
   the passive checker, in the episode-metrics wrapper, no vector env): harness env vs it is
   what the vector env costs, it vs raw what the wrapper costs.
3. **2-actor farm** (``--farm-repeats`` rounds, the order rotating; ``--skip-farm`` drops it):
   ``r``: the raw loop alone in this process for ``--seconds``, cycling the same action
   sequence; ``2 processes``: two raw loops in two fresh processes at once for ``--seconds``
   (summed; what this machine's cores really give, the ceiling the target ignores); ``farm``:
   ``harness.runtime.train`` on the id with ``run.algo = "random"`` (uniform actions, no
   learning: the learner only receives), ``run.actors = 2``, ``run.num_envs = 2 x E`` for each
   ``E`` of ``--farm-envs`` (envs per actor: 1 and 8 by default; the packs ship 8), ZeroMQ
   embedded farm, no evaluation, checkpoints or trackers, one torch thread: the env steps the
   learner received per second over a ``--seconds`` window that opens ``--warmup`` s after both
   actors delivered a rollout (tools/bench_osim.py's probe); ``r_E`` (each ``E`` > 1): ``E``
   raw envs stepped in turn in this process, what one actor's ``E`` envs cost without harness
   (a process stepping several MuJoCo models makes fewer steps/s than one stepping one).
   Reported: the medians of the rates, farm / 2r (the target), farm / 2 r_E and farm / 2
   processes, each round's ratios taken within the round, and the cores the learner, the
   actors and the machine's other processes used over the farm window (read the last before
   trusting a run: the machine is shared).

4. **training, serial against a farm** (``--ppo-repeats`` rounds, 0 by default; only ids with
   a pack: :data:`PACKS`): the pack as shipped (PPO, its envs, reward and network), trained
   with ``run.actors = 0`` (one process: it steps its envs, then updates) and with
   ``run.actors = 2`` (a synchronous farm: the actors step their shares at once, then wait
   while the learner updates), no evaluation, checkpoints or trackers. Reported: the env steps
   the learner observed per second over a ``--seconds`` window opening ``--warmup`` s after
   the first rollout (the farm's: after both actors delivered), farm / serial, and the
   actors' idle share (``farm/actor_idle``: the time an actor waits for the learner). Until
   2026-12-04 a synchronous farm requested each actor's rollout only after the previous
   actor's had arrived, so its actors stepped one at a time; this part measures what that fix
   gave.

The recorded run (~13 min on 2 cores; run it on a quiet machine and read the others' cores):

    .venv/bin/python tools/bench_myo.py --breakdown --json bench_myo.json

Part 4 alone (~5 min on 2 cores for Die Reorient, 2 rounds of 45 s windows):

    .venv/bin/python tools/bench_myo.py --envs myoChallengeDieReorientP1-v0 --skip-steps \
        --skip-farm --ppo-repeats 2 --seconds 45 --warmup 10

A smoke run (~2 min; numbers only indicative), and other ids, parts 1-2 only:

    .venv/bin/python tools/bench_myo.py --seconds 2 --repeats 3 --farm-repeats 1 --warmup 2
    .venv/bin/python tools/bench_myo.py --envs myoChallengeRelocateP1-v0 --skip-farm
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_osim import Probe, with_others_load
from benchlib import cpus_and_model, fmt_load, start_together, together_rate

DEFAULT_ENVS = ("myoChallengeDieReorientP1-v0", "myoChallengeOslRunFixed-v0")
RAW = "raw gymnasium.make loop"
CONTROL = "raw loop, 2nd instance (A/A control)"
HARNESS = "harness env (registry, num_envs=1, sync)"
WRAPPED = "harness_myo make_one alone (no vector env)"
WARM_STEPS = 200
"""Untimed steps of every contender before the rounds: the first steps pay one-off costs
(gymnasium's passive checker inspects the first step and reset, MuJoCo's first-touch pages)."""


# -- the contenders of parts 1 and 2 ----------------------------------------------------------
def raw_env(env_id: str) -> Any:
    """``gymnasium.make(env_id)`` as anyone writes it (MyoSuite registers its ids on import);
    the passive checker's one-off warning at the first step (MyoSuite's infos share an object
    from step to step) is silenced."""
    import gymnasium as gym
    import myosuite  # type: ignore[import-untyped, unused-ignore]  # noqa: F401

    warnings.filterwarnings("ignore", message=".*share an object")
    return gym.make(env_id)


def harness_env(env_id: str) -> Any:
    """The id through harness's registry, as a run builds it: one env, sync vector env."""
    from harness.plugins import collect_registry, make_plugin_manager

    spec = collect_registry(make_plugin_manager()).env_for(env_id)
    options = spec.config_cls() if spec.config_cls is not None else None
    return spec.make_env(env_id, num_envs=1, seed=None, vector="sync", options=options)


def draw_actions(space: Any, n: int, seed: int) -> np.ndarray:
    """``n`` actions uniform in the Box's bounds, as the env's dtype (the same for everyone)."""
    rng = np.random.default_rng(seed)
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    return (low + rng.random((n, *space.shape)) * (high - low)).astype(space.dtype)


@dataclass
class Measurement:
    """Timed stepping: wall and CPU seconds, and what identifies the trajectory (the summed
    rewards, the episodes ended)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    reward_sum: float = 0.0
    episodes: int = 0

    def add(self, other: Measurement) -> None:
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s
        self.reward_sum += other.reward_sum
        self.episodes += other.episodes


def raw_chunk(env: Any, actions: np.ndarray) -> Measurement:
    """The raw loop over ``actions``, on from where it stands; its resets are timed with the
    steps (the harness env resets inside its step)."""
    total, episodes = 0.0, 0
    clock, cpu = time.perf_counter, time.process_time
    t, c = clock(), cpu()
    for a in actions:
        _, r, terminated, truncated, _ = env.step(a)
        total += r
        if terminated or truncated:
            env.reset()
            episodes += 1
    return Measurement(clock() - t, cpu() - c, float(total), episodes)


def vector_chunk(envs: Any, actions: np.ndarray) -> Measurement:
    """The harness vector env over ``actions`` (``(n, 1, dim)``: a ``(1, dim)`` view a step)."""
    total, episodes = 0.0, 0
    clock, cpu = time.perf_counter, time.process_time
    t, c = clock(), cpu()
    for a in actions:
        _, r, terminated, truncated, _ = envs.step(a)
        total += r[0]
        if terminated[0] or truncated[0]:
            episodes += 1
    return Measurement(clock() - t, cpu() - c, float(total), episodes)


@dataclass
class Contender:
    """Something stepped from the same state with the same actions: ``reset(seed)``, then
    ``chunk(actions)`` again and again (a vector env takes the ``(n, 1, dim)`` actions)."""

    name: str
    env: Any
    batched: bool
    results: list[Measurement] = field(default_factory=list)

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)  # a vector env resets env 0 with ``seed``, as the raw one

    def chunk(self, actions: np.ndarray) -> Measurement:
        return (vector_chunk if self.batched else raw_chunk)(self.env, actions)


def contenders(env_id: str, control: bool, breakdown: bool) -> list[Contender]:
    """raw first (the reference), then the A/A control, the plugin's wrapped env alone
    (``breakdown``: where the harness env's extra time goes, wrapper or vector env), then the
    harness env."""
    out = [Contender(RAW, raw_env(env_id), False)]
    if control:
        out.append(Contender(CONTROL, raw_env(env_id), False))
    if breakdown:
        from harness_myo.plugin import MyoConfig, make_one

        out.append(Contender(WRAPPED, make_one(env_id, MyoConfig()), False))
    out.append(Contender(HARNESS, harness_env(env_id), True))
    return out


def run_round(
    cons: Sequence[Contender], actions: np.ndarray, seed: int, chunk: int, turn0: int
) -> list[Measurement]:
    """Every contender through ``actions`` from ``reset(seed)``, taking turns of ``chunk``
    steps (0: the whole sequence), the order rotating every turn (from ``turn0``)."""
    batched, n, k = actions[:, None], len(actions), len(cons)
    chunk = chunk or n
    for con in cons:
        con.reset(seed)
    totals = [Measurement() for _ in cons]
    for turn, start in enumerate(range(0, n, chunk), turn0):
        for i in [(turn + j) % k for j in range(k)]:
            con = cons[i]
            totals[i].add(con.chunk((batched if con.batched else actions)[start : start + chunk]))
    return totals


def raw_steps_per_s(env: Any, actions: np.ndarray, seconds: float) -> float:
    """The raw loop cycling ``actions`` for ``seconds`` of wall time (resets included)."""
    return raw_many_steps_per_s([env], actions, seconds)


def raw_many_steps_per_s(envs: Sequence[Any], actions: np.ndarray, seconds: float) -> float:
    """Raw loops over ``envs`` in turn, one step each (as an actor's vector env steps its
    envs), cycling ``actions`` for ``seconds`` of wall time: env steps/s, resets included."""
    for i, env in enumerate(envs):
        env.reset(seed=i)
    n, steps = len(actions), 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(actions[steps % n])
            steps += 1
            if terminated or truncated:
                env.reset()
        if time.perf_counter() >= end:
            return steps / (time.perf_counter() - t0)


def measure_steps(env_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """Part 1 and 2 for one id (see the module docstring)."""
    cons = contenders(env_id, not args.no_control, args.breakdown)
    raw = cons[0].env
    space = raw.action_space
    probe = draw_actions(space, 5000, args.seed + 1)
    rate = raw_steps_per_s(raw, probe, min(1.0, args.seconds))  # sizes the sequence
    n = max(WARM_STEPS, int(rate * args.seconds))
    actions = draw_actions(space, n, args.seed)
    run_round(cons, actions[:WARM_STEPS], args.seed, 0, 0)  # warm-up, untimed
    for k in range(args.repeats):
        for con, m in zip(cons, run_round(cons, actions, args.seed, args.chunk, k), strict=True):
            con.results.append(m)
        line = ", ".join(f"{c.name}: {n / c.results[-1].wall_s:.0f}" for c in cons)
        print(f"  {env_id} round {k + 1}/{args.repeats}, steps/s: {line}", file=sys.stderr)
    base = cons[0].results
    out: dict[str, Any] = {"steps_per_measurement": n, "contenders": {}}
    for con in cons:
        ms = con.results
        out["contenders"][con.name] = {
            "steps_per_s": [n / m.wall_s for m in ms],
            "ratio": [m.wall_s / b.wall_s for m, b in zip(ms, base, strict=True)],
            "ratio_cpu": [m.cpu_s / b.cpu_s for m, b in zip(ms, base, strict=True)],
            "reward_sums": [m.reward_sum for m in ms],
            "episodes": [m.episodes for m in ms],
            "same_trajectory": all(
                (m.reward_sum, m.episodes) == (b.reward_sum, b.episodes)
                for m, b in zip(ms, base, strict=True)
            ),
        }
    for con in cons:
        con.env.close()
    return out


# -- part 3: the farm and its limits ------------------------------------------------------------
def _pair_worker(env_id: str, seed: int, seconds: float, go: Any, start: Any, out: Any) -> None:
    """One of the two raw processes: build and warm the env, then step from the common start."""
    env = raw_env(env_id)
    actions = draw_actions(env.action_space, 5000, seed)
    raw_steps_per_s(env, actions[:WARM_STEPS], 0.2)
    start_together(go, start, out)
    out.put(("rate", raw_steps_per_s(env, actions, seconds)))
    env.close()


def pair_rate(env_id: str, seconds: float, seed: int) -> float:
    """Summed steps/s of two raw loops in two fresh processes at the same time. Spawned, not
    forked: by the second round this process has run a farm (torch's thread pools, ZeroMQ)."""
    pairs = [(env_id, seed + 100 + i, seconds) for i in range(2)]
    return together_rate(_pair_worker, pairs, seconds, method="spawn")


def probed_run(
    pack: Path | None, overrides: list[str], args: argparse.Namespace, what: str
) -> Probe:
    """One ``harness.runtime.train`` of ``pack`` (None: no pack file) with ``overrides`` and
    the measuring probe (``--warmup``, ``--seconds``); no evaluation, checkpoints or trackers,
    its run directory removed after. Exits when the run ended before the window closed."""
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    pm = make_plugin_manager()
    probe = Probe(args.warmup, args.seconds)
    pm.register(probe, name="bench-myo-probe")
    registry = collect_registry(pm)
    out = tempfile.mkdtemp(prefix="bench_myo_")
    base = [
        f"run.seed={args.seed}",
        "run.eval_every=0",
        "run.eval_episodes=0",
        "run.checkpoint_every=0",
        "run.total_steps=1_000_000_000",
        f"run.max_seconds={args.seconds + args.warmup + 300}",
        "run.trackers=[]",
        "run.progress=false",
        f"run.out='{out}'",
    ]
    config = resolve(layer(pack, [], base + overrides, environ={}), registry)
    try:
        train(config, registry, pm)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if probe.t0 is None or probe.t_end is None:
        sys.exit(f"{what} ended before its measuring window closed")
    return probe


def farm(env_id: str, args: argparse.Namespace, envs: int) -> dict[str, float]:
    """One 2-actor farm run with the random policy, ``envs`` envs per actor (see the module
    docstring)."""
    overrides = [
        f"run.env='{env_id}'",
        "run.algo='random'",
        "run.actors=2",
        f"run.num_envs={2 * envs}",
        "backend.threads=1",
    ]
    probe = probed_run(None, overrides, args, f"{env_id}: the farm run")
    assert probe.t0 is not None and probe.t_end is not None
    window = probe.t_end - probe.t0
    idle = (probe.machine1[0] - probe.machine0[0]) / max(1, probe.machine1[1] - probe.machine0[1])
    learner = (probe.cpu1[0] - probe.cpu0[0]) / window
    actors = (probe.cpu1[1] - probe.cpu0[1]) / window
    cores = os.cpu_count() or 1
    return {
        "steps_per_s": (probe.step_end - probe.step0) / window,
        "window_s": window,
        "startup_s": probe.farm_up or 0.0,
        "learner_cores": learner,
        "actors_cores": actors,
        "others_cores": max(0.0, cores * (1 - idle) - learner - actors),
        "actor_idle": float(np.mean(probe.actor_idle)) if probe.actor_idle else float("nan"),
    }


def farm_round(
    env_id: str,
    env: Any,
    actions: np.ndarray,
    args: argparse.Namespace,
    k: int,
    many: Mapping[int, Sequence[Any]],
) -> dict[str, Any]:
    """Round ``k`` of part 3: r, the 2-process ceiling, the farm (once per ``--farm-envs``) and,
    for each ``E`` > 1 of them, ``r_E``: the raw loops over ``many[E]`` (``E`` envs) in turn in
    this process, in an order rotated by ``k``; their rates and the round's ratios
    (``farm_of_2r``, ``farm_of_pair``, ``farm_of_2rE``: dicts by envs per actor)."""
    row: dict[str, Any] = {}

    def single() -> None:
        row["r"], row["others_cores_r"] = with_others_load(
            functools.partial(raw_steps_per_s, env, actions, args.seconds)
        )

    def pair() -> None:
        if not args.no_pair:
            row["pair"] = pair_rate(env_id, args.seconds, args.seed + k)

    row["farm"], row["r_envs"] = {}, {}

    def farmed(envs: int) -> None:
        row["farm"][envs] = farm(env_id, args, envs)

    def single_many(envs: int) -> None:
        row["r_envs"][envs] = raw_many_steps_per_s(many[envs], actions, args.seconds)

    parts: list[Callable[[], None]] = [
        single,
        pair,
        *(functools.partial(farmed, e) for e in args.farm_envs),
        *(functools.partial(single_many, e) for e in many),
    ]
    for part in parts[k % len(parts) :] + parts[: k % len(parts)]:
        part()
    rates = {e: f["steps_per_s"] for e, f in row["farm"].items()}
    row["farm_of_2r"] = {e: f / (2 * row["r"]) for e, f in rates.items()}
    row["farm_of_pair"] = (
        {e: f / row["pair"] for e, f in rates.items()} if row.get("pair") else None
    )
    row["r_envs"][1] = row["r"]
    row["farm_of_2rE"] = {e: f / (2 * row["r_envs"][e]) for e, f in rates.items()}
    return row


def measure_farm(env_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--farm-repeats`` rounds of r, the 2-process ceiling and the farm, order rotating."""
    env = raw_env(env_id)
    actions = draw_actions(env.action_space, 5000, args.seed)
    raw_steps_per_s(env, actions[:WARM_STEPS], 0.2)
    many = {e: [raw_env(env_id) for _ in range(e)] for e in args.farm_envs if e > 1}
    for envs in many.values():
        raw_many_steps_per_s(envs, actions[:WARM_STEPS], 0.2)
    rounds: list[dict[str, Any]] = []
    for k in range(args.farm_repeats):
        row = farm_round(env_id, env, actions, args, k, many)
        rounds.append(row)
        farmed = ", ".join(
            f"{e} env(s) per actor {f['steps_per_s']:.0f}" for e, f in row["farm"].items()
        )
        print(
            f"  {env_id} farm round {k + 1}/{args.farm_repeats}: r {row['r']:.0f}, 2 processes "
            f"{row.get('pair', float('nan')):.0f}, farm {farmed} steps/s",
            file=sys.stderr,
        )
    env.close()
    for envs in many.values():
        for one in envs:
            one.close()
    return rounds


# -- part 4: training, serial against a farm ------------------------------------------------
PACKS = {
    "myoChallengeDieReorientP1-v0": "myochallenge_2022_die",
    "myoChallengeRelocateP1-v0": "myochallenge_2023_relocate",
    "myoChallengeOslRunFixed-v0": "myochallenge_2024_osl",
}
"""The pack that trains each id (part 4)."""


def train_rate(env_id: str, actors: int, args: argparse.Namespace) -> dict[str, float]:
    """One run of ``env_id``'s pack as shipped with ``run.actors = actors``: env steps/s over
    the probe's window, the cores used, the actors' idle share."""
    from harness.config import find_pack_file

    pack = find_pack_file(Path(__file__).resolve().parents[1] / "competitions" / PACKS[env_id])
    probe = probed_run(pack, [f"run.actors={actors}"], args, f"{env_id}: the training run")
    assert probe.t0 is not None and probe.t_end is not None
    window = probe.t_end - probe.t0
    return {
        "steps_per_s": (probe.step_end - probe.step0) / window,
        "learner_cores": (probe.cpu1[0] - probe.cpu0[0]) / window,
        "actors_cores": (probe.cpu1[1] - probe.cpu0[1]) / window,
        "actor_idle": float(np.mean(probe.actor_idle)) if probe.actor_idle else float("nan"),
    }


def measure_training(env_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--ppo-repeats`` rounds of the pack trained serially and on 2 actors, order rotating."""
    rounds: list[dict[str, Any]] = []
    for k in range(args.ppo_repeats):
        row: dict[str, Any] = {}
        for actors in (0, 2) if k % 2 == 0 else (2, 0):
            row["serial" if actors == 0 else "farm"] = train_rate(env_id, actors, args)
        row["farm_of_serial"] = row["farm"]["steps_per_s"] / row["serial"]["steps_per_s"]
        rounds.append(row)
        print(
            f"  {env_id} training round {k + 1}/{args.ppo_repeats}: serial "
            f"{row['serial']['steps_per_s']:.0f}, farm {row['farm']['steps_per_s']:.0f} steps/s",
            file=sys.stderr,
        )
    return rounds


# -- report -----------------------------------------------------------------------------------
def spread(xs: Sequence[float], spec: str) -> str:
    """``median (min-max)``."""
    return f"{statistics.median(xs):{spec}} ({min(xs):{spec}}-{max(xs):{spec}})"


def step_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| env | contender | steps/s, median | µs/step | x raw per step, median (min-max) | "
        "x raw in CPU time | same trajectory |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for env_id, res in results.items():
        for name, c in res["contenders"].items():
            sps = statistics.median(c["steps_per_s"])
            first = name == RAW
            ratio = "1" if first else f"**{spread(c['ratio'], '.3f')}x**"
            ratio_cpu = "1" if first else f"{spread(c['ratio_cpu'], '.3f')}x"
            same = "-" if first else ("yes" if c["same_trajectory"] else "**NO**")
            label = f"**{name}**" if name == HARNESS else name
            lines.append(
                f"| {env_id} | {label} | {sps:.0f} | {1e6 / sps:.0f} | {ratio} | {ratio_cpu} "
                f"| {same} |"
            )
    return lines


def farm_table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| env | raw r, 1 process | 2 r | 2 raw processes at once | envs per actor E | raw "
        "r_E, E envs in 1 process | farm, 2 actors | **farm / 2r** | farm / 2 r_E | farm / "
        "2 processes | learner cores | actors cores | others' cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for env_id, rounds in results.items():

        def med(get: Callable[[dict[str, Any]], float | None], rounds: Any = rounds) -> float:
            values = [v for v in map(get, rounds) if v is not None]
            return statistics.median(values) if values else float("nan")

        r = med(lambda x: x["r"])
        for e in rounds[0]["farm"]:

            def of(x: dict[str, Any], key: str, e: int = e) -> float | None:
                return x[key][e] if x.get(key) else None

            def cores(x: dict[str, Any], key: str, e: int = e) -> float:
                return float(x["farm"][e][key])

            lines.append(
                f"| {env_id} | {r:.0f} | {2 * r:.0f} | {med(lambda x: x.get('pair')):.0f} | {e} | "
                f"{med(lambda x: of(x, 'r_envs')):.0f} | "
                f"{med(lambda x: cores(x, 'steps_per_s')):.0f} | "
                f"**{med(lambda x: of(x, 'farm_of_2r')):.1%}** | "
                f"{med(lambda x: of(x, 'farm_of_2rE')):.1%} | "
                f"{med(lambda x: of(x, 'farm_of_pair')):.1%} | "
                f"{med(lambda x: cores(x, 'learner_cores')):.2f} | "
                f"{med(lambda x: cores(x, 'actors_cores')):.2f} | "
                f"{med(lambda x: cores(x, 'others_cores')):.2f} |"
            )
    return lines


def training_table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| env (its pack, as shipped) | serial (`--actors 0`) | farm, 2 actors | "
        "**farm / serial** | farm: actors idle | farm: learner cores | farm: actors cores |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for env_id, rounds in results.items():

        def med(get: Callable[[dict[str, Any]], float], rounds: Any = rounds) -> float:
            return statistics.median(map(get, rounds))

        lines.append(
            f"| {env_id} ({PACKS[env_id]}) | {med(lambda x: x['serial']['steps_per_s']):.0f} | "
            f"{med(lambda x: x['farm']['steps_per_s']):.0f} | "
            f"**{med(lambda x: x['farm_of_serial']):.2f}x** | "
            f"{med(lambda x: x['farm']['actor_idle']):.0%} | "
            f"{med(lambda x: x['farm']['learner_cores']):.2f} | "
            f"{med(lambda x: x['farm']['actors_cores']):.2f} |"
        )
    return lines


def versions() -> str:
    import importlib.metadata as md

    names = ("gymnasium", "myosuite", "mujoco", "numpy")
    return f"Python {platform.python_version()}, " + ", ".join(
        f"{n} {md.version(n)}" for n in names
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), help="MyoSuite ids")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    p.add_argument("--repeats", type=int, default=5, help="rounds of parts 1-2")
    p.add_argument(
        "--chunk",
        type=int,
        default=50,
        help="parts 1-2: steps a contender takes before the next one's turn (0: whole rounds)",
    )
    p.add_argument("--farm-repeats", type=int, default=3, help="rounds of part 3")
    p.add_argument(
        "--farm-envs",
        type=int,
        nargs="+",
        default=[1, 8],
        help="part 3: envs per farm actor, one farm per value each round (the packs ship 8)",
    )
    p.add_argument("--warmup", type=float, default=5.0, help="farm: seconds after it is up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-control", action="store_true", help="skip the A/A raw control")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="parts 1-2: also the plugin's wrapped env stepped without the vector env",
    )
    p.add_argument("--no-pair", action="store_true", help="skip the 2-process raw ceiling")
    p.add_argument("--skip-steps", action="store_true", help="skip parts 1-2 (step cost)")
    p.add_argument("--skip-farm", action="store_true", help="skip part 3 (the farm)")
    p.add_argument(
        "--ppo-repeats",
        type=int,
        default=0,
        help="rounds of part 4 (the pack trained serially and on a 2-actor farm; 0: skip)",
    )
    p.add_argument("--json", help="also write every measurement to this JSON file")
    args = p.parse_args(argv)
    unknown = [e for e in args.envs if args.ppo_repeats and e not in PACKS]
    if unknown:
        p.error(f"--ppo-repeats: no pack trains {', '.join(unknown)} (packs: {', '.join(PACKS)})")
    if args.repeats < 1 or args.farm_repeats < 1 or args.seconds <= 0:
        p.error("--repeats and --farm-repeats must be >= 1 and --seconds > 0")
    if min(args.farm_envs) < 1 or len(set(args.farm_envs)) < len(args.farm_envs):
        p.error("--farm-envs: distinct numbers of envs per actor, each >= 1")

    load0, t_start = os.getloadavg(), time.monotonic()
    steps: dict[str, dict[str, Any]] = {}
    farms: dict[str, list[dict[str, Any]]] = {}
    trainings: dict[str, list[dict[str, Any]]] = {}
    others: dict[str, float] = {}
    for env_id in args.envs:
        if not args.skip_steps:
            steps[env_id], others[env_id] = with_others_load(
                functools.partial(measure_steps, env_id, args)
            )
        if not args.skip_farm:
            farms[env_id] = measure_farm(env_id, args)
        if args.ppo_repeats:
            trainings[env_id] = measure_training(env_id, args)
    load1 = os.getloadavg()
    header = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": cpus_and_model(),
        "versions": versions(),
        "loadavg_start": load0,
        "loadavg_end": load1,
        "total_s": time.monotonic() - t_start,
        "command": "tools/bench_myo.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    print(
        f"bench_myo {header['date']}: {header['machine']}, {header['versions']}; load average "
        f"{fmt_load(load0)} at start, {fmt_load(load1)} at end; {header['total_s']:.0f} s"
    )
    print(f"command: .venv/bin/python {header['command']}".rstrip())
    if steps:
        print()
        print("\n".join(step_table(steps)))
        print()
        cores = ", ".join(f"{e}: {c:.2f}" for e, c in others.items())
        counts = ", ".join(f"{e}: {s['steps_per_measurement']}" for e, s in steps.items())
        print(
            f"({args.repeats} rounds, the order rotating; steps per measurement {counts}; other "
            f"processes kept busy, of {os.cpu_count()} cores: {cores})"
        )
    if farms:
        print()
        print("\n".join(farm_table(farms)))
        print()
        others_r = ", ".join(
            f"{e}: {statistics.median(x['others_cores_r'] for x in rounds):.2f}"
            for e, rounds in farms.items()
        )
        print(
            f"(env steps/s, medians of {args.farm_repeats} rounds, the order rotating; "
            f"{args.seconds:g} s windows, the farm's from {args.warmup:g} s after both actors "
            f"delivered; cores: CPU time over the farm window, tick-sampled; other processes "
            f"kept busy during the r windows: {others_r})"
        )
    if trainings:
        print()
        print("\n".join(training_table(trainings)))
        print()
        print(
            f"(env steps/s the learner observed, medians of {args.ppo_repeats} rounds, the "
            f"order alternating; {args.seconds:g} s windows from {args.warmup:g} s after the "
            f"first rollout; cores: CPU time over the farm's window)"
        )
    if args.json:
        data = {
            "header": header,
            "args": vars(args),
            "steps": steps,
            "farm": farms,
            "training": trainings,
        }
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()
