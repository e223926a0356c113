"""The train loop: ``train(config)`` builds a run (``harness.runtime.build``), drives its
collector (``harness.runtime.collectors``) and the agent's updates, evaluates, checkpoints and
writes the summary.

``train`` is an in-process function returning a :class:`RunResult`, so tuning and tests call
it directly. One iteration = ``agent.rollout_len`` vector steps, then ``agent.learn()``;
lifecycle hooks run per iteration, never per env step.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from harness import curriculum
from harness.api import Agent, team_reward
from harness.checkpoint import latest_checkpoint, save_checkpoint, write_atomic_text
from harness.config import Config
from harness.errors import CheckpointError, ConfigError, DivergedError, missing_extra
from harness.hookspecs import LOGGED_WINDOW
from harness.plugins import HarnessPluginManager
from harness.policy import Policy, as_policy
from harness.registry import Registry
from harness.rundir import (
    DiskSpaceError,
    estimate_checkpoint_bytes,
    is_out_of_space,
    out_of_space_error,
)

# (the modules, not the names: a name of MOVED must not be an attribute of this module, or
# its old path would not warn)
from harness.runtime import build, stepper
from harness.runtime import state as run_state
from harness.runtime.acting import SERIAL
from harness.runtime.build import discard_run_dir
from harness.runtime.collectors import Collector, OfflineCollector, SerialCollector
from harness.runtime.farm import FarmCollector
from harness.runtime.moved import old_paths
from harness.runtime.stepper import EnvFault, env_call, env_label
from harness.seeds import Seeds
from harness.version import __version__
from harness.video import EpisodeRecorder

__all__ = ["GreedyPolicy", "evaluate", "make_collector", "train"]

if TYPE_CHECKING:  # (at run time these are __getattr__'s, with its warning)
    from harness.runtime.state import EvalResult, Run, RunResult
    from harness.runtime.stepper import Episode

log = logging.getLogger(__name__)

MOVED: dict[str, str] = {
    **dict.fromkeys(
        (
            "EnvStepper",
            "Episode",
            "EvalResult",
            "Run",
            "RunResult",
            "build_run",
            "load_agent",
            "make_agent",
            "make_envs",
        ),
        "harness.runtime",
    ),
    "EPISODE_METRICS": "harness.runtime.stepper",
    "episode_metrics": "harness.runtime.stepper",
    "check_compatible": "harness.runtime.build",
}
"""Names this module gave when it held the whole runtime (before it was split by job), and
where they are imported from now: the public ``harness.runtime`` where they are public."""


__getattr__ = old_paths(__name__, MOVED)
"""The old paths of :data:`MOVED` (``harness.runtime.run.Run``, the path the API reference
used to give, ``harness.runtime.run.load_agent``, ...), with a DeprecationWarning."""


def train(
    config: Config,
    registry: Registry,
    pm: HarnessPluginManager,
    *,
    resume: Path | None = None,
    stop_on_sigterm: bool = False,
) -> RunResult:
    """Train ``config`` to completion in this process; returns the summary. With
    ``stop_on_sigterm`` (``harness run``) SIGTERM ends the run after the iteration it is in,
    with a checkpoint (:attr:`RunResult.terminated`); in-process callers (tuning trials,
    baselines, tests) leave SIGTERM to their own process."""
    run = build.build_run(config, registry, pm, resume=resume)
    t_start = time.perf_counter()
    stopped = started = bad_input = False
    ckpt: Path | None = None
    summary: dict[str, Any] = {}
    last_eval: dict[str, float] = {}  # the newest evaluation's eval/ metrics
    try:
        pm.hook.harness_run_start(run=run)
        collector = run.collector = make_collector(run)
        started = True
        try:
            with _stop_on_sigterm(run) if stop_on_sigterm else contextlib.nullcontext():
                stopped = _loop(run, collector, last_eval)
        finally:
            collector.close()
        if not run.terminated and (not run.eval_history or run.eval_history[-1][0] != run.step):
            _evaluate_and_record(run, last_eval)
        ckpt = _checkpoint(run)
        result = _result(run, time.perf_counter() - t_start, ckpt, stopped)
        summary = {**result.as_dict(), **_final_scores(last_eval)}
        write_atomic_text(run.run_dir / "summary.json", json.dumps(summary, indent=2))
        return result  # (the learning curve: harness.builtin's harness_run_end)
    except ConfigError:
        # bad input found only once the envs stepped (an env option its env checks at its
        # first step): the run has nothing to keep
        bad_input = run.step == 0
        raise
    except (DiskSpaceError, EnvFault) as exc:
        # a checkpoint did not fit, or the env broke (an env plugin's fault, named): the run
        # stands at its last good checkpoint, with a summary
        summary = _summary_of_failure(run, time.perf_counter() - t_start, exc)
        raise
    finally:
        pm.hook.harness_run_end(run=run, summary=summary)
        run.router.close()
        run.envs.close()
        if resume is None and (not started or bad_input):
            discard_run_dir(run.run_dir)
        if run.lock is not None:
            run.lock.release()


@contextlib.contextmanager
def _stop_on_sigterm(run: Run) -> Iterator[None]:
    """While training (in the main thread: signal handlers live there), SIGTERM asks the run
    to stop after the iteration it is in, then checkpoint and end without the final
    evaluation: what a cluster's scheduler or ``timeout`` sends before it kills. The first
    SIGTERM puts the previous handler back, so a second one acts at once (by default, ends
    the process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, previous)
        run.terminated = run.stop_requested = True
        log.warning(
            "SIGTERM at step %d: stopping after this iteration with a checkpoint (a second "
            "SIGTERM ends the process at once)",
            run.step,
        )

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is stop:
            signal.signal(signal.SIGTERM, previous)


