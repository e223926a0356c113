"""A per-env adaptive goal range: ``[env] adaptive`` (IARAI-JKU's curriculum for the 2022 Die
Reorient, first ex-aequo in phase 2).

Each env keeps its own half-width of one goal range (Die Reorient's ``goal_rot``: the goal's
Euler angles are drawn from ``(-h, h)`` about each axis) and widens it by ``growth`` when the
mean of an episode metric over its last ``window`` episodes reaches ``threshold``; the
threshold then decays by ``threshold_decay`` (not below ``threshold_min``), so later, harder
widenings ask less. It never narrows, and never widens past the env's own range (its
registration's, or ``[env] kwargs``'s): a P1 run ends, at most, training on P1's goals. Every
env sits at the edge of what it solves, where a global curriculum (``[env] curriculum``) moves
all envs at once on the mean. The half-width an episode ran at is its episode metric
``adaptive_range`` (logged as ``charts/adaptive_range``, the envs' mean).

IARAI-JKU's rule (their ``ReorientEnv2V10``, PGPE): goal_rot's half-width x1.1 when the mean
solved fraction of an env's last 20 episodes reaches 0.85, the threshold x0.99 at each widening,
not below 0.3; those are the defaults here. Differences: their window was not emptied after a
widening (theirs says so, as a known slip); here the next widening waits for ``window`` episodes
at the new range.

A training aid only: greedy evaluations (``eval/`` metrics, ``harness eval``) build their envs
without it (``EnvSpec.evaluation_options``), on the env's full range.

The half-widths live in the envs (farm actors among them), not in the checkpoint. Each logged
window records :func:`resume_point` (``Run.remember_env``): the rule with ``start`` at the
envs' mean half-width and ``threshold`` decayed by the widenings that took it there, which a
resumed run gives every env. So a resumed run goes on from the mean range, every env at it
(the spread between envs is not kept), instead of climbing back from ``start`` (``window``
episodes per widening: ~0.8 million steps from +-6 to +-27 degrees with 16 envs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from harness.errors import ConfigError, did_you_mean

SAMPLED_AT_RESET = {"ReorientEnv": ("goal_rot", "goal_pos")}
"""The ranges harness knows an env class draws from at every reset (its constructor keeps them
as attributes of the same name, ``(low, high)``): only these can adapt. (MyoSuite's other tasks
keep their ranges in other forms, or draw them once.)"""

METRICS = ("solved_fraction", "success", "solved_final", "score")
"""Episode metrics a range can adapt on (each in [0, 1], higher is better)."""


@dataclass(frozen=True)
class AdaptiveRange:
    """The rule, from ``[env] adaptive = {key = "goal_rot", start = 0.26, ...}``."""

    key: str
    """The constructor range that adapts (Die Reorient: ``goal_rot`` or ``goal_pos``)."""
    start: float
    """The half-width each env starts from, in the range's units (radians for goal_rot)."""
    growth: float = 1.1
    """A widening multiplies the half-width by this (> 1)."""
    window: int = 20
    """Episodes of one env the metric is averaged over; emptied after a widening."""
    metric: str = "solved_fraction"
    """The episode metric (:data:`METRICS`)."""
    threshold: float = 0.85
    """Widen when the window's mean reaches this."""
    threshold_decay: float = 0.99
    """The threshold is multiplied by this at each widening ..."""
    threshold_min: float = 0.3
    """... and kept at or above this."""

    @classmethod
    def parse(cls, table: Any) -> AdaptiveRange:
        """The rule of an ``[env] adaptive`` table; ValueError naming what is wrong."""
        if not isinstance(table, Mapping):
            raise ValueError(
                f'adaptive = {table!r}: expected a table such as {{key = "goal_rot", start = 0.26}}'
            )
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(table) - set(names))
        if unknown:
            raise ValueError(
                f"adaptive has no option {unknown[0]!r}.{did_you_mean(unknown[0], names)} "
                f"Its options: {', '.join(names)}."
            )
        missing = [n for n in ("key", "start") if n not in table]
        if missing:
            raise ValueError(
                f"adaptive needs {' and '.join(missing)}: e.g. "
                f'adaptive = {{key = "goal_rot", start = 0.26}}'
            )
        rule = cls(**table)
        checks = [
            ("key", isinstance(rule.key, str), "the name of a goal range, e.g. 'goal_rot'"),
            ("start", _number(rule.start) and rule.start > 0, "a half-width > 0"),
            ("growth", _number(rule.growth) and rule.growth > 1, "a factor > 1"),
            ("window", isinstance(rule.window, int) and rule.window >= 1, "an integer >= 1"),
            ("metric", rule.metric in METRICS, f"one of {', '.join(METRICS)}"),
            ("threshold", _number(rule.threshold) and 0 < rule.threshold <= 1, "in (0, 1]"),
            (
                "threshold_decay",
                _number(rule.threshold_decay) and 0 < rule.threshold_decay <= 1,
                "in (0, 1]",
            ),
            (
                "threshold_min",
                _number(rule.threshold_min) and 0 <= rule.threshold_min <= 1,
                "in [0, 1]",
            ),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"adaptive.{name} = {getattr(rule, name)!r}: expected {expected}")
        return rule


