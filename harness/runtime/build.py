"""Building a run: the config's actor count made concrete, the checks that refuse a run before
anything is made (algorithm and env, backend, checkpoint, actor capacity), envs, agents,
trackers, the run directory, and checkpoint loading for resume, ``run.init_from`` and
``harness eval``."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness import curriculum
from harness.api import Agent, EnvInfo
from harness.checkpoint import latest_checkpoint, read_meta
from harness.config import Config, RunConfig, write_resolved
from harness.cpus import cpu_share
from harness.errors import (
    CheckpointError,
    ConfigError,
    HarnessError,
    IncompatibleError,
    MissingExtraError,
    PluginError,
)
from harness.plugins import HarnessPluginManager
from harness.policy import Acting, Policy
from harness.registry import AlgorithmSpec, Registry
from harness.rundir import (
    RunLock,
    check_checkpoint_files,
    check_free_space,
    check_writable_dir,
    estimate_checkpoint_bytes,
    lock_run_dir,
)
from harness.runtime.acting import ActingPlan, plan_acting, warn_agent_actors
from harness.runtime.spaces import env_info
from harness.runtime.state import Run, read_runner_state, restore_runner_state
from harness.seeds import Seeds
from harness.tracking import MetricsRouter, Tracker
from harness.version import __version__

log = logging.getLogger(__name__)

ACTOR_MEMORY_MB = 48
"""The memory one actor process of an embedded farm takes from this machine, in MiB. Measured
with psutil's ``memory_full_info`` once a second over CartPole PPO farm runs (60k steps, 2
and 8 actors, torch backend, on the 2-core dev VM): each actor's RSS is 241 MiB, but all but
15 MiB of it (its USS, private pages) is shared with the zygote it was forked from. Starting
hundreds costs more than that steady state: `--actors 100000` on the 24 GiB dev VM was ended
by the OOM killer after ~500 actors, ~48 MiB each (page tables copied at fork, sockets and
queues on both sides, pages dirtied while starting). Larger envs or networks need more: this
refuses counts the machine cannot hold, it does not promise that fewer fit
(``run.max_actors`` overrides it)."""


# ------------------------------------------------------------------------------------------
# The config as a run uses it


def farm_size(actors: int, num_envs: int) -> tuple[int, int]:
    """``(actors, num_envs)`` for an actor count that is a request rather than a number held
    to ``run.num_envs``: ``run.actors = -1`` (one actor per core of this machine) and ``harness
    run --actors N``. The env count rises to at least the actor count (each actor steps at
    least one env). An actor count set in a file or with ``--set`` is not raised for:
    :func:`build_run` refuses more actors than envs there."""
    if actors < 0:
        actors = cpu_share()
    return actors, max(num_envs, actors)


def _concrete_actors(config: Config) -> Config:
    """``config`` with ``run.actors = -1`` replaced by :func:`farm_size`'s counts (a copy:
    the caller's config is left as it is); ``config`` itself otherwise."""
    if config.run.actors >= 0:
        return config
    actors, num_envs = farm_size(config.run.actors, config.run.num_envs)
    run = dataclasses.replace(config.run, actors=actors, num_envs=num_envs)
    return dataclasses.replace(config, run=run)


# ------------------------------------------------------------------------------------------
# Checks made before anything is built


