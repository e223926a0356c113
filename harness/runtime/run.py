"""The serial runner: envs, agent, trackers, evaluation and checkpoints in one process.

``train(config)`` is an in-process function returning a :class:`RunResult`, so tuning and tests
call it directly. One iteration = ``agent.rollout_len`` vector steps, then ``agent.learn()``;
lifecycle hooks run per iteration, never per env step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Agent, EnvInfo, Transition, team_reward, tree_map
from harness.checkpoint import latest_checkpoint, read_meta, save_checkpoint, write_atomic_text
from harness.config import Config, RunConfig, write_resolved
from harness.cpus import cpu_share
from harness.errors import (
    CheckpointError,
    ConfigError,
    DivergedError,
    IncompatibleError,
    MissingExtraError,
    PluginError,
    missing_extra,
)
from harness.plugins import HarnessPluginManager
from harness.registry import AlgorithmSpec, Registry
from harness.runtime.spaces import env_info
from harness.tracking import MetricsRouter, Tracker
from harness.version import __version__

log = logging.getLogger(__name__)

RUNNER_STATE = "runner.json"


Episode = tuple[float, int, dict[str, float]]
"""A finished episode: its return, its length and the env's episode metrics (see
:func:`episode_metrics`)."""

EPISODE_METRICS = "episode_metrics"
"""Info key of an env's per-episode metrics: a dict of floats (e.g. a competition's official
score beside the shaped return) in the info of the step that ends the episode. The runner
reports their means as ``charts/NAME`` and ``eval/NAME``."""


def episode_metrics(infos: Mapping[str, Any], i: int) -> dict[str, float]:
    """Env ``i``'s :data:`EPISODE_METRICS` from a vector step's infos in which it ended
    (gymnasium's SAME_STEP autoreset keeps the final step's info in ``infos["final_info"]``,
    merged per key with ``_key`` masks)."""
    final = infos.get("final_info")
    if not final:
        return {}
    found = final.get(EPISODE_METRICS)
    mask = final.get("_" + EPISODE_METRICS)
    if not found or mask is None or not mask[i]:
        return {}
    return {
        name: float(values[i])
        for name, values in found.items()
        if not name.startswith("_") and found.get("_" + name, mask)[i]
    }


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """The env's episode metrics (see :data:`EPISODE_METRICS`), one list per name."""

    def metric_means(self) -> dict[str, float]:
        return {name: float(np.mean(v)) for name, v in self.metrics.items() if v}

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.returns)) if self.returns else float("nan")