def make_collector(run: Run) -> Collector:
    """Where ``run``'s experience comes from: nothing for an offline agent, the envs of this
    process for a serial run (``run.acting``), else remote actors (a missing transport extra
    is named)."""
    if run.agent.offline:
        return OfflineCollector(run)
    if run.acting.where == SERIAL:
        return SerialCollector(run)
    try:
        return FarmCollector(run)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, f"the actor farm (run.actors = {run.config.run.actors})")
        if error is None:
            raise
        raise error from exc


def _loop(run: Run, collector: Collector, last_eval: dict[str, float]) -> bool:
    """Iterate until the step budget or the return threshold; True when stopped early. An
    iteration that evaluates carries every ``eval/`` metric (``last_eval``: the newest ones)."""
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
            metrics[LOGGED_WINDOW] = float(run.episodes)
            metrics.update(agent.backend.device_stats())
            run.router.record(run.step, metrics)
            if window_returns:
                run.history.append((run.step, metrics["charts/episodic_return"]))
            window_returns, window_lengths, window_metrics = [], [], {}
            t_window, steps_window = now, run.step
            next_log = run.step + cfg.log_every
        stop = False
        if run.step >= next_eval:
            result = _evaluate_and_record(run, last_eval)
            metrics.update(last_eval)
            next_eval = run.step + cfg.eval_every
            stop = cfg.stop_at_return is not None and result.mean >= cfg.stop_at_return
            if stop:
                stop = _confirmed(run, metrics)
        curriculum.iteration_end(run, metrics)  # (a curriculum its env family declares)
        run.pm.hook.harness_iteration_end(run=run, metrics=metrics)
        if stop:
            log.info("eval mean %.1f reached stop_at_return at step %d", run.best_eval, run.step)
            return True
        if run.stop_requested:
            why = "SIGTERM" if run.terminated else "a plugin asked"
            log.info("stopping at step %d: %s", run.step, why)
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


def _confirmed(run: Run, metrics: dict[str, float]) -> bool:
    """An evaluation reached ``run.stop_at_return``: whether a second one, on other episodes
    (other env seeds), does too. The first evaluation to pass is the luckiest of many (its
    mean is biased upwards), so one alone stopped runs at policies that scored well below the
    threshold on fresh episodes (DQN on CartPole: 467.9 after an evaluation of >= 475)."""
    cfg = run.config.run
    seed = Seeds(cfg.seed).seed("confirmation", run.step)
    again = evaluate(run.agent, run.config, run.registry, cfg.eval_episodes, seed=seed)
    metrics["eval/confirm_mean_return"] = again.mean
    run.router.record(run.step, {"eval/confirm_mean_return": again.mean})
    assert cfg.stop_at_return is not None
    if again.mean >= cfg.stop_at_return:
        return True
    log.info(
        "eval mean reached stop_at_return at step %d but a confirming evaluation gave %.1f; "
        "training goes on",
        run.step,
        again.mean,
    )
    return False