def check_algorithm_fits(spec: AlgorithmSpec, info: EnvInfo, registry: Registry) -> None:
    """Refuse a single-agent algorithm on a multi-agent env (and the reverse) or one that does
    not support the env's action space(s), naming both and the algorithms that fit."""
    kinds = sorted(
        {a.kind for a in info.actions.values()} if info.multi_agent else {info.action.kind}
    )

    def fits(s: AlgorithmSpec) -> bool:
        agents_ok = s.agents == "any" or (s.agents == "multi") == info.multi_agent
        return agents_ok and all(k in s.action_spaces for k in kinds)

    if fits(spec):
        return
    others = ", ".join(sorted(n for n, s in registry.algorithms.items() if fits(s)))
    others = others or "none installed"
    if spec.agents != "any" and (spec.agents == "multi") != info.multi_agent:
        if info.multi_agent:
            what = (
                f"Algorithm {spec.name!r} is single-agent, but {info.env_id!r} is a multi-agent "
                f"env (agents: {', '.join(info.agents)})"
            )
        else:
            what = (
                f"Algorithm {spec.name!r} is multi-agent, but {info.env_id!r} is a single-agent env"
            )
        raise IncompatibleError(f"{what}. Algorithms that fit: {others}.")
    raise IncompatibleError(
        f"Algorithm {spec.name!r} does not support the {'/'.join(kinds)} action space of "
        f"{info.env_id!r} (it supports: {', '.join(spec.action_spaces)}). Algorithms that "
        f"fit: {others}."
    )


def check_backend_supported(registry: Registry, algo: str, backend: str) -> None:
    """Refuse an algorithm on a backend it does not declare (``AlgorithmSpec.backends``)."""
    spec = registry.algorithms.get(algo)
    if not spec.backends or backend in spec.backends:
        return
    fits = [n for n, s in registry.algorithms.items() if not s.backends or backend in s.backends]
    raise IncompatibleError(
        f"Algorithm {algo!r} (plugin {spec.plugin or '?'}) does not run on backend {backend!r}: "
        f"it supports {', '.join(spec.backends)}. Use --set backend={spec.backends[0]}, or an "
        f"algorithm that runs on {backend!r}: {', '.join(sorted(fits)) or 'none installed'}."
    )


def check_compatible(meta: Mapping[str, Any], run: RunConfig, ckpt: Path) -> None:
    """Refuse a checkpoint written for another algorithm, backend or env."""
    for key in ("algo", "backend", "env"):
        have, want = meta.get(key), getattr(run, key)
        if have != want:
            raise CheckpointError(
                f"Checkpoint {ckpt} was written by {key} {have!r}, but the config asks for "
                f"{key} {want!r}. Use --set {key}={have} to load it, or start a fresh run."
            )


def available_memory_mb() -> float | None:
    """Memory this process could still use, in MiB: the kernel's ``MemAvailable``, or less
    when a cgroup (a container, a batch job) limits it; None when neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) / 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = _cgroup_room_mb()
    if cgroup is not None:
        found.append(cgroup)
    return min(found) if found else None


def _cgroup_room_mb() -> float | None:
    """The room left under this process's cgroup memory limit (v2 or v1), if it has one."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            files = ("/sys/fs/cgroup" + path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            files = (
                "/sys/fs/cgroup/memory" + path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        try:
            with open(os.path.join(files[0], files[1]), encoding="ascii") as f:
                limit = f.read().strip()
            with open(os.path.join(files[0], files[2]), encoding="ascii") as f:
                usage = int(f.read())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" or a huge number: no limit
            return max(0, int(limit) - usage) / 2**20
    return None


