"""The episode metrics of a MyoSuite env: :class:`MyoEpisodeWrapper`.

MyoSuite reports, at every step, its reward terms and a ``solved`` flag in the step's info,
beside the whole observation and reward dicts (``obs_dict``, ``rwd_dict``). harness needs none of
that per step, only a summary of each episode: on the step that ends an episode the wrapper's
info is ``{"episode_metrics": {...}}`` (what the runner logs as ``charts/NAME`` and
``eval/NAME``), and on every other step it is empty. Dropping the per-step info is also what
keeps the vector env as fast as a raw MyoSuite loop: merging MyoSuite's nested info dicts into
the batch's infos costs every step (measured, one env, random actions: raw loop 1080 steps/s,
this wrapper in harness's vector env 1112, the vector env keeping MyoSuite's infos 940 on Die
Reorient; 834 / 812 / 772 on OslRunFixed).

The metrics, where the env reports ``solved`` (every MyoChallenge task does):

* ``solved_fraction``: the fraction of the episode's steps on which it was solved;
* ``solved_final``: 1 if it was solved on the last step;
* ``success``: 1 if it was solved on more than ``success_steps`` steps (MyoSuite's own
  ``evaluate_success`` rule, 5 steps by default);

and for every env ``terminated`` (1 if the env ended the episode: a die dropped, a fall; 0 at
the time limit), plus the episode mean of each info entry named in ``metric_keys``, and with
``[env] adaptive`` the half-width of the goal range the episode ran at, ``adaptive_range``
(:mod:`harness_myo.adaptive`, which the wrapper tells each episode's metrics).

**The official score.** Every MyoChallenge env defines how the challenge ranked submissions: its
``get_metrics(paths)`` (a success rate and effort for Die Reorient and Relocate, the fraction of
the track covered, time, effort and pain for OslRun, ...), over rollout paths whose
``env_infos`` stack the per-step ``rwd_dict`` and ``obs_dict``. The wrapper keeps that path for
the episode (the reward terms, and only the :data:`PATH_OBS_KEYS` of the observation dict) and,
when it ends, reports MyoSuite's own ``get_metrics([path])`` as episode metrics: ``score`` (the
runner logs it as ``charts/score`` beside the shaped return, and ``eval/score``), ``effort``,
``time``, ... Every challenge's metrics are means over paths of per-path values, so the mean of
the per-episode metrics is the metric of all the episodes together, with one exception: OslRun
clips its mean track fraction to [0, 1], and a path's own fraction can be negative (the model
starts 1 m behind the start line and may fall back). Its episodes also report the unclipped
``track_fraction``, and the OslRun protocol's score is ``clip(mean(track_fraction), 0, 1)``
(:mod:`harness_myo.challenges`), MyoSuite's number exactly; ``charts/score`` there is the mean of
per-episode clipped fractions (the same unless some episodes end behind the start line). Keeping
the path costs ~2 us per step against MyoSuite's ~1 ms.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError, did_you_mean
from harness_myo.adaptive import AdaptiveRange, RangeLevel

EPISODE_METRICS = "episode_metrics"
"""The info key harness's runner reads an episode's metrics from (on the ending step)."""

_PLAIN = (bool, int, float)

PATH_OBS_KEYS = ("time", "model_root_pos", "task")
"""The observation-dict entries some challenge's ``get_metrics`` reads (OslRun: time and the
pelvis position; ChaseTag: the task; Bimanual/Soccer: time); the rest of ``obs_dict`` is not
kept."""


def metric_name(key: str) -> str:
    """A MyoSuite metric's name as an episode metric (Bimanual's "peak force" -> peak_force)."""
    return key.replace(" ", "_")


def official_metrics(env: Any, steps: list[dict[str, Any]]) -> dict[str, float]:
    """``env.get_metrics`` (MyoSuite's own scoring) of one episode whose per-step records are
    ``steps`` (each ``{"rwd_dict": ..., "obs_dict": ...}``), as floats."""
    path = {
        "env_infos": {
            part: {key: np.asarray([s[part][key] for s in steps]) for key in steps[0][part]}
            for part in ("rwd_dict", "obs_dict")
        }
    }
    found = env.get_metrics([path])
    metrics = {metric_name(k): float(v) for k, v in found.items() if np.ndim(v) == 0}
    start, end = getattr(env, "start_pos", None), getattr(env, "end_pos", None)
    if start is not None and end is not None and "model_root_pos" in steps[0]["obs_dict"]:
        # OslRun's score before its clip (RunTrackEnv.get_metrics: the lowest y reached, as a
        # fraction of the track from start_pos to end_pos)
        lowest = float(np.min(path["env_infos"]["obs_dict"]["model_root_pos"][..., 1]))
        sign = 1.0 if start > end else -1.0
        metrics["track_fraction"] = sign * (start - lowest) / abs(start - end)
    return metrics


def track_direction(env: Any) -> float:
    """+1 when a track env's finish lies towards smaller y than its start (OslRun: start_pos
    15, end_pos -15), -1 the other way; refuses an env without a track (``forward_weight``)."""
    unwrapped = env.unwrapped
    start, end = getattr(unwrapped, "start_pos", None), getattr(unwrapped, "end_pos", None)
    if start is None or end is None:
        env_id = env.spec.id if env.spec is not None else type(unwrapped).__name__
        raise ConfigError(
            f"[env] forward_weight rewards progress down a track, and {env_id} has none (no "
            f"start_pos / end_pos: it is not a MyoChallenge running env such as "
            f"myoChallengeOslRunFixed-v0); remove forward_weight."
        )
    return 1.0 if float(start) > float(end) else -1.0


def scalar(value: Any) -> float:
    """A MyoSuite info entry as a float: Python and NumPy scalars, and the (1, 1) arrays some
    tasks report (Bimanual's ``solved``), by their mean."""
    if type(value) in _PLAIN:
        return float(value)
    return float(np.mean(value))


_PART = re.compile(r"^(\w+)\[(\d+)(?::(\d+))?\]$")


@functools.lru_cache(maxsize=256)
def split_term(key: str) -> tuple[str, int | slice | None]:
    """A shaping term's name as (observation-dict entry, part): ``obj_pos[2]`` -> ("obj_pos",
    2), ``pos_err[0:2]`` -> ("pos_err", slice(0, 2)), a plain name -> (name, None)."""
    found = _PART.match(key)
    if found is None:
        return key, None
    start = int(found.group(2))
    if found.group(3) is None:
        return found.group(1), start
    return found.group(1), slice(start, int(found.group(3)))


def _fits(vector: Any, part: int | slice | None) -> bool:
    """Whether ``part`` (:func:`split_term`) picks at least one component of ``vector``."""
    size = int(np.size(vector))
    if isinstance(part, slice):
        return int(part.start) < min(int(part.stop), size)
    return part is None or part < size


def shaping_term(info: dict[str, Any], key: str) -> float:
    """The value of a shaping term (``[env] progress``, ``closeness``) at this step: MyoSuite's
    reward term ``key`` (its ``rwd_dict``); else, for ``NAME``, minus the length of the
    observation-dict vector NAME, an error vector such as Relocate's ``reach_err`` (palm minus
    object), so that it reads as a negative distance like MyoSuite's own distance terms; for
    ``NAME[i:j]``, minus the length of its components i to j-1 (``pos_err[0:2]``: the
    horizontal distance); for ``NAME[i]``, component i as it is (``obj_pos[2]``: a height)."""
    terms = info["rwd_dict"]
    if key in terms:
        return scalar(terms[key])
    name, part = split_term(key)
    vector = np.ravel(info["obs_dict"][name])
    if isinstance(part, int):
        return float(vector[part])
    return -float(np.linalg.norm(vector if part is None else vector[part]))


class MyoEpisodeWrapper(gym.Wrapper[Any, Any, Any, Any], gym.utils.RecordConstructorArgs):
    """Per-step info of a MyoSuite env in, episode metrics out (see the module docstring).
    It records its arguments so that ``env.spec`` can rebuild it (gymnasium's ``check_env``
    does)."""

    def __init__(
        self,
        env: Any,
        *,
        success_steps: int = 5,
        metric_keys: tuple[str, ...] = (),
        alive_bonus: float = 0.0,
        forward_weight: float = 0.0,
        progress: dict[str, float] | None = None,
        closeness: dict[str, tuple[float, float]] | None = None,
        stage: int | None = None,
        adaptive: AdaptiveRange | None = None,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self,
            success_steps=success_steps,
            metric_keys=metric_keys,
            alive_bonus=alive_bonus,
            forward_weight=forward_weight,
            progress=progress,
            closeness=closeness,
            stage=stage,
            adaptive=adaptive,
        )
        gym.Wrapper.__init__(self, env)
        self.success_steps = success_steps
        self.metric_keys = metric_keys
        self.alive_bonus = alive_bonus
        self.forward_weight = forward_weight
        self._direction = track_direction(env) if forward_weight else 0.0
        self.progress = dict(progress or {})
        self.closeness = dict(closeness or {})  # term: (weight, scale)
        self.stage = stage
        self.level = RangeLevel(adaptive, env) if adaptive is not None else None
        self._pending: dict[str, Any] = {}
        self._checked = False
        self._scores = callable(getattr(env.unwrapped, "get_metrics", None))
        self._reseed: int | None = None
        self._reset_counts()

    def _reset_counts(self) -> None:
        self._steps = 0
        self._solved_steps = 0
        self._solved = False
        self._has_solved = False
        self._sums = dict.fromkeys(self.metric_keys, 0.0)
        self._path: list[dict[str, Any]] = []
        self._last_root: tuple[float, float] | None = None  # (time, y) of the previous step
        self._last_potential: float | None = None  # the progress potential after the last step

    # -- run-time changes (a curriculum; see harness.curriculum) ------------------------------
    def configure(self, **changes: Any) -> None:
        """New [env] options, taking effect at the next reset: ``kwargs`` (the env is rebuilt
        with them), ``curriculum_stage`` and ``adaptive`` (a resumed run's adaptive range,
        :func:`harness_myo.adaptive.resume_point`; an env without one, such as an evaluation
        env, ignores it); other options cannot change during a run."""
        fixed = sorted(set(changes) - {"kwargs", "curriculum_stage", "adaptive"})
        if fixed:
            raise ConfigError(
                f"[env] {', '.join(fixed)} cannot change during a run (a curriculum stage may set "
                f"kwargs only)."
            )
        self._pending.update(changes)

    def _apply_pending(self) -> None:
        changes, self._pending = self._pending, {}
        if "curriculum_stage" in changes:
            self.stage = int(changes["curriculum_stage"])
        if changes.get("adaptive") and self.level is not None:
            self.level.resume(AdaptiveRange.parse(changes["adaptive"]))
        if "kwargs" in changes:
            old = self.env
            spec = old.spec
            assert spec is not None, "a MyoSuite env made by gymnasium.make has a spec"
            make_kwargs = {**spec.kwargs, **changes["kwargs"]}
            # the new env's random stream continues the old one's (a seeded run stays seeded)
            self._reseed = int(old.unwrapped.np_random.integers(2**31))
            self.env = gym.make(replace(spec, kwargs=make_kwargs), disable_env_checker=True)
            old.close()
            if self.level is not None:
                self.level.attach(self.env)

    def reset(self, **kwargs: Any) -> Any:
        if self._pending:
            self._apply_pending()
        if self._reseed is not None and kwargs.get("seed") is None:
            kwargs["seed"], self._reseed = self._reseed, None
        self._reset_counts()
        if self.level is not None:
            self.level.before_reset()
        obs, _ = self.env.reset(**kwargs)
        return obs, {}

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.alive_bonus:
            reward = float(reward) + self.alive_bonus
        if self.forward_weight:
            reward = float(reward) + self.forward_weight * self._speed(info)
        if not self._checked:
            self._check_keys(info)
        if self.progress:
            reward = float(reward) + self._progress(info)
        if self.closeness:
            reward = float(reward) + self._closeness(info)
        self._steps += 1
        solved = info.get("solved")
        if solved is not None:
            self._has_solved = True
            self._solved = scalar(solved) != 0.0
            self._solved_steps += self._solved
        for key in self.metric_keys:
            self._sums[key] += scalar(info[key])
        if self._scores:
            seen = info.get("obs_dict", {})
            self._path.append(
                {
                    "rwd_dict": info.get("rwd_dict", {}),
                    "obs_dict": {k: np.array(seen[k]) for k in PATH_OBS_KEYS if k in seen},
                }
            )
        if not (terminated or truncated):
            return obs, reward, terminated, truncated, {}
        return obs, reward, terminated, truncated, {EPISODE_METRICS: self._metrics(terminated)}

    def _speed(self, info: dict[str, Any]) -> float:
        """The pelvis's speed down the track over this step, m/s (0 on an episode's first
        step, whose start position the env does not report)."""
        seen = info["obs_dict"]
        now = (float(np.ravel(seen["time"])[0]), float(np.ravel(seen["model_root_pos"])[1]))
        last, self._last_root = self._last_root, now
        if last is None or now[0] <= last[0]:
            return 0.0
        return self._direction * (last[1] - now[1]) / (now[0] - last[0])

    def _progress(self, info: dict[str, Any]) -> float:
        """The change of the potential sum(weight x term) over this step, the terms being
        those named in ``progress`` (:func:`shaping_term`; 0 on an episode's first step, whose
        potential before it the env does not report)."""
        now = sum(weight * shaping_term(info, key) for key, weight in self.progress.items())
        last, self._last_potential = self._last_potential, now
        return 0.0 if last is None else now - last

    def _closeness(self, info: dict[str, Any]) -> float:
        """sum(weight x a / (d^2 + a)) over the terms named in ``closeness``
        (:func:`shaping_term`), d being a term's absolute value (MyoSuite's distance terms are
        negative distances)."""
        total = 0.0
        for key, (weight, scale) in self.closeness.items():
            d = shaping_term(info, key)
            total += weight * scale / (d * d + scale)
        return total

    def _metrics(self, terminated: bool) -> dict[str, float]:
        n = self._steps
        metrics = {"terminated": float(terminated)}
        if self._has_solved:
            metrics["solved_fraction"] = self._solved_steps / n
            metrics["solved_final"] = float(self._solved)
            metrics["success"] = float(self._solved_steps > self.success_steps)
        metrics.update({key: total / n for key, total in self._sums.items()})
        if self._scores and self._path:
            metrics.update(official_metrics(self.env.unwrapped, self._path))
        if self.stage is not None:
            metrics["stage"] = float(self.stage)
        if self.level is not None:
            ran_at = self.level.half_width
            self.level.episode_end(metrics)
            metrics["adaptive_range"] = ran_at
        return metrics

    def _check_keys(self, info: dict[str, Any]) -> None:
        """``metric_keys`` must name scalar entries of the env's info, and ``progress`` and
        ``closeness`` reward terms of its ``rwd_dict`` or vectors of its ``obs_dict`` (checked
        at the first step: MyoSuite's info keys are only known then)."""
        self._checked = True
        env_id = self.env.spec.id if self.env.spec is not None else type(self.env.unwrapped)
        scalars = sorted(k for k, v in info.items() if k not in ("obs_dict", "rwd_dict"))
        for key in self.metric_keys:
            try:
                scalar(info[key])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"[env] metric_keys names {key!r}, which is not a number in {env_id}'s step "
                    f"info; its entries: {', '.join(scalars)}."
                ) from None
        terms = info.get("rwd_dict", {})
        vectors = {k: v for k, v in info.get("obs_dict", {}).items() if np.ndim(v) == 1}
        named = [(key, "progress", "whose change should pay") for key in self.progress]
        named += [(key, "closeness", "whose closeness to 0 should pay") for key in self.closeness]
        for key, option, what in named:
            name, part = split_term(key)
            if key not in terms and name in vectors and _fits(vectors[name], part):
                continue  # a vector (or part of one) by its length, or one component of one
            try:
                scalar(terms[key])
            except (KeyError, TypeError, ValueError):
                found = [k for k in terms if k != "dense"]
                raise ConfigError(
                    f"[env] {option} names {key!r}, which is neither one of {env_id}'s reward "
                    f"terms (the rwd_dict of its step info) nor a vector of its observation dict "
                    f"(an error vector such as {_example_error(vectors)}, counted by its "
                    f"length) nor part of one (NAME[i] for a component, NAME[i:j] for the "
                    f"length of components i to j-1, within its length); name the terms {what}, "
                    f"such as its distances."
                    f"{did_you_mean(name, [*found, *vectors])}"
                ) from None


def _example_error(vectors: dict[str, Any]) -> str:
    """An observation-dict vector to name in an error message: an ``*_err`` one if any."""
    errors = sorted(k for k in vectors if k.endswith("_err"))
    return ", ".join(errors) if errors else "pos_err"