def _final_scores(last_eval: Mapping[str, float]) -> dict[str, Any]:
    """What ``summary.json`` adds from the last evaluation: the official score
    (``eval/score``, what a competitor reads first) where the env reports one, and every
    ``eval/`` metric of that evaluation (``final_eval_metrics``: ``harness tune`` reads it)."""
    scores: dict[str, Any] = {}
    if "eval/score" in last_eval:
        scores["eval/score"] = last_eval["eval/score"]
    if last_eval:
        scores["final_eval_metrics"] = dict(last_eval)
    return scores


def _evaluate_and_record(run: Run, last: dict[str, float] | None = None) -> EvalResult:
    cfg = run.config.run
    if cfg.eval_episodes <= 0:
        return run_state.EvalResult([], [])
    seed = Seeds(cfg.seed).seed("evaluation", run.step)
    result = evaluate(run.agent, run.config, run.registry, cfg.eval_episodes, seed=seed)
    run.eval_history.append((run.step, result.mean))
    if cfg.keep_best and result.mean > run.best_eval:
        _checkpoint(run, best=True)
    run.best_eval = max(run.best_eval, result.mean)
    row = {"eval/mean_return": result.mean, "eval/std_return": result.std}
    row.update({f"eval/{name}": mean for name, mean in result.metric_means().items()})
    run.router.record(run.step, row)
    if last is not None:
        last.clear()
        last.update(row)
    return result


class GreedyPolicy(Protocol):
    """What :func:`evaluate` needs of something that is not an :class:`~harness.api.Agent`
    (a fixed reference policy, a test's wrapper): greedy actions for a batch."""

    def predict(self, obs: np.ndarray) -> np.ndarray: ...