def check_actor_capacity(run: RunConfig, available_mb: float | None = None) -> None:
    """Refuse, before anything is forked, more actors than this machine can hold: each is a
    process of about :data:`ACTOR_MEMORY_MB`, and a count past the memory ends the run in the
    kernel's OOM killer rather than an error. ``run.max_actors`` replaces the estimate. A
    cluster (``run.cluster``) is left alone: its client learns nothing of the workers'
    memory, and its master queues (then times out) placements no worker can take."""
    if run.actors <= 0 or run.cluster:
        return
    if run.max_actors > 0:
        if run.actors > run.max_actors:
            raise ConfigError(
                f"run.actors = {run.actors} is more than run.max_actors = {run.max_actors}. "
                f"Lower run.actors (--actors) or raise run.max_actors."
            )
        return
    available = available_memory_mb() if available_mb is None else available_mb
    if available is None:  # (not Linux and no way to tell): let the farm try
        return
    limit = int(available // ACTOR_MEMORY_MB)
    if run.actors > limit:
        raise ConfigError(
            f"run.actors = {run.actors} is more actor processes than this machine's memory "
            f"holds: {available:.0f} MiB are available and an actor needs about "
            f"{ACTOR_MEMORY_MB} MiB, so the limit is {limit} actors. Lower run.actors "
            f"(--actors {max(1, limit)}), or, if your actors need less memory, allow more with "
            f"--set run.max_actors={run.actors}."
        )


def replay_row_bytes(info: EnvInfo) -> int:
    """Bytes one transition takes in a replay memory of ``info``'s env: observation and next
    observation (float32, or uint8 images), action (int64 index or float32 box), reward and
    done (float32), for every agent of a multi-agent env."""
    agents = info.agents or ("",)
    observations = info.observations or {"": info.observation}
    actions = info.actions or {"": info.action}
    total = 0
    for name in agents:
        obs, act = observations[name], actions[name]
        obs_bytes = obs.flat_dim * (1 if obs.dtype == "uint8" else 4)
        act_bytes = 8 if act.kind == "discrete" else act.flat_dim * 4
        total += 2 * obs_bytes + act_bytes + 4 + 4
    return total


def check_replay_memory(config: Config, info: EnvInfo, available_mb: float | None = None) -> None:
    """Refuse, before anything is allocated, an ``algo.buffer_size`` whose replay memory
    this machine cannot hold (numpy's allocation error, or the OOM killer hours into the
    run). The estimate (:func:`replay_row_bytes` per transition) is a lower bound: an
    algorithm that stores sequences or episodes needs more."""
    size = getattr(config.algo, "buffer_size", None)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return
    available = available_memory_mb() if available_mb is None else available_mb
    if available is None:
        return
    row = replay_row_bytes(info)
    needed = size * row / 2**20
    if needed <= available:
        return
    fits = int(available * 2**20 / 2 // row)  # half the memory: the rest of the run needs some
    unit = 10 ** max(0, len(str(fits)) - 1)
    fits = max(1, fits // unit * unit)  # rounded down to one significant digit
    origin = config.sources.get("algo.buffer_size", "config")
    raise ConfigError(
        f"{origin}: algo.buffer_size = {size:_} transitions need at least {needed:,.0f} MiB of "
        f"replay memory ({row} bytes each for {info.env_id!r}: observation, next "
        f"observation, action, reward, done), but this machine has {available:,.0f} MiB "
        f"available. Lower it, e.g. --set algo.buffer_size={fits}."
    )


def _check_farm(config: Config) -> None:
    """Refuse an actor count the run cannot start (before any env, buffer or process)."""
    run = config.run
    if run.actors <= 0:
        return
    if run.actors > run.num_envs:
        raise ConfigError(
            f"run.actors = {run.actors} is more than run.num_envs = "
            f"{run.num_envs}: each actor steps at least one env. Raise run.num_envs "
            f"(it is split across the actors) or lower run.actors."
        )
    check_actor_capacity(run)


# ------------------------------------------------------------------------------------------
# Envs, agents, trackers, run directories


def make_envs(
    config: Config,
    registry: Registry,
    num_envs: int,
    seed: int | None,
    render_mode: str | None = None,
    *,
    evaluation: bool = False,
) -> Any:
    """The vector env of ``config``'s ``run.env`` with ``num_envs`` copies; with
    ``render_mode`` (``"rgb_array"``: ``harness eval --video``) one whose ``render()`` gives a
    frame per env; with ``evaluation`` one built with the family's evaluation options
    (``EnvSpec.evaluation_options``: no training-only aids). ``render_mode`` reaches the
    family's ``make_env`` only when given, and only for a family that declares it
    (``EnvSpec.render_modes``): third-party families written before rendering existed never
    see the keyword."""
    env_id = config.run.env
    spec = registry.env_for(env_id)
    kwargs: dict[str, Any] = {}
    if render_mode is not None:
        if render_mode not in spec.render_modes:
            declared = ", ".join(map(repr, spec.render_modes)) or "none"
            raise ConfigError(
                f"The env {env_id!r} cannot render {render_mode!r} frames: its env family "
                f"{spec.name!r} (plugin {spec.plugin or '?'}) declares no such render mode "
                f"(EnvSpec.render_modes: {declared}). Evaluate it without --video, or give the "
                f"family a renderer (docs/video.md, 'Rendering in an env plugin')."
            )
        kwargs["render_mode"] = render_mode
    options = config.env
    if evaluation and spec.evaluation_options is not None:
        options = spec.evaluation_options(options)
    envs = spec.make_env(
        env_id,
        num_envs=num_envs,
        seed=seed,
        vector=config.run.vector,
        options=options,
        **kwargs,
    )
    missing = [a for a in ("num_envs", "reset", "step", "close") if not hasattr(envs, a)]
    if missing:  # (else a bare AttributeError somewhere later names nothing)
        raise PluginError(
            f"The env family {spec.name!r} of plugin {spec.plugin or '?'!r} returned "
            f"{type(envs).__name__} {_short(envs)} from make_env({env_id!r}, num_envs="
            f"{num_envs}), which has no {', '.join(missing)}: make_env must return a vector env "
            "(gymnasium.vector.VectorEnv or the like, with num_envs, reset, step and close). "
            "Fix the env plugin (harness.testing.check_env checks it)."
        )
    return envs


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def make_agent(config: Config, registry: Registry, info: EnvInfo) -> Agent:
    """A fresh agent of ``config``'s algorithm and backend for the env ``info`` describes
    (refused when they do not fit)."""
    spec = registry.algorithms.get(config.run.algo)
    check_algorithm_fits(spec, info, registry)
    check_backend_supported(registry, config.run.algo, config.run.backend)
    backend_spec = registry.backends.get(config.run.backend)
    backend = backend_spec.load(config.backend)
    seeds = Seeds(config.run.seed)
    backend.seed(seeds.seed("backend"))
    agent: Agent = spec.make_agent(
        info, backend, config.algo, seed=seeds.seed("agent"), total_steps=config.run.total_steps
    )
    return agent


def make_acting(
    config: Config, registry: Registry, info: EnvInfo, rng: np.random.Generator
) -> tuple[Policy, Acting] | None:
    """The policy of ``config``'s algorithm made without an agent (``AlgorithmSpec.
    make_policy`` over :class:`~harness.policy.Acting`, exploring with ``rng``), and the
    ``Acting`` whose ``env_steps`` its schedules read; None when the algorithm declares no
    such policy (the caller builds an agent: :func:`make_agent`)."""
    spec = registry.algorithms.get(config.run.algo)
    if spec.make_algorithm is None or spec.make_policy is None:
        return None
    check_algorithm_fits(spec, info, registry)
    check_backend_supported(registry, config.run.algo, config.run.backend)
    backend = registry.backends.get(config.run.backend).load(config.backend)
    backend.seed(Seeds(config.run.seed).seed("backend"))
    algorithm = spec.make_algorithm(backend, info, config.algo)
    acting = Acting(algorithm, info, config.algo, rng, total_steps=config.run.total_steps)
    policy = spec.make_policy(acting)
    if not isinstance(policy, Policy):
        raise PluginError(
            f"Algorithm {config.run.algo!r} (plugin {spec.plugin or '?'}): make_policy returned "
            f"{type(policy).__name__}, not a harness.policy.Policy. Fix the plugin's "
            "make_policy (harness.testing.check_algorithm checks it)."
        )
    return policy, acting


def make_acting_or_agent(
    config: Config, registry: Registry, info: EnvInfo, rng: np.random.Generator
) -> tuple[Policy, Acting] | Agent:
    """What a process that only acts (a farm actor, the policy server) acts with:
    :func:`make_acting`'s policy and parts, or, for an algorithm that declares no
    ``make_policy`` (deprecated), an agent exploring with ``rng``."""
    made = make_acting(config, registry, info, rng)
    if made is not None:
        return made
    agent = make_agent(config, registry, info)
    agent.rng = rng
    return agent


def new_run_dir(config: Config) -> Path:
    """A new directory under ``run.out`` named ``run.name`` or ``{env}__{algo}__{seed}__{time}``
    (with a ``-N`` suffix when taken)."""
    run = config.run
    algo = run.algo.replace(":", "-")  # (a qualified PLUGIN:NAME)
    name = run.name or f"{run.env}__{algo}__{run.seed}__{int(time.time())}"
    path = Path(run.out) / name
    suffix = 1
    while path.exists():
        path = Path(run.out) / f"{name}-{suffix}"
        suffix += 1
    path.mkdir(parents=True)
    return path


def discard_run_dir(run_dir: Path) -> None:
    """Remove the directory of a run that was refused before it started (a missing extra, an
    unreachable cluster, a tracker that cannot start): a refused start leaves nothing behind."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log.debug("removed %s: the run did not start", run_dir)


def make_trackers(config: Config, registry: Registry, run_dir: Path, start: int) -> MetricsRouter:
    """The trackers ``run.trackers`` names, started at step ``start``: a default one that is
    not installed or cannot start is skipped; one the user named and whose extra is missing
    refuses the run."""
    trackers: dict[str, Tracker] = {}
    asked = "run.trackers" in config.sources  # (else the defaults, which name optional plugins)
    for name in config.run.trackers:
        spec = registry.trackers.get(name)
        try:
            trackers[name] = spec.make(run_dir, config, start_step=start)
        except MissingExtraError as exc:
            if asked:
                raise
            log.debug("default tracker %r is not installed: %s", name, exc)
        except Exception as exc:
            if asked:  # one the user named must start (docs/plugins.md): refused, named
                _close_all(trackers)
                raise _tracker_failed(name, spec.plugin, exc, config) from exc
            # a default tracker never stops a run, not even when it cannot start
            log.warning(
                "tracker %r (plugin %s) failed to start and is skipped: %s: %s",
                name,
                spec.plugin or "?",
                type(exc).__name__,
                exc,
            )
    return MetricsRouter(trackers)


def _tracker_failed(name: str, plugin: str, exc: Exception, config: Config) -> PluginError:
    where = config.sources.get("run.trackers", "config")
    kept = [t for t in config.run.trackers if t != name]
    return PluginError(
        f"Tracker {name!r} (plugin {plugin or '?'!r}), named in run.trackers ({where}), failed "
        f"to start: {type(exc).__name__}: {str(exc).strip().rstrip('.')}. Fix what it needs, "
        f"or run without it: --set 'run.trackers={json.dumps(kept)}'."
    )


def _close_all(trackers: Mapping[str, Tracker]) -> None:
    for tracker in trackers.values():
        try:
            tracker.close()
        except Exception:  # (the error being raised is the one to report)
            log.debug("closing a tracker of a refused run raised", exc_info=True)


# ------------------------------------------------------------------------------------------
# Runs and checkpoints


def launch_command(argv: list[str] | None = None) -> str:
    """The shell-quoted command line that started this process (``sys.argv`` by default), for
    run.json: ``harness report`` shows it beside ``harness run RUN/config.toml`` so a reader sees
    how the run was launched (overrides, flags). The console script's absolute path (a venv's
    ``.../bin/harness``) is shortened to ``harness`` so the command works on another machine."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]) if argv else Path()
    if script.name == "harness" or script.parts[-2:] == ("harness", "__main__.py"):
        argv[0] = "harness"  # the console script, or `python -m harness`
    return shlex.join(argv)


def command_record(resume: Path | None) -> dict[str, str]:
    """run.json's ``"command"``: this process's command line; on ``--resume`` the command that
    started the run is kept and this one is added as ``"resumed_with"``."""
    now = launch_command()
    if resume is not None:
        try:
            first = json.loads((resume / "run.json").read_text(encoding="utf-8")).get("command")
        except (OSError, ValueError, AttributeError):
            first = None
        if isinstance(first, str) and first:
            return {"command": first, "resumed_with": now}
    return {"command": now}


def build_run(
    config: Config,
    registry: Registry,
    pm: HarnessPluginManager,
    *,
    resume: Path | None = None,
) -> Run:
    """Everything a run needs, restored from ``resume`` (a run directory) when given. The
    run's config is ``config`` with ``run.actors = -1`` made concrete (:func:`farm_size`);
    ``config`` itself is not changed. The run directory is locked for the run's life
    (:attr:`Run.lock`); a resume takes the lock first, then reads and checks everything it
    loads (checkpoint, runner state, agent) before it writes a byte."""
    pm.hook.harness_configure(config=config)
    curriculum.configure(config, registry)  # (a curriculum its env family declares)
    check_backend_supported(registry, config.run.algo, config.run.backend)  # before any file
    lock = lock_run_dir(resume, "harness run --resume") if resume is not None else None
    try:
        return _build_run(config, registry, pm, resume, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_run(
    config: Config,
    registry: Registry,
    pm: HarnessPluginManager,
    resume: Path | None,
    lock: RunLock | None,
) -> Run:
    ckpt, state = None, {}
    if resume is not None:
        ckpt = latest_checkpoint(resume)
        check_compatible(read_meta(ckpt), config.run, ckpt)
        check_checkpoint_files(ckpt)
        state = read_runner_state(ckpt, config.env)
    config = _concrete_actors(config)
    _check_farm(config)
    where = Path(resume) if resume is not None else Path(config.run.out)
    check_writable_dir(where, "--resume" if resume is not None else "run.out (--out)")
    envs, agent, info, acting = _make_agent_and_envs(config, registry)
    try:
        # every load before the first write: a checkpoint that cannot be read leaves the run
        # directory as it was
        if ckpt is not None:
            restore_checkpoint(agent, ckpt)
        elif config.run.init_from:
            init_agent_from(agent, config.run, Path(config.run.init_from))
        what = "--resume" if resume is not None else "run.out (--out)"
        check_free_space(where, estimate_checkpoint_bytes(agent), what)
        # a new run's directory only once the env, the algorithm and any dataset are accepted
        run_dir = Path(resume) if resume is not None else new_run_dir(config)
        if lock is None:
            lock = lock_run_dir(run_dir, "harness run")
    except BaseException:
        envs.close()
        raise
    try:
        plugins = {
            n: {"distribution": i.distribution, "version": i.version} for n, i in pm.infos.items()
        }
        write_resolved(
            config,
            run_dir,
            {"harness": __version__, "plugins": plugins, **command_record(resume)},
        )
        start = int(state["step"]) if ckpt is not None else 0
        router = make_trackers(config, registry, run_dir, start)
        run = Run(
            config, registry, pm, run_dir, agent, envs, info, router, acting=acting, lock=lock
        )
        if ckpt is not None:
            restore_runner_state(run, state)
            log.info("resumed %s from %s at step %d", run_dir, ckpt.name, run.step)
    except BaseException:
        envs.close()
        if resume is None:
            lock.release()
            discard_run_dir(run_dir)
        raise
    return run


def _make_agent_and_envs(
    config: Config, registry: Registry
) -> tuple[Any, Agent, EnvInfo, ActingPlan]:
    """The run's envs (with remote actors, one local env that describes the spaces), a fresh
    agent for them, refused before anything is allocated where it cannot fit, and where it
    acts (:func:`~harness.runtime.acting.plan_acting`: ``run.inference`` decided once)."""
    farm = config.run.actors > 0
    envs = make_envs(config, registry, 1 if farm else config.run.num_envs, seed=None)
    try:
        info = env_info(config.run.env, envs)
        if farm:
            info = dataclasses.replace(info, num_envs=config.run.num_envs)
        check_replay_memory(config, info)
        try:
            agent = make_agent(config, registry, info)
        except MemoryError as exc:  # past the estimate (a plugin's own buffers)
            raise ConfigError(
                f"Building the {config.run.algo!r} agent for {config.run.env!r} ran out of "
                f"memory ({exc}). Lower the sizes in [algo] (a replay buffer_size, network "
                f"widths) or run.num_envs."
            ) from None
        acting = plan_acting(config, agent)
        if farm:
            warn_agent_actors(registry.algorithms.get(config.run.algo))
        if agent.offline:  # learns from a dataset: check it before training
            if farm:
                raise ConfigError(
                    f"Algorithm {config.run.algo!r} learns offline from a dataset and steps no "
                    f"env for training: remote actors have nothing to do. Leave run.actors at 0 "
                    f"(it is {config.run.actors})."
                )
            agent.load_data()
    except BaseException:
        envs.close()
        raise
    return envs, agent, info, acting


def restore_checkpoint(agent: Agent, ckpt: Path, *, with_data: bool = True) -> None:
    """``agent.restore(ckpt)``, with a checkpoint its loader cannot read (a truncated file,
    arrays of other shapes) refused as a :class:`CheckpointError` naming it."""
    try:
        agent.restore(ckpt, with_data=with_data)
    except HarnessError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"Checkpoint {ckpt} cannot be loaded ({type(exc).__name__}: {exc}): a file of it "
            f"is damaged or cut short, or it was written for other network sizes. Use another "
            f"checkpoint of the run (move this one out of {ckpt.parent}), or start a fresh run."
        ) from exc


def init_agent_from(agent: Agent, run: RunConfig, source: Path) -> Path:
    """Load the networks and optimisers of ``source``'s newest checkpoint into ``agent``
    (``run.init_from``); returns that checkpoint. The algorithm may differ (``cql`` into
    ``sac``), the env and backend may not."""
    ckpt = latest_checkpoint(source)
    meta = read_meta(ckpt)
    for key in ("env", "backend"):
        have, want = meta.get(key), getattr(run, key)
        if have != want:
            raise CheckpointError(
                f"run.init_from = {str(source)!r}: checkpoint {ckpt} was written for {key} "
                f"{have!r}, this run is on {key} {want!r}; start from a checkpoint of the same "
                f"{key}."
            )
    payload = agent.backend.load(ckpt / f"agent.{agent.backend.name}")
    try:
        agent.algorithm.load_state(payload["algorithm"])
    except Exception as exc:
        raise CheckpointError(
            f"run.init_from = {str(source)!r}: the networks of checkpoint {ckpt} (algorithm "
            f"{meta.get('algo')!r}) do not fit algorithm {run.algo!r} "
            f"({type(exc).__name__}: {exc}). Use a checkpoint of an algorithm with the same "
            f"networks and sizes (e.g. cql -> sac with the same actor/critic hidden sizes)."
        ) from exc
    log.info("networks initialised from %s (algorithm %s)", ckpt, meta.get("algo"))
    return ckpt


def load_agent(config: Config, registry: Registry, checkpoint: Path) -> Agent:
    """A fresh agent for ``config`` with the models and counters of ``checkpoint`` (no replay
    data): what ``harness eval`` evaluates."""
    probe = make_envs(config, registry, 1, seed=None)
    try:
        info = env_info(config.run.env, probe)
    finally:
        probe.close()
    agent = make_agent(config, registry, info)
    agent.restore(checkpoint, with_data=False)
    return agent
