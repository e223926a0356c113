"""The OpenSim competition envs' speed against the physical limit: a raw OpenSim integrate loop.

Two measurements, each against a limit measured in the same run:

1. **Env step cost** (target: our env <= 1.1x raw). The limit is a raw loop written here
   directly on ``opensim`` (no harness code): the same ``.osim`` model, a
   ``PrescribedController`` with one ``Constant`` per muscle, ``initSystem``,
   ``initializeState``, ``equilibrateMuscles``, a ``Manager`` with the same integrator
   accuracy; per step: set each Constant, ``Manager.integrate(t)``, read the pelvis height
   (a fall below 0.6 m ends the episode). OpenSim's integrator is adaptive, so a step's cost
   depends on the trajectory: every variant runs the SAME pre-drawn excitation sequences
   (uniform in [0, 1]) from the same initial state, so all integrate the identical trajectory
   with the same episode boundaries (fall, or the step limit); the pelvis heights of every
   step are compared with the raw loop's (the largest difference is reported). Variants: the
   bare env (``ProstheticsEnv``, official and relative observation) and the wrapped env the
   packs build (``harness_osim.plugin.make_one`` with frame_skip 1, shaping official and
   round2; observation ``--observation``, default the pack's ``relative``). All envs run
   ``--round`` (default 2, the pack's; the round changes only the reward and the target) with
   a ``--time-limit`` of 300 steps. Each round draws its own excitations; the variants run
   them interleaved (``--chunk`` steps each in turn, the order rotating, so that the load of a
   shared machine hits all alike) and each round's ratio is taken against that round's raw
   loop; reported: medians over rounds with the min-max spread, per simulator step (the reset
   of an episode is reported apart), in wall time and in this process's CPU time, and where
   the env's time goes (a separate instrumented episode per variant). A second, identical raw
   loop runs as one more variant (an A/A control): its ratio to the first, ideally 1, is the
   resolution of the measurement on this machine (load, memory layout).
2. **Farm sampling** (target: >= 90% of 2x the single-process raw rate). ``r``: the raw loop
   alone in this process with fresh uniform [0, 1] random actions for ``--raw-seconds``
   (resets included, as the farm's rate includes them), measured before and after the farm
   and averaged. The farm: ``harness.runtime.train`` on ``competitions/prosthetics`` with
   ``algo = random`` (no learner work), 2 actors x 1 env, frame skip 1, shaping official, no
   curriculum, no evaluation; its delivered simulator steps/s (``run.step`` over a window
   that opens ``--warmup`` s after every actor delivered a rollout; frame skip 1, so agent
   steps are simulator steps). Ratio: farm / (2 r). The learner process and the farm's I/O
   share the cores with the 2 actors; the CPU each used over the window is reported, and so is
   a second limit: 2 raw loops in 2 forked processes at once (what 2 cores actually give).

    .venv/bin/python tools/bench_osim.py                 # ~4-5 min
    .venv/bin/python tools/bench_osim.py --quick         # ~2 min: 50-step episodes, short windows
    .venv/bin/python tools/bench_osim.py --l2m           # also L2M2019-v0 in part 1 (+~2 min)
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from harness import hookimpl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_farm import cpu_seconds, machine_cpu
from benchlib import start_together, together_rate

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
STEP_SIZE = 0.01
FALL_HEIGHT = 0.6
PROSTHETICS_MODEL = "gait14dof22musc_pros_20180507.osim"
L2M_MODEL = "gait14dof22musc_20170320.osim"
L2M_STANDING_Q = {
    **{index: 0.0 for index in (0, 1, 2, 3, 5, 6, 7, 9, 10, 13, 14, 15, 16)},
    4: 0.94,
}
"""osim-rl's L2M2019 initial pose (standing still, pelvis at 0.94 m) as generalized coordinate
index -> value of this model (all speeds 0); the raw loop writes it itself."""


# -- the limit: a raw OpenSim loop ------------------------------------------------------------
class RawLoop:
    """OpenSim driven directly, the way the competition envs drive it, and nothing else per
    step: no state dictionary, observation, reward or checks. Written on ``opensim`` alone
    (only the model file's path comes from harness) because it is the limit measured against.
    """

    def __init__(
        self,
        path: Path,
        *,
        accuracy: float,
        time_limit: int,
        pose: Mapping[int, float] | None = None,
    ) -> None:
        import opensim as osim

        osim.Logger.setLevelString("error")
        self.osim = osim
        self.accuracy = accuracy
        self.time_limit = time_limit
        self.pose = dict(pose or {})
        self.model = osim.Model(str(path))
        muscles = self.model.getMuscles()
        self.muscle_names = [muscles.get(j).getName() for j in range(muscles.getSize())]
        brain = osim.PrescribedController()
        for j, name in enumerate(self.muscle_names):
            brain.addActuator(muscles.get(j))
            brain.prescribeControlForActuator(name, osim.Constant(0.0))  # OpenSim 4.6: by name
        self.model.addController(brain)
        self.model.initSystem()
        functions = brain.get_ControlFunctions()
        self.controls = [
            osim.Constant.safeDownCast(functions.get(j)) for j in range(functions.getSize())
        ]
        self.pelvis = self.model.getBodySet().get("pelvis")
        self.manager: Any = None
        self.k = 0

    @property
    def n_muscles(self) -> int:
        return len(self.controls)

    def reset(self) -> None:
        """Controls at 0 (they belong to the model, not the state), the default state (with the
        pose written in, if any), muscles equilibrated, a new integrator at time 0."""
        for control in self.controls:
            control.setValue(0.0)
        state = self.model.initializeState()
        if self.pose:
            q = state.getQ()
            for index, value in self.pose.items():
                q.set(index, value)
            state.setQ(q)
            state.setU(self.osim.Vector(state.getNU(), 0.0))
        self.model.equilibrateMuscles(state)
        state.setTime(0.0)
        self.manager = self.osim.Manager(self.model)
        self.manager.setIntegratorAccuracy(self.accuracy)
        self.manager.initialize(state)
        self.k = 0

    def step(self, excitation: np.ndarray | Sequence[float]) -> tuple[float, bool]:
        """One 0.01 s step with these excitations (model muscle order); (pelvis height, done):
        done on a fall or at the step limit."""
        for control, value in zip(self.controls, excitation, strict=True):
            control.setValue(float(value))
        self.k += 1
        state = self.manager.integrate(STEP_SIZE * self.k)
        self.model.realizePosition(state)  # (a no-op: the integrator realized it further)
        height = float(self.pelvis.getTransformInGround(state).p()[1])
        return height, height < FALL_HEIGHT or self.k >= self.time_limit


# -- the envs measured ------------------------------------------------------------------------
@dataclass
class Variant:
    """Something that runs an episode from pre-drawn excitations: the raw loop or an env.
    ``perm`` maps model muscle order to the env's action order (``action = exc[perm]``)."""

    name: str
    reset: Callable[[], None]
    step: Callable[[np.ndarray], bool]
    height: Callable[[], float]
    env: Any = None
    perm: np.ndarray | None = None


@dataclass
class Episode:
    steps: int
    step_s: float
    reset_s: float
    heights: list[float]
    cpu_s: float = 0.0
    """This process's CPU time in the steps: unlike wall time, not counting the moments the
    shared machine's other jobs held our core (but still slowed by them sharing caches)."""


def run_episodes(variants: Sequence[Variant], actions: np.ndarray, chunk: int) -> list[Episode]:
    """One episode of every variant on the same excitations (model muscle order), interleaved:
    all are reset, then each in turn steps ``chunk`` steps (0: its whole episode), the order
    rotating each turn, until every one is done. A load burst of the shared machine then hits
    all variants alike. Resets and steps are timed apart; heights are read outside the timer.
    """
    clock, cpu = time.perf_counter, time.process_time
    n = len(variants)
    rows = [actions if v.perm is None else actions[:, v.perm] for v in variants]
    episodes = []
    for v in variants:
        t = clock()
        v.reset()
        episodes.append(Episode(0, 0.0, clock() - t, []))
    done = [False] * n
    chunk = chunk or len(actions)
    turn = 0
    while not all(done):
        for i in [(turn + j) % n for j in range(n)]:
            v, ep = variants[i], episodes[i]
            for a in rows[i][ep.steps : ep.steps + chunk]:
                t, c = clock(), cpu()
                finished = v.step(a)
                ep.step_s += clock() - t
                ep.cpu_s += cpu() - c
                ep.heights.append(v.height())
                ep.steps += 1
                if finished:
                    break
            done[i] = finished or ep.steps >= len(actions)
        turn += 1
    return episodes


def step_through(variant: Variant, actions: np.ndarray) -> tuple[float, list[float]]:
    """Step a freshly reset variant until done: (seconds in the step calls, pelvis heights)."""
    clock = time.perf_counter
    step_s, heights = 0.0, []
    if variant.perm is not None:
        actions = actions[:, variant.perm]
    for a in actions:
        t = clock()
        done = variant.step(a)
        step_s += clock() - t
        heights.append(variant.height())
        if done:
            break
    return step_s, heights


def raw_variant(raw: RawLoop, name: str = "raw OpenSim loop") -> Variant:
    last = [0.0]

    def step(a: np.ndarray) -> bool:
        last[0], done = raw.step(a)
        return done

    return Variant(name, raw.reset, step, lambda: last[0])


CONTROL = "raw OpenSim loop, 2nd instance (A/A control)"


def control_variant(path: Path, args: argparse.Namespace, **kw: Any) -> list[Variant]:
    """A second, identical raw loop measured like an env (``--no-control``: none): its ratio to
    the first shows what the measurement itself can't tell apart (load, memory layout)."""
    if args.no_control:
        return []
    raw = RawLoop(path, accuracy=args.accuracy, time_limit=args.time_limit, **kw)
    return [raw_variant(raw, CONTROL)]


def env_variant(name: str, env: Any, seed: int, perm: np.ndarray | None = None) -> Variant:
    """A gymnasium env (bare or wrapped) as a :class:`Variant`."""
    base = env.unwrapped

    def reset() -> None:
        env.reset(seed=seed)

    def step(a: np.ndarray) -> bool:
        _, _, terminated, truncated, _ = env.step(a)
        return bool(terminated or truncated)

    def height() -> float:
        return float(base.state_desc()["body_pos"]["pelvis"][1])

    return Variant(name, reset, step, height, env=env, perm=perm)


@dataclass
class Family:
    """One competition: its raw loop and its env variants."""

    env_id: str
    raw: RawLoop
    variants: list[Variant]


def env_variants(
    args: argparse.Namespace,
    env_cls: Any,
    config_cls: Any,
    env_id: str,
    rules: dict[str, Any],
    shaping: str,
    perm: np.ndarray | None = None,
) -> list[Any]:
    """The bare env (official and relative observations) and the packs' wrapped env (shaping
    official and ``shaping``) of one competition, as benchmark variants."""
    from harness_osim.plugin import make_one

    common = {"time_limit": args.time_limit, "accuracy": args.accuracy, **rules}
    out = []
    for obs in ("official", "relative"):
        env = env_cls(observation=obs, **common)
        out.append(env_variant(f"bare env, {obs} obs", env, args.seed, perm))
    for name in ("official", shaping):
        options = config_cls(observation=args.observation, frame_skip=1, shaping=name, **common)
        label = f"wrapped (make_one), {args.observation} obs, shaping {name}"
        out.append(env_variant(label, make_one(env_id, options), args.seed, perm))
    return out


def prosthetics_family(args: argparse.Namespace) -> Family:
    from harness_osim.plugin import ProstheticsConfig
    from harness_osim.prosthetics import ProstheticsEnv
    from harness_osim.sim import model_path

    path = model_path(PROSTHETICS_MODEL)
    raw = RawLoop(path, accuracy=args.accuracy, time_limit=args.time_limit)
    variants = [raw_variant(raw), *control_variant(path, args)]
    rules = {"round": args.round}
    variants += env_variants(
        args, ProstheticsEnv, ProstheticsConfig, "Prosthetics-v0", rules, "round2"
    )
    return Family("Prosthetics-v0", raw, variants)


def l2m_family(args: argparse.Namespace) -> Family:
    from harness_osim.l2m import ACTION_MUSCLES, L2M2019Env
    from harness_osim.plugin import L2MConfig
    from harness_osim.sim import model_path

    path = model_path(L2M_MODEL)
    raw = RawLoop(path, accuracy=args.accuracy, time_limit=args.time_limit, pose=L2M_STANDING_Q)
    # the env's action i excites muscle ACTION_MUSCLES[i]; the raw loop takes model order
    perm = np.array([raw.muscle_names.index(m) for m in ACTION_MUSCLES])
    variants = [raw_variant(raw), *control_variant(path, args, pose=L2M_STANDING_Q)]
    rules = {"difficulty": args.difficulty}
    variants += env_variants(
        args, L2M2019Env, L2MConfig, "L2M2019-v0", rules, "velocity_effort", perm
    )
    return Family("L2M2019-v0", raw, variants)


# -- part 1: step cost --------------------------------------------------------------------------
@dataclass
class StepStats:
    """Per variant, one entry per round: steps, step seconds, reset seconds per episode."""

    steps: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    ratio_cpu: list[float] = field(default_factory=list)
    reset_ms: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    max_height_diff: float = 0.0
    boundary_mismatch: int = 0

    def ms(self) -> list[float]:
        return [1000 * s / n for s, n in zip(self.step_s, self.steps, strict=True)]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return float(np.median(values)), float(min(values)), float(max(values))


def measure_steps(family: Family, args: argparse.Namespace) -> dict[str, StepStats]:
    """Rounds: round ``k`` draws its own excitation sequences (seed + k), which every variant
    runs, interleaved with the others (see :func:`run_episodes`); each round's ratio is
    against the raw loop's time in that round."""
    stats = {v.name: StepStats() for v in family.variants}
    n = family.raw.n_muscles
    for k in range(args.rounds):
        rng = np.random.default_rng([args.seed, k])
        episodes = [rng.uniform(0.0, 1.0, (args.time_limit, n)) for _ in range(args.episodes)]
        results: dict[str, list[Episode]] = {v.name: [] for v in family.variants}
        for acts in episodes:
            eps = run_episodes(family.variants, acts, args.chunk)
            for v, ep in zip(family.variants, eps, strict=True):
                results[v.name].append(ep)
        raw_eps = results[family.variants[0].name]
        raw_steps = sum(e.steps for e in raw_eps)
        raw_s = sum(e.step_s for e in raw_eps) / raw_steps
        raw_cpu = sum(e.cpu_s for e in raw_eps) / raw_steps
        for variant in family.variants:
            eps, st = results[variant.name], stats[variant.name]
            steps = sum(e.steps for e in eps)
            st.steps.append(steps)
            st.step_s.append(sum(e.step_s for e in eps))
            st.reset_ms.append(1000 * float(np.mean([e.reset_s for e in eps])))
            st.cpu_s.append(sum(e.cpu_s for e in eps))
            st.ratio.append(st.step_s[-1] / steps / raw_s)
            st.ratio_cpu.append(st.cpu_s[-1] / steps / raw_cpu)
            for e, r in zip(eps, raw_eps, strict=True):
                if e.steps != r.steps:
                    st.boundary_mismatch += 1
                m = min(e.steps, r.steps)
                diff = np.max(np.abs(np.subtract(e.heights[:m], r.heights[:m])), initial=0.0)
                st.max_height_diff = max(st.max_height_diff, float(diff))
        line = ", ".join(f"{v.name}: {stats[v.name].ms()[-1]:.2f}" for v in family.variants)
        steps = stats[family.variants[0].name].steps[-1]
        print(
            f"  {family.env_id} round {k + 1}/{args.rounds} ({steps} steps each), ms/step: {line}",
            file=sys.stderr,
            flush=True,
        )
    return stats


# -- where the env's time goes ----------------------------------------------------------------
class Clock:
    """Accumulates wall time per named section of an instrumented env."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.totals.setdefault(name, 0.0)

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.totals[name] += time.perf_counter() - t

        return wrapper


class _TimedManager:
    """Stands in for the sim's ``Manager`` during the profile: times ``integrate``."""

    def __init__(self, manager: Any, clock: Clock) -> None:
        self._integrate = clock.timed("OpenSim integrate", manager.integrate)
        self.manager = manager

    def integrate(self, t: float) -> Any:
        return self._integrate(t)


def instrument(variant: Variant, clock: Clock) -> None:
    """Wrap the env's parts (on this instance only) in timers: the simulator's integrate (and
    OpenSim's inside it), the realization of accelerations, the state dictionary, the
    observation, the simulator's activations (round-2 reward), the target field (L2M), the
    shaping. Whatever the step spends elsewhere is "other"."""
    env = variant.env
    base = env.unwrapped
    sim = base.sim
    reset = sim.reset

    def timed_reset(*a: Any, **kw: Any) -> None:
        reset(*a, **kw)
        sim.manager = _TimedManager(sim.manager, clock)

    sim.reset = timed_reset
    sim.integrate = clock.timed("sim.integrate (all)", sim.integrate)
    realize = clock.timed("realizeAcceleration", sim.model.realizeAcceleration)
    state_desc = clock.timed("state dictionary", sim.state_desc)

    def timed_state_desc() -> Any:
        realize(sim.state)  # first: the realization inside state_desc is then free
        return state_desc()

    sim.state_desc = timed_state_desc
    for attr, label in (("_observe", "observation"), ("_update_field", "target field")):
        if hasattr(base, attr):
            setattr(base, attr, clock.timed(label, getattr(base, attr)))
    if hasattr(sim, "activations"):
        sim.activations = clock.timed("activations", sim.activations)
    if env is not base:  # (a shaping reading the env's activations counts them as shaping)
        env.shaping = _TimedShaping(env.shaping, clock)


class _TimedShaping:
    def __init__(self, shaping: Any, clock: Clock) -> None:
        self.shaping = shaping
        self._call = clock.timed("shaping", shaping.__call__)

    def reset(self, env: Any) -> None:
        self.shaping.reset(env)

    def __call__(self, env: Any, official: float, action: np.ndarray) -> float:
        result: float = self._call(env, official, action)
        return result


PROFILE_COLUMNS = (
    "step",
    "OpenSim integrate",
    "integrate: finite check",
    "realizeAcceleration",
    "state dictionary",
    "observation",
    "activations",
    "target field",
    "shaping",
    "other",
)


def profile(family: Family, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """ms per step of each part, from one instrumented episode per env variant (round 0's
    excitations; the envs are instrumented for good afterwards, so this runs last)."""
    rng = np.random.default_rng([args.seed, 0])
    actions = rng.uniform(0.0, 1.0, (args.time_limit, family.raw.n_muscles))
    out: dict[str, dict[str, float]] = {}
    family.variants[0].reset()
    raw_s, raw_heights = step_through(family.variants[0], actions)
    out[family.variants[0].name] = {"step": 1000 * raw_s / len(raw_heights)}
    for variant in family.variants[1:]:
        if variant.env is None:
            continue
        clock = Clock()
        instrument(variant, clock)
        variant.reset()
        for name in clock.totals:  # the steps only
            clock.totals[name] = 0.0
        step_s, heights = step_through(variant, actions)
        t = {k: v * 1000 / len(heights) for k, v in clock.totals.items()}
        row = {
            "step": 1000 * step_s / len(heights),
            "OpenSim integrate": t["OpenSim integrate"],
            "integrate: finite check": t["sim.integrate (all)"] - t["OpenSim integrate"],
            "realizeAcceleration": t["realizeAcceleration"],
            "state dictionary": t["state dictionary"],
            "observation": t["observation"],
            "activations": t.get("activations", 0.0),
            "target field": t.get("target field", 0.0),
            "shaping": t.get("shaping", 0.0),
        }
        parts = sum(v for k, v in row.items() if k != "step")
        row["other"] = row["step"] - parts
        out[variant.name] = row
    return out


# -- part 2: farm sampling --------------------------------------------------------------------
def raw_rate(raw: RawLoop, seconds: float, seed: int) -> tuple[float, int]:
    """Simulator steps/s of ``raw`` with uniform [0, 1] random actions over ``seconds`` of
    wall time, resets included (as in a farm); (rate, episodes)."""
    rng = np.random.default_rng(seed)
    n = raw.n_muscles
    steps = episodes = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        raw.reset()
        episodes += 1
        done = False
        while not done:
            _, done = raw.step(rng.uniform(0.0, 1.0, n))
            steps += 1
            if time.perf_counter() >= end:
                return steps / (time.perf_counter() - t0), episodes


def _pair_worker(
    path: str, args: tuple[float, int, int, float], go: Any, start: Any, out: Any
) -> None:
    accuracy, time_limit, seed, seconds = args
    raw = RawLoop(Path(path), accuracy=accuracy, time_limit=time_limit)
    raw.reset()
    start_together(go, start, out)
    out.put(("rate", raw_rate(raw, seconds, seed)[0]))


def pair_rate(path: Path, args: argparse.Namespace, time_limit: int) -> float:
    """Summed steps/s of 2 raw loops in 2 forked processes at the same time (what 2 cores give
    this load with nothing else of ours running)."""
    pairs = [
        (str(path), (args.accuracy, time_limit, args.seed + 100 + i, args.raw_seconds))
        for i in range(2)
    ]
    return together_rate(_pair_worker, pairs, args.raw_seconds, method="fork")


def with_others_load(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the CPU cores that processes other than this one kept busy meanwhile (the
    shared machine's other jobs, when this process runs alone; tick-sampled)."""
    import psutil

    me = psutil.Process()
    m0, c0, t0 = machine_cpu(), me.cpu_times(), time.monotonic()
    value = fn()
    m1, c1, t1 = machine_cpu(), me.cpu_times(), time.monotonic()
    busy = (os.cpu_count() or 1) * (1 - (m1[0] - m0[0]) / max(1, m1[1] - m0[1]))
    own = (c1.user + c1.system - c0.user - c0.system) / max(t1 - t0, 1e-9)
    return value, max(0.0, busy - own)


class Probe:
    """A plugin: the window opens ``warmup`` s after every actor delivered a rollout and
    closes ``window`` s later (then it asks the run to stop); CPU use is sampled at both ends."""

    def __init__(self, warmup: float, window: float) -> None:
        self.warmup, self.window = warmup, window
        self.started = time.monotonic()
        self.farm_up: float | None = None
        self.warm_until = 0.0
        self.t0: float | None = None
        self.t_end: float | None = None
        self.step0 = self.step_end = 0
        self.pids: list[int] = []
        self.cpu0 = self.cpu1 = (0.0, 0.0)
        self.machine0 = self.machine1 = (0, 1)
        self.last: dict[str, float] = {}
        self.actor_idle: list[float] = []

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        now = time.monotonic()
        self.last = {k: v for k, v in metrics.items() if k.startswith("farm/")}
        if self.farm_up is None:
            slots = getattr(run.collector, "slots", [])  # (none: a serial run)
            if all(slot.received_steps for slot in slots):
                self.farm_up = now - self.started
                self.warm_until = now + self.warmup
                self.pids = [slot.proxy.pid() for slot in slots]
            return
        if self.t0 is None and now >= self.warm_until:
            self.t0, self.step0 = now, run.step
            self.cpu0, self.machine0 = cpu_seconds(self.pids), machine_cpu()
        elif self.t0 is not None and self.t_end is None:
            if "farm/actor_idle" in metrics:
                self.actor_idle.append(float(metrics["farm/actor_idle"]))
            if now < self.t0 + self.window:
                return
            self.t_end, self.step_end = now, run.step
            self.cpu1, self.machine1 = cpu_seconds(self.pids), machine_cpu()
            run.stop_requested = True


def farm(args: argparse.Namespace) -> dict[str, Any]:
    """The real actor farm on the prosthetics pack (see the module docstring)."""
    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import train

    pm = make_plugin_manager()
    probe = Probe(args.warmup, args.farm_seconds)
    pm.register(probe, name="bench-osim-probe")
    registry = collect_registry(pm)
    out = tempfile.mkdtemp(prefix="bench_osim_")
    overrides = [
        "run.algo='random'",
        "run.actors=2",
        "run.num_envs=2",
        "env.frame_skip=1",
        "env.shaping='official'",
        "env.curriculum=[]",
        "env.step_deadline=0",
        "run.eval_every=0",
        "run.eval_episodes=0",
        "run.checkpoint_every=0",
        "run.total_steps=1_000_000_000",
        f"run.max_seconds={args.farm_seconds + args.warmup + 300}",
        "run.progress=false",
        "run.trackers=['csv']",
        f"run.out='{out}'",
    ]
    pack = find_pack_file(ROOT / "competitions" / "prosthetics")
    config = resolve(layer(pack, [], overrides, environ={}), registry)
    try:
        result = train(config, registry, pm)
        rows = _read_metrics(Path(result.run_dir) / "metrics.csv")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if probe.t0 is None or probe.t_end is None:
        sys.exit("the farm run ended before its measuring window closed")
    window = probe.t_end - probe.t0
    in_window = [r for r in rows if probe.step0 < r["step"] <= probe.step_end and "perf/SPS" in r]
    idle = (probe.machine1[0] - probe.machine0[0]) / max(1, probe.machine1[1] - probe.machine0[1])
    learner = (probe.cpu1[0] - probe.cpu0[0]) / window
    actors = (probe.cpu1[1] - probe.cpu0[1]) / window
    cores = os.cpu_count() or 1
    return {
        "config": {"round": config.env.round, "observation": config.env.observation},
        "farm_startup_s": round(probe.farm_up or 0.0, 1),
        "window_s": round(window, 1),
        "steps_in_window": probe.step_end - probe.step0,
        "steps_per_s": (probe.step_end - probe.step0) / window,
        "perf_sps_median_in_window": (
            float(np.median([r["perf/SPS"] for r in in_window])) if in_window else None
        ),
        "farm_received_steps_end": probe.last.get("farm/received_steps"),
        "actor_idle_mean": float(np.mean(probe.actor_idle)) if probe.actor_idle else None,
        "farm_metrics_end": probe.last,
        "learner_cores": learner,
        "actors_cores": actors,
        "machine_idle": idle,
        "others_cores": max(0.0, cores * (1 - idle) - learner - actors),
    }


def _read_metrics(path: Path) -> list[dict[str, float]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return [
            {k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(fh)
        ]


# -- report -----------------------------------------------------------------------------------
def step_table(family: Family, stats: Mapping[str, StepStats]) -> list[str]:
    lines = [
        f"| {family.env_id} | sim steps/round | ms per sim step, median (min-max) | x raw, median "
        "(min-max) | x raw in CPU time, median (min-max) | reset ms | max pelvis-height diff "
        "vs raw | episode ends differ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in family.variants:
        st = stats[v.name]
        ms, lo, hi = spread(st.ms())
        first = v is family.variants[0]
        ratio, ratio_cpu, diff, ends = "1", "1", "-", "-"
        if not first:
            r, rlo, rhi = spread(st.ratio)
            ratio = f"**{r:.3f}x** ({rlo:.3f}-{rhi:.3f})"
            r, rlo, rhi = spread(st.ratio_cpu)
            ratio_cpu = f"{r:.3f}x ({rlo:.3f}-{rhi:.3f})"
            diff, ends = f"{st.max_height_diff:.1e}", str(st.boundary_mismatch)
        lines.append(
            f"| {v.name} | {int(np.median(st.steps))} | {ms:.2f} ({lo:.2f}-{hi:.2f}) | {ratio} | "
            f"{ratio_cpu} | {np.median(st.reset_ms):.1f} | {diff} | {ends} |"
        )
    return lines


def profile_table(rows: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = [
        "| variant | " + " | ".join(PROFILE_COLUMNS) + " |",
        "|---|" + "---:|" * len(PROFILE_COLUMNS),
    ]
    for name, row in rows.items():
        cells = [f"{row[c]:.2f}" if c in row else "-" for c in PROFILE_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="50-step episodes, short windows (~2 min)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of part 1")
    p.add_argument("--episodes", type=int, default=1, help="episodes per variant per round")
    p.add_argument(
        "--chunk",
        type=int,
        default=10,
        help="steps each variant runs before the next one's turn (0: whole episodes)",
    )
    p.add_argument("--time-limit", type=int, default=300, help="step limit of an episode")
    p.add_argument("--round", type=int, default=2, help="Prosthetics round of the envs")
    p.add_argument("--difficulty", type=int, default=3, help="L2M difficulty (with --l2m)")
    p.add_argument("--observation", default="relative", help="obs of the wrapped envs")
    p.add_argument("--accuracy", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--l2m", action="store_true", help="also L2M2019-v0 in part 1")
    p.add_argument("--raw-seconds", type=float, default=15.0, help="each raw-rate window")
    p.add_argument("--farm-seconds", type=float, default=60.0, help="farm measuring window")
    p.add_argument("--warmup", type=float, default=5.0, help="farm: seconds after it is up")
    p.add_argument("--no-pair", action="store_true", help="skip the 2-process raw reference")
    p.add_argument("--no-control", action="store_true", help="skip the A/A raw control")
    p.add_argument("--skip-steps", action="store_true", help="skip part 1 (env step cost)")
    p.add_argument("--skip-farm", action="store_true", help="skip part 2 (farm sampling)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.time_limit = min(args.time_limit, 50)
        args.raw_seconds = min(args.raw_seconds, 8.0)
        args.farm_seconds = min(args.farm_seconds, 15.0)
        args.warmup = min(args.warmup, 3.0)

    load0 = os.getloadavg()
    t_start = time.monotonic()
    result: dict[str, Any] = {"args": vars(args), "load_start": load0}
    lines: list[str] = []

    families: list[Family] = []
    if not args.skip_steps:
        families.append(prosthetics_family(args))
        if args.l2m:
            try:
                families.append(l2m_family(args))
            except ImportError as exc:
                print(f"--l2m: harness_osim.l2m does not import ({exc}); skipped", file=sys.stderr)
    for family in families:
        stats, others = with_others_load(functools.partial(measure_steps, family, args))
        prof = profile(family, args)
        result[family.env_id] = {
            "steps": {
                name: {
                    "ms_per_step": st.ms(),
                    "ratio": st.ratio,
                    "cpu_ms_per_step": [
                        1000 * c / n for c, n in zip(st.cpu_s, st.steps, strict=True)
                    ],
                    "ratio_cpu": st.ratio_cpu,
                    "steps": st.steps,
                    "reset_ms": st.reset_ms,
                    "max_height_diff": st.max_height_diff,
                    "boundary_mismatch": st.boundary_mismatch,
                }
                for name, st in stats.items()
            },
            "profile_ms": prof,
            "others_cores": others,
        }
        lines += [
            *step_table(family, stats),
            "",
            f"(other processes kept {others:.2f} of the {os.cpu_count()} cores busy during these "
            f"rounds, on average)",
            "",
            *profile_table(prof),
            "",
        ]

    if not args.skip_farm:
        from harness_osim.sim import model_path

        path = model_path(PROSTHETICS_MODEL)
        limit = 1000 if args.round == 2 else 300  # the pack's round-2 episodes (falls end them)
        raw = RawLoop(path, accuracy=args.accuracy, time_limit=limit)
        print("  raw rate (before the farm)", file=sys.stderr, flush=True)
        (r_before, eps_before), others_before = with_others_load(
            lambda: raw_rate(raw, args.raw_seconds, args.seed + 1)
        )
        pair = 0.0 if args.no_pair else pair_rate(path, args, limit)
        print("  farm", file=sys.stderr, flush=True)
        f = farm(args)
        print("  raw rate (after the farm)", file=sys.stderr, flush=True)
        (r_after, eps_after), others_after = with_others_load(
            lambda: raw_rate(raw, args.raw_seconds, args.seed + 2)
        )
        r = (r_before + r_after) / 2
        f.update(
            raw_rate_before=r_before,
            raw_rate_after=r_after,
            raw_rate=r,
            raw_episodes=eps_before + eps_after,
            others_cores_raw=(others_before, others_after),
            pair_rate=pair or None,
            fraction_of_2r=f["steps_per_s"] / (2 * r),
            fraction_of_pair=f["steps_per_s"] / pair if pair else None,
        )
        result["farm"] = f
        pair_cell = f"{pair:.1f}" if pair else "-"
        of_pair = f"{f['steps_per_s'] / pair:.1%}" if pair else "-"
        lines += [
            "| raw loop r, 1 process (before, after) | 2 r | 2 raw processes at once | farm "
            "delivered | farm / 2r | farm / 2 processes | learner cores | actors cores | "
            "others' cores | machine idle |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {r:.1f} ({r_before:.1f}, {r_after:.1f}) | {2 * r:.1f} | {pair_cell} | "
            f"{f['steps_per_s']:.1f} | **{f['fraction_of_2r']:.1%}** | {of_pair} | "
            f"{f['learner_cores']:.2f} | {f['actors_cores']:.2f} | {f['others_cores']:.2f} | "
            f"{f['machine_idle']:.0%} |",
            "",
            f"(sim steps/s; farm window {f['window_s']} s, {f['steps_in_window']} steps, opened "
            f"{args.warmup:g} s after the farm was up ({f['farm_startup_s']} s); perf/SPS median "
            f"in the window {f['perf_sps_median_in_window'] or float('nan'):.1f}; the actors "
            f"waited {f['actor_idle_mean'] or 0.0:.1%} of their time for requests (farm/"
            f"actor_idle); learner, actors and others' cores: CPU time over the window, "
            f"tick-sampled; other processes kept {others_before:.2f} and {others_after:.2f} "
            f"cores busy during the r windows ({args.raw_seconds:g} s each; the 2-process window "
            f"as long))",
            "",
        ]

    load1 = os.getloadavg()
    result["load_end"] = load1
    result["total_s"] = time.monotonic() - t_start
    print(
        f"bench_osim {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}; "
        f"load average {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} at start, "
        f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} at end; {result['total_s']:.0f} s"
    )
    print(
        f"command: .venv/bin/python tools/bench_osim.py {' '.join(argv or sys.argv[1:])}".rstrip()
    )
    print()
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