def resume_point(table: Mapping[str, Any], mean_half_width: float) -> dict[str, Any]:
    """The ``[env] adaptive`` table a resumed run gives its envs when the envs' mean
    half-width was ``mean_half_width`` under rule ``table``: ``start`` there (never below the
    rule's) and ``threshold`` decayed as by the widenings from ``start`` to there."""
    rule = AdaptiveRange.parse(table)
    start = max(float(mean_half_width), float(rule.start))
    widenings = round(math.log(start / rule.start) / math.log(rule.growth))
    threshold = rule.threshold
    if widenings > 0:
        decayed = rule.threshold * rule.threshold_decay**widenings
        threshold = max(decayed, rule.threshold_min)
    return {**asdict(rule), "start": start, "threshold": threshold}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class RangeLevel:
    """One env's adaptive range: its half-width, threshold and window of recent metrics."""

    def __init__(self, rule: AdaptiveRange, env: Any) -> None:
        self.rule = rule
        self.threshold = float(rule.threshold)
        self._recent: list[float] = []
        self.attach(env)
        self.half_width = min(float(rule.start), self.full_half_width)

    def attach(self, env: Any) -> None:
        """Read the env's own range (its cap); again after the env is rebuilt (a curriculum
        stage with new kwargs), keeping the half-width within the new cap."""
        base = env.unwrapped
        kind = type(base).__name__
        env_id = env.spec.id if env.spec is not None else kind
        known = SAMPLED_AT_RESET.get(kind, ())
        if self.rule.key not in known:
            where = (
                f"its goal ranges that can: {', '.join(known)}"
                if known
                else "none of its ranges can (harness knows the ranges of "
                + ", ".join(f"{k}: {', '.join(v)}" for k, v in SAMPLED_AT_RESET.items())
                + ")"
            )
            fix = (
                "Remove [env] adaptive or name one of those." if known else "Remove [env] adaptive."
            )
            raise ConfigError(
                f"[env] adaptive.key = {self.rule.key!r} cannot adapt on {env_id} ({kind}): "
                f"{where}.{did_you_mean(self.rule.key, known)} {fix}"
            )
        low, high = (float(v) for v in getattr(base, self.rule.key))
        self.centre = (low + high) / 2
        self.full_half_width = (high - low) / 2
        if self.full_half_width <= 0:
            raise ConfigError(
                f"[env] adaptive.key = {self.rule.key!r}: {env_id}'s {self.rule.key} is the "
                f"single value {low}, so there is no range to widen; give it one in [env] "
                f"kwargs (e.g. {self.rule.key} = [-1.57, 1.57])."
            )
        self._env = base
        if hasattr(self, "half_width"):
            self.half_width = min(self.half_width, self.full_half_width)

    def resume(self, rule: AdaptiveRange) -> None:
        """Go on under ``rule`` (a resumed run's :func:`resume_point`): its start as the
        half-width and its threshold where that start is wider than this env's range; it
        never narrows."""
        self.rule = rule
        start = min(float(rule.start), self.full_half_width)
        if start > self.half_width:
            self.half_width = start
            self.threshold = float(rule.threshold)
            self._recent.clear()

    def before_reset(self) -> None:
        """Set the env's range to the current half-width (the env draws from it at reset)."""
        h = self.half_width
        setattr(self._env, self.rule.key, (self.centre - h, self.centre + h))

    def episode_end(self, metrics: Mapping[str, float]) -> None:
        """Count an ended episode's metric; widen when the window's mean reaches the
        threshold."""
        value = metrics.get(self.rule.metric)
        if value is None:
            raise ConfigError(
                f"[env] adaptive.metric = {self.rule.metric!r}: this env's episodes report "
                f"no such metric (they report {', '.join(sorted(metrics))}); choose one of "
                f"those among {', '.join(METRICS)}."
            )
        self._recent.append(float(value))
        if len(self._recent) < self.rule.window:
            return
        mean = sum(self._recent) / len(self._recent)
        self._recent.pop(0)
        if mean >= self.threshold and self.half_width < self.full_half_width:
            self.half_width = min(self.half_width * self.rule.growth, self.full_half_width)
            decayed = self.threshold * self.rule.threshold_decay
            self.threshold = max(decayed, self.rule.threshold_min)
            self._recent.clear()