def evaluate(
    agent: Agent | Policy | GreedyPolicy,
    config: Config,
    registry: Registry,
    episodes: int,
    *,
    seed: int,
    recorder: EpisodeRecorder | None = None,
    max_envs: int = 8,
) -> EvalResult:
    """Greedy evaluation: exactly ``episodes`` complete episodes, spread over up to 8 envs so
    short episodes are not over-counted (each env runs its own quota). With ``recorder``
    (``harness eval --video``) the episodes run one after the other on one env made with
    ``render_mode="rgb_array"``, and the recorder gets its frames (:mod:`harness.video`);
    the recorder is not closed here. ``max_envs``: envs at most (1 runs the episodes in
    sequence like a filmed evaluation: tools/bench_video.py compares the two). The envs are
    built with the family's evaluation options (``EnvSpec.evaluation_options``). It acts
    through ``agent``'s :class:`~harness.policy.Policy` (``Agent.policy()``, or ``agent``
    itself), greedily, the rows of ended episodes reset (every row at the start); a
    :class:`GreedyPolicy` acts through its ``predict`` and keeps no per-env state to reset."""
    n = 1 if recorder is not None else max(1, min(max_envs, episodes))
    quota = np.full(n, episodes // n)
    quota[: episodes % n] += 1
    render_mode = "rgb_array" if recorder is not None else None
    envs = build.make_envs(config, registry, n, seed=None, render_mode=render_mode, evaluation=True)
    policy = as_policy(agent)
    label = f"{env_label(config.run.env, registry)} in an evaluation"  # (who a fault names)
    try:
        obs, _ = env_call(functools.partial(envs.reset, seed=seed), label, "reset", 0)
        stepped = 0  # the evaluation's env steps (a fault names the step)
        if recorder is not None:
            recorder.start(envs)
        ret = np.zeros(n)
        length = np.zeros(n, dtype=np.int64)
        result = run_state.EvalResult([], [])
        state = policy.reset(policy.initial_state(n), np.ones(n, bool), explore=False)
        while (quota > 0).any():
            actions, _, state = policy.act(obs, state, explore=False)
            step = functools.partial(envs.step, actions)
            obs, rewards, terminated, truncated, infos = env_call(step, label, "step", stepped)
            stepped += n
            done = terminated | truncated
            if done.any():
                state = policy.reset(state, done, explore=False)
            reward = team_reward(rewards)
            ret += reward
            length += 1
            ended: dict[int, dict[str, float]] = {}
            for i in np.flatnonzero(done):
                metrics = ended[int(i)] = stepper.episode_metrics(infos, int(i))
                if quota[i] > 0:
                    result.returns.append(float(ret[i]))
                    result.lengths.append(int(length[i]))
                    for name, value in metrics.items():
                        result.metrics.setdefault(name, []).append(value)
                    quota[i] -= 1
                ret[i], length[i] = 0.0, 0
            if recorder is not None:
                recorder.after_step(envs, float(reward[0]), bool(done[0]), infos, ended.get(0, {}))
        return result
    finally:
        envs.close()


# ------------------------------------------------------------------------------------------
# Checkpoints


def _checkpoint(run: Run, best: bool = False) -> Path:
    """A checkpoint of the run now: in ``checkpoints/`` (the newest few, what ``--resume``
    takes), or with ``best`` the one checkpoint in ``best/checkpoints/`` (``run.keep_best``)."""
    weights = run.agent.weights()
    bad = [k for k, v in weights.items() if v.dtype.kind == "f" and not np.all(np.isfinite(v))]
    if bad:  # never write a checkpoint to go back to that cannot be used
        raise _diverged(run, f"non-finite policy weights ({', '.join(bad[:3])})")
    state = run_state.runner_state(run)

    def write(tmp: Path) -> None:
        run.agent.save(tmp)
        (tmp / run_state.RUNNER_STATE).write_text(json.dumps(state), encoding="utf-8")

    meta = {
        "algo": run.config.run.algo,
        "backend": run.config.run.backend,
        "env": run.config.run.env,
        "harness": __version__,
        "config": run.config.to_dict(),
    }
    if best:
        return _save(run, run.run_dir / "best" / "checkpoints", meta, write, keep=1)
    path = _save(run, run.run_dir / "checkpoints", meta, write)
    run.pm.hook.harness_checkpoint(run=run, path=path)
    return path


def _save(
    run: Run, root: Path, meta: dict[str, Any], write: Callable[[Path], None], keep: int = 3
) -> Path:
    """``save_checkpoint`` into ``root``, with a full disk (ENOSPC, or a framework's write
    error while less than a checkpoint's size is free) refused as a :class:`DiskSpaceError`
    naming the path and the space needed; the partial checkpoint is gone, the last good one
    and ``latest`` stay."""
    try:
        return save_checkpoint(root, run.step, meta, write, keep=keep)
    except Exception as exc:
        needed = estimate_checkpoint_bytes(run.agent)
        if not is_out_of_space(exc, root, needed):
            raise
        try:
            kept: Path | None = latest_checkpoint(root.parent)
        except CheckpointError:
            kept = None
        raise out_of_space_error(run.run_dir, root, needed, run.step, kept) from exc


def _result(run: Run, wall_time: float, checkpoint: Path | None, stopped: bool) -> RunResult:
    """What ``train`` returns (and ``summary.json`` starts from) for ``run`` as it stands."""
    return run_state.RunResult(
        run_dir=run.run_dir,
        steps=run.step,
        episodes=run.episodes,
        wall_time=wall_time,
        final_eval=run.eval_history[-1][1] if run.eval_history else float("nan"),
        best_eval=run.best_eval,
        recent_return=run.recent_return,
        checkpoint=checkpoint,
        stopped_early=stopped,
        terminated=run.terminated,
    )


def _summary_of_failure(run: Run, wall_time: float, error: Exception) -> dict[str, Any]:
    """``summary.json`` of a run that ended on an error after training (a full disk): what
    it did, its last good checkpoint and the error; written if the disk still takes it."""
    try:
        kept: Path | None = latest_checkpoint(run.run_dir)
    except CheckpointError:
        kept = None
    summary = {**_result(run, wall_time, kept, True).as_dict(), "error": str(error)}
    path = run.run_dir / "summary.json"
    try:
        write_atomic_text(path, json.dumps(summary, indent=2))
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)
        for stray in run.run_dir.glob(".summary.json.tmp-*"):
            stray.unlink(missing_ok=True)
    return summary