@dataclass
class RunResult:
    """What ``train`` returns (and ``harness run`` prints)."""

    run_dir: Path
    steps: int
    episodes: int
    wall_time: float
    final_eval: float
    best_eval: float
    recent_return: float
    checkpoint: Path | None
    stopped_early: bool

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass
class Run:
    """The state of one training run, handed to lifecycle hooks."""

    config: Config
    registry: Registry
    pm: HarnessPluginManager
    run_dir: Path
    agent: Agent
    envs: Any
    info: EnvInfo
    router: MetricsRouter
    step: int = 0
    iteration: int = 0
    episodes: int = 0
    best_eval: float = -math.inf
    history: list[tuple[int, float]] = field(default_factory=list)
    eval_history: list[tuple[int, float]] = field(default_factory=list)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=20))
    log: logging.Logger = log
    stop_requested: bool = False
    """Set by a plugin (e.g. in harness_iteration_end) to end the run after this iteration."""
    collector: Any = None
    """Where experience comes from: SerialCollector, or FarmCollector with remote actors."""
    env_changes: dict[str, Any] = field(default_factory=dict)
    """``[env]`` options changed during the run by :meth:`update_env` (kept in checkpoints)."""

    def update_env(self, **changes: Any) -> None:
        """Change ``[env]`` options of the running envs (a curriculum): every env, here and in
        every farm actor (replacements and evaluation envs are built with them), gets
        ``configure(**changes)``, which takes effect at its next episode. Env plugins that
        support it document which options may change."""
        current: Any = self.config.env
        if not changes:
            return
        if current is None or not dataclasses.is_dataclass(current) or isinstance(current, type):
            raise ConfigError(f"{self.config.run.env!r} has no [env] options to change.")
        names = {f.name for f in dataclasses.fields(current)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(
                f"update_env: [env] has no option {', '.join(map(repr, unknown))} "
                f"(options: {', '.join(sorted(names))})."
            )
        self.config = dataclasses.replace(self.config, env=dataclasses.replace(current, **changes))
        self.env_changes.update(changes)
        _configure(self.envs, changes)
        if self.collector is not None and hasattr(self.collector, "update_env"):
            self.collector.update_env(self.config, changes)
        log.info("env options changed at step %d: %s", self.step, changes)

    @property
    def recent_return(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")


def _configure(envs: Any, changes: Mapping[str, Any]) -> None:
    """``configure(**changes)`` on every env of a vector env (see :meth:`Run.update_env`)."""
    try:
        envs.call("configure", **changes)
    except AttributeError:
        raise ConfigError(
            f"the env does not support changing options during a run (no configure method); "
            f"cannot apply {dict(changes)}."
        ) from None


# ------------------------------------------------------------------------------------------
# Building


def make_envs(config: Config, registry: Registry, num_envs: int, seed: int | None) -> Any:
    spec = registry.env_for(config.run.env)
    return spec.make_env(
        config.run.env,
        num_envs=num_envs,
        seed=seed,
        vector=config.run.vector,
        options=config.env,
    )


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


def make_agent(config: Config, registry: Registry, info: EnvInfo) -> Agent:
    spec = registry.algorithms.get(config.run.algo)
    check_algorithm_fits(spec, info, registry)
    check_backend_supported(registry, config.run.algo, config.run.backend)
    backend_spec = registry.backends.get(config.run.backend)
    backend = backend_spec.load(config.backend)
    backend.seed(config.run.seed)
    agent: Agent = spec.make_agent(
        info, backend, config.algo, seed=config.run.seed, total_steps=config.run.total_steps
    )
    return agent


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


def new_run_dir(config: Config) -> Path:
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


def make_trackers(config: Config, registry: Registry, run_dir: Path, start: int) -> MetricsRouter:
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
        except PluginError as exc:
            log.warning("tracker %r is unavailable and skipped: %s", name, exc)
        except Exception as exc:  # a tracker never stops a run, not even when it cannot start
            log.warning(
                "tracker %r (plugin %s) failed to start and is skipped: %s: %s",
                name,
                spec.plugin or "?",
                type(exc).__name__,
                exc,
            )
    return MetricsRouter(trackers)


def build_run(
    config: Config,
    registry: Registry,
    pm: HarnessPluginManager,
    *,
    resume: Path | None = None,
) -> Run:
    """Everything a run needs, restored from ``resume`` (a run directory) when given."""
    pm.hook.harness_configure(config=config)
    check_backend_supported(registry, config.run.algo, config.run.backend)  # before any file
    ckpt = None
    if resume is not None:
        ckpt = latest_checkpoint(resume)
        check_compatible(read_meta(ckpt), config.run, ckpt)
    if config.run.actors < 0:  # one actor per core of this machine
        config.run.actors = cpu_share()
        config.run.num_envs = max(config.run.num_envs, config.run.actors)
    farm = config.run.actors > 0
    if farm and config.run.actors > config.run.num_envs:
        raise ConfigError(
            f"run.actors = {config.run.actors} is more than run.num_envs = "
            f"{config.run.num_envs}: each actor steps at least one env. Raise run.num_envs "
            f"(it is split across the actors) or lower run.actors."
        )
    if farm:
        from harness.runtime.farm import check_actor_capacity

        check_actor_capacity(config.run)  # before any env, buffer or process is made
    # with remote actors the envs live there; one local env describes the spaces
    envs = make_envs(config, registry, 1 if farm else config.run.num_envs, seed=None)
    try:
        info = env_info(config.run.env, envs)
        if farm:
            info = dataclasses.replace(info, num_envs=config.run.num_envs)
        agent = make_agent(config, registry, info)
        if getattr(agent, "offline", False):  # learns from a dataset: check it before training
            if farm:
                raise ConfigError(
                    f"Algorithm {config.run.algo!r} learns offline from a dataset and steps no "
                    f"env for training: remote actors have nothing to do. Leave run.actors at 0 "
                    f"(it is {config.run.actors})."
                )
            agent.load_data()
        # a new run's directory only once the env, the algorithm and any dataset are accepted
        run_dir = Path(resume) if resume is not None else new_run_dir(config)
    except BaseException:
        envs.close()
        raise
    try:
        plugins = {
            n: {"distribution": i.distribution, "version": i.version} for n, i in pm.infos.items()
        }
        write_resolved(config, run_dir, {"harness": __version__, "plugins": plugins})
        start = 0
        if ckpt is None and config.run.init_from:
            init_agent_from(agent, config.run, Path(config.run.init_from))
        if ckpt is not None:
            agent.restore(ckpt)
            start = int(json.loads((ckpt / RUNNER_STATE).read_text())["step"])
        router = make_trackers(config, registry, run_dir, start)
        run = Run(config, registry, pm, run_dir, agent, envs, info, router)
        if ckpt is not None:
            _load_runner_state(run, ckpt)
            log.info("resumed %s from %s at step %d", run_dir, ckpt.name, run.step)
    except BaseException:
        envs.close()
        if resume is None:
            discard_run_dir(run_dir)
        raise
    return run


def discard_run_dir(run_dir: Path) -> None:
    """Remove the directory of a run that was refused before it started (a missing extra, an
    unreachable cluster, a tracker that cannot start): a refused start leaves nothing behind."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log.debug("removed %s: the run did not start", run_dir)


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


def check_compatible(meta: Mapping[str, Any], run: RunConfig, ckpt: Path) -> None:
    """Refuse a checkpoint written for another algorithm, backend or env."""
    for key in ("algo", "backend", "env"):
        have, want = meta.get(key), getattr(run, key)
        if have != want:
            raise CheckpointError(
                f"Checkpoint {ckpt} was written by {key} {have!r}, but the config asks for "
                f"{key} {want!r}. Use --set {key}={have} to load it, or start a fresh run."
            )


# ------------------------------------------------------------------------------------------
# Training


def train(
    config: Config,
    registry: Registry,
    pm: HarnessPluginManager,
    *,
    resume: Path | None = None,
) -> RunResult:
    """Train ``config`` to completion in this process; returns the summary."""
    run = build_run(config, registry, pm, resume=resume)
    t_start = time.perf_counter()
    stopped = started = False
    ckpt: Path | None = None
    summary: dict[str, Any] = {}
    try:
        pm.hook.harness_run_start(run=run)
        collector = run.collector = _collector(run)
        started = True
        try:
            stopped = _loop(run, collector)
        finally:
            collector.close()
        if not run.eval_history or run.eval_history[-1][0] != run.step:
            _evaluate_and_record(run)
        ckpt = _checkpoint(run)
        final = run.eval_history[-1][1] if run.eval_history else float("nan")
        result = RunResult(
            run_dir=run.run_dir,
            steps=run.step,
            episodes=run.episodes,
            wall_time=time.perf_counter() - t_start,
            final_eval=final,
            best_eval=run.best_eval,
            recent_return=run.recent_return,
            checkpoint=ckpt,
            stopped_early=stopped,
        )
        summary = result.as_dict()
        write_atomic_text(run.run_dir / "summary.json", json.dumps(summary, indent=2))
        _plot(run)
        return result
    finally:
        pm.hook.harness_run_end(run=run, summary=summary)
        run.router.close()
        run.envs.close()
        if not started and resume is None:
            discard_run_dir(run.run_dir)


class EnvStepper:
    """Steps a vector env with an agent's exploratory actions and keeps the episode
    statistics; the same code runs in this process (serial runs) and in remote actors."""

    def __init__(self, envs: Any, seed: int) -> None:
        self.envs = envs
        self.n = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self.ep_return = np.zeros(self.n)  # a multi-agent env's: the team's (sum over agents)
        self.ep_length = np.zeros(self.n, dtype=np.int64)

    def step(self, agent: Agent, finished: list[Episode]) -> Transition:
        """One vector step; appends (return, length, metrics) of episodes that ended to
        ``finished``.
        The transition's ``next_obs`` holds the true final observation of ended episodes."""
        obs = self.obs
        actions, extras = agent.sample(obs)
        next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        real_next = next_obs
        self.ep_return += team_reward(rewards)
        self.ep_length += 1
        # SAME_STEP autoreset: "_final_obs" is in the infos exactly when an episode ended
        # (harness.testing.check_env holds every env plugin to it)
        final_mask = infos.get("_final_obs")
        if final_mask is not None:
            real_next = tree_map(np.copy, next_obs)
            _put_final_obs(real_next, infos, final_mask)
            done = terminated | truncated
            for i in np.flatnonzero(done):
                finished.append(
                    (
                        float(self.ep_return[i]),
                        int(self.ep_length[i]),
                        episode_metrics(infos, int(i)),
                    )
                )
                self.ep_return[i] = 0.0
                self.ep_length[i] = 0
            agent.episodes_ended(done)
        self.obs = next_obs
        return Transition(obs, actions, rewards, real_next, terminated, truncated, extras)

    def rollout(self, agent: Agent, steps: int, finished: list[Episode]) -> dict[str, Any]:
        """``steps`` vector steps written into time-major arrays ``(steps, n, ...)``: the
        Transition fields by name plus ``extras`` (a dict). What :meth:`step` gives step by
        step, for a remote actor: no per-step objects, the episode statistics done once at
        the end (``finished`` gets them in time order, like ``step``)."""
        bufs: dict[str, np.ndarray] = {}
        extra_bufs: dict[str, np.ndarray] = {}
        any_done = False
        ended: dict[tuple[int, int], dict[str, float]] = {}  # (t, env): episode metrics
        for t in range(steps):
            obs = self.obs
            actions, extras = agent.sample(obs)
            next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            if t == 0:
                for name, value in (
                    ("obs", obs),
                    ("actions", actions),
                    ("rewards", rewards),
                    ("next_obs", next_obs),
                    ("terminated", terminated),
                    ("truncated", truncated),
                ):
                    bufs[name] = tree_map(_time_major(steps), value)
                for key, value in extras.items():
                    extra_bufs[key] = _time_major(steps)(value)
            for name, value in (
                ("obs", obs),
                ("actions", actions),
                ("rewards", rewards),
                ("next_obs", next_obs),
                ("terminated", terminated),
                ("truncated", truncated),
            ):
                tree_map(_setter(t), bufs[name], value)
            for key, value in extras.items():
                extra_bufs[key][t] = value
            final_mask = infos.get("_final_obs")  # SAME_STEP autoreset, as in step()
            if final_mask is not None:
                any_done = True
                _put_final_obs(tree_map(_getter(t), bufs["next_obs"]), infos, final_mask)
                for i in np.flatnonzero(final_mask):
                    metrics = episode_metrics(infos, int(i))
                    if metrics:
                        ended[t, int(i)] = metrics
                agent.episodes_ended(terminated | truncated)
            self.obs = next_obs
        done = bufs["terminated"] | bufs["truncated"]
        self._account(team_reward(bufs["rewards"]), done, any_done, finished, ended)
        chunk: dict[str, Any] = dict(bufs)
        chunk["extras"] = extra_bufs
        return chunk

    def _account(
        self,
        rewards: np.ndarray,
        done: np.ndarray,
        any_done: bool,
        finished: list[Episode],
        ended: Mapping[tuple[int, int], dict[str, float]],
    ) -> None:
        """Episode statistics of ``(T, n)`` rewards and done flags (see :meth:`rollout`)."""
        steps = len(rewards)
        if not any_done:
            self.ep_return += rewards.sum(axis=0)
            self.ep_length += steps
            return
        cum = np.cumsum(rewards, axis=0)
        last = np.full(self.n, -1)  # the step of each env's latest episode end
        for t, i in np.argwhere(done):
            before = cum[last[i], i] if last[i] >= 0 else 0.0
            ep_return = self.ep_return[i] + cum[t, i] - before
            length = int(self.ep_length[i] + t - last[i])
            finished.append((float(ep_return), length, ended.get((int(t), int(i)), {})))
            self.ep_return[i] = 0.0
            self.ep_length[i] = 0
            last[i] = t
        cols = np.arange(self.n)
        self.ep_return += cum[-1] - np.where(last >= 0, cum[last, cols], 0.0)
        self.ep_length += steps - 1 - last


def _time_major(steps: int) -> Any:
    def empty(value: Any) -> np.ndarray:
        value = np.asarray(value)
        return np.empty((steps, *value.shape), value.dtype)

    return empty


def _setter(t: int) -> Any:
    def put(buf: np.ndarray, value: Any) -> None:
        buf[t] = value

    return put


def _getter(t: int) -> Any:
    return lambda buf: buf[t]  # a view: writing into it writes the buffer


def _put_final_obs(next_obs: Any, infos: Mapping[str, Any], mask: np.ndarray) -> None:
    """Write the true final observations of the envs in ``mask`` into ``next_obs`` (in place):
    gymnasium keeps one per env in ``infos["final_obs"]``; a multi-agent env an agent-keyed
    dict of arrays shaped like its observations (rows outside ``mask`` unused)."""
    final = infos["final_obs"]
    rows = np.flatnonzero(mask)
    if isinstance(next_obs, Mapping):
        for agent, value in next_obs.items():
            value[rows] = final[agent][rows]
        return
    for i in rows:
        next_obs[i] = final[i]


class SerialCollector:
    """Experience from envs stepped in this process."""

    def __init__(self, run: Run) -> None:
        self.stepper = EnvStepper(run.envs, run.config.run.seed + run.step)

    def collect(self, run: Run, finished: list[Episode]) -> None:
        agent, stepper = run.agent, self.stepper
        for _ in range(agent.rollout_len):
            agent.observe(stepper.step(agent, finished))
            run.step += stepper.n

    def after_learn(self, run: Run) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class OfflineCollector:
    """No experience at all: an offline agent learns from its dataset (``Agent.offline``). One
    run step is one gradient update, so ``total_steps``, ``eval_every``, ``log_every`` and
    ``checkpoint_every`` count updates and ``perf/SPS`` is updates per second."""

    def __init__(self, run: Run) -> None:
        del run

    def collect(self, run: Run, finished: list[Episode]) -> None:
        run.step += run.agent.rollout_len

    def after_learn(self, run: Run) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def _loop(run: Run, collector: Any) -> bool:
    """Iterate until the step budget or the return threshold; True when stopped early."""
    cfg = run.config.run
    agent = run.agent
    finished: list[Episode] = []
    window_returns: list[float] = []
    window_lengths: list[int] = []
    window_metrics: dict[str, list[float]] = {}
    next_log = run.step + cfg.log_every
    next_eval = run.step + cfg.eval_every if cfg.eval_every > 0 else math.inf
    next_ckpt = run.step + cfg.checkpoint_every if cfg.checkpoint_every > 0 else math.inf
    t_window, steps_window = time.perf_counter(), run.step
    device_stats = getattr(agent.backend, "device_stats", dict)  # (optional for backends)
    deadline = time.monotonic() + cfg.max_seconds if cfg.max_seconds > 0 else math.inf
    while run.step < cfg.total_steps:
        if time.monotonic() >= deadline:
            log.info("run.max_seconds = %g reached at step %d", cfg.max_seconds, run.step)
            return True
        collector.collect(run, finished)
        for ep_return, ep_length, ep_metrics in finished:
            window_returns.append(ep_return)
            window_lengths.append(ep_length)
            run.recent.append(ep_return)
            for name, value in ep_metrics.items():
                window_metrics.setdefault(name, []).append(value)
        run.episodes += len(finished)
        finished.clear()
        metrics = dict(agent.learn())
        _check_finite(run, metrics)
        metrics.update(collector.after_learn(run))
        run.iteration += 1
        if window_returns:
            metrics["charts/episodic_return"] = float(np.mean(window_returns))
            metrics["charts/episodic_length"] = float(np.mean(window_lengths))
            for name, values in window_metrics.items():
                metrics[f"charts/{name}"] = float(np.mean(values))
        if run.step >= next_log:
            now = time.perf_counter()
            metrics["perf/SPS"] = (run.step - steps_window) / max(now - t_window, 1e-9)
            metrics["charts/episodes"] = float(run.episodes)
            metrics.update(device_stats())
            run.router.record(run.step, metrics)
            if window_returns:
                run.history.append((run.step, metrics["charts/episodic_return"]))
            window_returns, window_lengths, window_metrics = [], [], {}
            t_window, steps_window = now, run.step
            next_log = run.step + cfg.log_every
        stop = False
        if run.step >= next_eval:
            result = _evaluate_and_record(run)
            metrics["eval/mean_return"] = result.mean
            next_eval = run.step + cfg.eval_every
            stop = cfg.stop_at_return is not None and result.mean >= cfg.stop_at_return
        run.pm.hook.harness_iteration_end(run=run, metrics=metrics)
        if stop:
            log.info("eval mean %.1f reached stop_at_return at step %d", run.best_eval, run.step)
            return True
        if run.stop_requested:
            log.info("a plugin asked to stop at step %d", run.step)
            return True
        if run.step >= next_ckpt:
            _checkpoint(run)
            next_ckpt = run.step + cfg.checkpoint_every
    return False


def _check_finite(run: Run, metrics: Mapping[str, float]) -> None:
    """Stop at the first non-finite loss, naming the step and the checkpoint to go back to."""
    bad = [
        f"{k} = {v}" for k, v in metrics.items() if k.startswith("losses/") and not math.isfinite(v)
    ]
    if bad:
        raise _diverged(run, ", ".join(bad))


def _diverged(run: Run, what: str) -> DivergedError:
    try:
        last = latest_checkpoint(run.run_dir)
    except CheckpointError:
        where = "No checkpoint had been written yet."
    else:
        where = (
            f"The last finite checkpoint is {last}: lower the learning rate or clip gradients "
            f"harder, then continue from it with `harness run --resume {run.run_dir}`."
        )
    return DivergedError(
        f"Training diverged at step {run.step} (iteration {run.iteration}): {what}. {where}"
    )


def _collector(run: Run) -> Any:
    if getattr(run.agent, "offline", False):
        return OfflineCollector(run)
    if run.config.run.actors <= 0:
        return SerialCollector(run)
    try:
        from harness.runtime.farm import FarmCollector

        return FarmCollector(run)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, f"the actor farm (run.actors = {run.config.run.actors})")
        if error is None:
            raise
        raise error from exc


def load_agent(config: Config, registry: Registry, checkpoint: Path) -> Agent:
    """A fresh agent for ``config`` with the models and counters of ``checkpoint`` (no replay
    data): what ``harness eval`` evaluates."""
    from harness.runtime.spaces import env_info

    probe = make_envs(config, registry, 1, seed=None)
    try:
        info = env_info(config.run.env, probe)
    finally:
        probe.close()
    agent = make_agent(config, registry, info)
    agent.restore(checkpoint, with_data=False)
    return agent


def _evaluate_and_record(run: Run) -> EvalResult:
    cfg = run.config.run
    if cfg.eval_episodes <= 0:
        return EvalResult([], [])
    result = evaluate(
        run.agent, run.config, run.registry, cfg.eval_episodes, seed=10_000 + cfg.seed + run.step
    )
    run.eval_history.append((run.step, result.mean))
    run.best_eval = max(run.best_eval, result.mean)
    row = {"eval/mean_return": result.mean, "eval/std_return": result.std}
    row.update({f"eval/{name}": mean for name, mean in result.metric_means().items()})
    run.router.record(run.step, row)
    return result


def evaluate(
    agent: Agent, config: Config, registry: Registry, episodes: int, *, seed: int
) -> EvalResult:
    """Greedy evaluation: exactly ``episodes`` complete episodes, spread over up to 8 envs so
    short episodes are not over-counted (each env runs its own quota)."""
    n = max(1, min(8, episodes))
    quota = np.full(n, episodes // n)
    quota[: episodes % n] += 1
    envs = make_envs(config, registry, n, seed=None)
    # Agent.predict_episodes_ended (per-env greedy state, e.g. a recurrent QMIX agent); any
    # object with a predict() can be evaluated, so the hook stays optional here
    predict_ended = getattr(agent, "predict_episodes_ended", None)
    try:
        obs, _ = envs.reset(seed=seed)
        ret = np.zeros(n)
        length = np.zeros(n, dtype=np.int64)
        result = EvalResult([], [])
        if predict_ended is not None:
            predict_ended(np.ones(n, bool))
        while (quota > 0).any():
            obs, rewards, terminated, truncated, infos = envs.step(agent.predict(obs))
            if predict_ended is not None and (terminated | truncated).any():
                predict_ended(terminated | truncated)
            ret += team_reward(rewards)
            length += 1
            for i in np.flatnonzero(terminated | truncated):
                if quota[i] > 0:
                    result.returns.append(float(ret[i]))
                    result.lengths.append(int(length[i]))
                    for name, value in episode_metrics(infos, int(i)).items():
                        result.metrics.setdefault(name, []).append(value)
                    quota[i] -= 1
                ret[i], length[i] = 0.0, 0
        return result
    finally:
        envs.close()


# ------------------------------------------------------------------------------------------
# Checkpoints


def _checkpoint(run: Run) -> Path:
    weights = run.agent.weights()
    bad = [k for k, v in weights.items() if v.dtype.kind == "f" and not np.all(np.isfinite(v))]
    if bad:  # never write a checkpoint to go back to that cannot be used
        raise _diverged(run, f"non-finite policy weights ({', '.join(bad[:3])})")
    state = {
        "step": run.step,
        "iteration": run.iteration,
        "episodes": run.episodes,
        "best_eval": run.best_eval if math.isfinite(run.best_eval) else None,
        "history": run.history,
        "eval_history": run.eval_history,
        "recent": list(run.recent),
        "env_changes": run.env_changes,
    }

    def write(tmp: Path) -> None:
        run.agent.save(tmp)
        (tmp / RUNNER_STATE).write_text(json.dumps(state), encoding="utf-8")

    meta = {
        "algo": run.config.run.algo,
        "backend": run.config.run.backend,
        "env": run.config.run.env,
        "harness": __version__,
        "config": run.config.to_dict(),
    }
    path = save_checkpoint(run.run_dir / "checkpoints", run.step, meta, write)
    run.pm.hook.harness_checkpoint(run=run, path=path)
    return path


def _load_runner_state(run: Run, ckpt: Path) -> None:
    state = json.loads((ckpt / RUNNER_STATE).read_text(encoding="utf-8"))
    run.step = int(state["step"])
    run.iteration = int(state["iteration"])
    run.episodes = int(state["episodes"])
    run.best_eval = state["best_eval"] if state["best_eval"] is not None else -math.inf
    run.history = [(int(a), float(b)) for a, b in state["history"]]
    run.eval_history = [(int(a), float(b)) for a, b in state["eval_history"]]
    run.recent.extend(state["recent"])
    if state.get("env_changes"):  # a curriculum's stage goes on where it was
        run.update_env(**state["env_changes"])


def _plot(run: Run) -> None:
    try:
        from harness.plotting import plot_learning_curve
    except ImportError:
        log.warning("matplotlib is missing: no learning_curve.png (pip install matplotlib)")
        return
    title = f"{run.config.run.algo} on {run.config.run.env} (seed {run.config.run.seed})"
    plot_learning_curve(run.history, run.eval_history, run.run_dir / "learning_curve.png", title)
